/*
 * Fresh install: the table (§1).  One row per key that was ever granted;
 * release and lapse keep the row, because epoch is the key's fencing
 * counter.
 *
 * Only the primary key is indexed.  acquire, renew and release change owner,
 * epoch and expires_at only, so with free space on the page every one of
 * them is a HOT update; fillfactor 70 keeps that space.  key is COLLATE "C"
 * so that the index never depends on the operating system's locale data (a
 * glibc collation change cannot corrupt it and make two rows for one key).
 *
 * The rules on single columns are domains, not table CHECK constraints.
 * They mirror lease._validate: keys and owners are 1..1000 bytes (§3), and
 * the API relies on that (a row that matches a key and an owner proves both
 * valid, see lease._is_plain_text); the first grant of a key carries epoch
 * 1 (§4).  PostgreSQL checks a domain only on the columns a statement
 * assigns, with an expression it prepares once per session, while it reads
 * every table CHECK constraint back from its stored text and checks it on
 * every row written: as CHECK constraints these three cost a third of the
 * instructions of a renew (bench/ANALYSIS.md).
 *
 * The one rule across columns (owner and expires_at are both set or both
 * NULL, §2) is not a CHECK constraint either: parsing its stored text again
 * for every statement cost 23k instructions of every write (0.2.0 had it).
 * It holds because the write core is the only writer (the table is private
 * to the functions) and every statement of the core sets the two together:
 * a grant sets both from a validated ttl, a renewal sets expires_at where an
 * owner matched, a release clears both.  The randomized history reads every
 * row for it.
 */
CREATE DOMAIN lease.key_text AS text COLLATE pg_catalog."C"
    CONSTRAINT key_text_length CHECK (pg_catalog.octet_length(VALUE) BETWEEN 1 AND 1000);
CREATE DOMAIN lease.owner_text AS text COLLATE pg_catalog."C"
    CONSTRAINT owner_text_length CHECK (pg_catalog.octet_length(VALUE) BETWEEN 1 AND 1000);
CREATE DOMAIN lease.epoch_number AS bigint
    CONSTRAINT epoch_number_positive CHECK (VALUE >= 1);

CREATE TABLE lease.leases (
    key         lease.key_text COLLATE pg_catalog."C" NOT NULL,
    owner       lease.owner_text COLLATE pg_catalog."C",
    epoch       lease.epoch_number NOT NULL,
    expires_at  timestamptz,
    -- Server time of the key's last release (0.2.0): how long a FREE key
    -- has been free, which lease.purge needs.  Written by release only, so
    -- it means something only while owner IS NULL.  Added last, as the
    -- update from 0.1.0 adds it, so both give the same table.
    released_at timestamptz,
    -- Waiters outside a transaction want a release notified until then
    -- (objects/37-watch.sql).
    watched_until timestamptz,
    -- A counted key's limit (0.3.0, §13): how many permits may hold it at
    -- once; NULL for an exclusive key; 0 for a key in its shared phase,
    -- whose permits are shared grants.  Set by lease.set_limit, and to 0 or
    -- NULL by the shared and exclusive grants (objects/45-permits.sql).
    -- Added last, as the update from 0.2.2 adds it.
    permit_limit integer,
    CONSTRAINT leases_pkey PRIMARY KEY (key)
) WITH (fillfactor = 70);

/*
 * The permits of counted keys (0.3.0, §13): one row per owner holding, or
 * having held, one of a counted key's permits.  A permit's epoch is taken
 * from its key's row in lease.leases (the key's one epoch counter), so it
 * is fresh key-wide.  A release deletes its row; a grant of the key deletes
 * the rows that are no longer live.
 */
CREATE TABLE lease.permits (
    key         lease.key_text COLLATE pg_catalog."C" NOT NULL,
    owner       lease.owner_text COLLATE pg_catalog."C" NOT NULL,
    epoch       lease.epoch_number NOT NULL,
    expires_at  timestamptz NOT NULL,
    CONSTRAINT permits_pkey PRIMARY KEY (key, owner)
) WITH (fillfactor = 70);

/*
 * The epoch floor (0.2.0, §4 purge): the highest epoch of any key that
 * lease.purge deleted, 0 before the first purge.  A key without a row is
 * granted epoch floor + 1, so a purged key's next grant still carries an
 * epoch greater than any it had (I2, I3).  One row; only purge writes it.
 */
CREATE TABLE lease.epoch_floor (
    singleton   boolean NOT NULL DEFAULT true,
    epoch       bigint NOT NULL DEFAULT 0,
    CONSTRAINT epoch_floor_pkey PRIMARY KEY (singleton),
    CONSTRAINT epoch_floor_one_row CHECK (singleton),
    CONSTRAINT epoch_floor_not_negative CHECK (epoch >= 0)
);
INSERT INTO lease.epoch_floor DEFAULT VALUES;
