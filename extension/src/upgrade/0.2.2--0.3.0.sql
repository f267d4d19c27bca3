/*
 * Update from 0.2.2.  The state stays; every key keeps its grant and its
 * epoch, and stays exclusive.  0.3.0 adds counted keys (§13): the key's
 * row learns its limit (permit_limit, NULL for every key there is, so
 * adding it rewrites no row), and their permits get a table of their own,
 * exactly as install.sql creates both.  The definitions that follow
 * replace every function.  One signature changes: lease._acquire_wait
 * learns whether it waits for a shared grant (lease.acquire_shared), so the
 * old one is dropped first.
 */
ALTER TABLE lease.leases ADD COLUMN permit_limit integer;

CREATE TABLE lease.permits (
    key         lease.key_text COLLATE pg_catalog."C" NOT NULL,
    owner       lease.owner_text COLLATE pg_catalog."C" NOT NULL,
    epoch       lease.epoch_number NOT NULL,
    expires_at  timestamptz NOT NULL,
    CONSTRAINT permits_pkey PRIMARY KEY (key, owner)
) WITH (fillfactor = 70);

-- CASCADE, as the update from 0.2.0 drops its helpers (0.2.0--0.2.1.sql):
-- creating a view or a SQL-standard function body that calls a function
-- needs no EXECUTE on it, so any role could otherwise pin this private
-- helper and make the update fail (2BP01).  What depends on it could never
-- run for a role the extension did not let call it; it goes with it.
DROP FUNCTION IF EXISTS lease._acquire_wait(text, text, interval, interval) CASCADE;
