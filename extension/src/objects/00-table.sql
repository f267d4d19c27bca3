/*
 * What every script ends with for the table (§1): nobody but the functions
 * reads or writes it.
 */
REVOKE ALL ON TABLE lease.leases FROM PUBLIC;

COMMENT ON TABLE lease.leases IS
    'pg_lease internal state: one row per key ever granted; use the lease.* functions, never this table';
