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
 */
CREATE TABLE lease.leases (
    key         text COLLATE pg_catalog."C" NOT NULL,
    owner       text COLLATE pg_catalog."C",
    epoch       bigint NOT NULL,
    expires_at  timestamptz,
    CONSTRAINT leases_pkey PRIMARY KEY (key),
    -- Mirror lease._validate: keys and owners are 1..1000 bytes (§3).  The
    -- API relies on them: a row that matches a key and an owner proves both
    -- valid (see lease._is_plain_text).
    CONSTRAINT leases_key_length
        CHECK (pg_catalog.octet_length(key) BETWEEN 1 AND 1000),
    CONSTRAINT leases_owner_length
        CHECK (owner IS NULL OR pg_catalog.octet_length(owner) BETWEEN 1 AND 1000),
    -- A row is either held/lapsed (both set) or free (both NULL) (§2).
    CONSTRAINT leases_holder_complete
        CHECK ((owner IS NULL) = (expires_at IS NULL)),
    -- The first grant of a key carries epoch 1 (§4).
    CONSTRAINT leases_epoch_positive
        CHECK (epoch >= 1)
) WITH (fillfactor = 70);
