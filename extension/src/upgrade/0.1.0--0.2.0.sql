/*
 * Update from 0.1.0.  The guard above has closed schema lease and refused
 * any foreign object in it (0.1.0 kept the ACL of a schema made beforehand,
 * so one may have been planted).  The table is kept as it is, rows and all;
 * the shared definitions that follow replace every function and add what
 * 0.2.0 adds.  A function that a later version drops, or whose signature
 * changes, is dropped here first.
 */

-- What 0.2.0 adds to the state, exactly as install.sql creates it.  Keys
-- already free count as released now: 0.1.0 did not record when, and purge
-- must not take them for older than they are.
ALTER TABLE lease.leases ADD COLUMN released_at timestamptz;
UPDATE lease.leases SET released_at = pg_catalog.clock_timestamp() WHERE owner IS NULL;

-- The single-column rules become domains (install.sql says why).  The
-- columns change to domains without constraints first, which PostgreSQL does
-- without rewriting the table or rebuilding its index; adding each domain's
-- constraint then checks the rows already there.
CREATE DOMAIN lease.key_text AS text COLLATE pg_catalog."C";
CREATE DOMAIN lease.owner_text AS text COLLATE pg_catalog."C";
CREATE DOMAIN lease.epoch_number AS bigint;
ALTER TABLE lease.leases
    ALTER COLUMN key TYPE lease.key_text COLLATE pg_catalog."C",
    ALTER COLUMN owner TYPE lease.owner_text COLLATE pg_catalog."C",
    ALTER COLUMN epoch TYPE lease.epoch_number,
    DROP CONSTRAINT leases_key_length,
    DROP CONSTRAINT leases_owner_length,
    DROP CONSTRAINT leases_epoch_positive;
ALTER DOMAIN lease.key_text
    ADD CONSTRAINT key_text_length CHECK (pg_catalog.octet_length(VALUE) BETWEEN 1 AND 1000);
ALTER DOMAIN lease.owner_text
    ADD CONSTRAINT owner_text_length CHECK (pg_catalog.octet_length(VALUE) BETWEEN 1 AND 1000);
ALTER DOMAIN lease.epoch_number
    ADD CONSTRAINT epoch_number_positive CHECK (VALUE >= 1);

CREATE TABLE lease.epoch_floor (
    singleton   boolean NOT NULL DEFAULT true,
    epoch       bigint NOT NULL DEFAULT 0,
    CONSTRAINT epoch_floor_pkey PRIMARY KEY (singleton),
    CONSTRAINT epoch_floor_one_row CHECK (singleton),
    CONSTRAINT epoch_floor_not_negative CHECK (epoch >= 0)
);
INSERT INTO lease.epoch_floor DEFAULT VALUES;

-- §10 Waiting: the mark of keys that waiters outside a transaction watch
-- (objects/37-watch.sql).  A new, NULL column: no rewrite of the table.
ALTER TABLE lease.leases ADD COLUMN watched_until timestamptz;
