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
