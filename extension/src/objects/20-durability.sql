/*
 * Durable commits (§10 "Durable commits", I2, I3, I10).
 *
 * A grant, renewal or release that the caller saw committed must survive a
 * crash, and a promotion of a synchronous standby: otherwise recovery could
 * hand the same epoch out twice and fencing would be void.  The caller's
 * synchronous_commit cannot be trusted for that, and a setting raised by
 * the call itself could be lowered again before COMMIT (SET LOCAL, a
 * function's SET clause, a pooler's session default).  So the decision is
 * taken at commit time: every insert and update of lease.leases queues this deferred
 * constraint trigger, which PostgreSQL fires while committing, before the
 * commit record is written, and which raises synchronous_commit for that
 * commit when the setting then in force would not wait for what is
 * configured:
 *
 *   off                        -> on  (no flush at all)
 *   local, remote_write        -> on  when synchronous_standby_names is set
 *                                     (local does not wait for the standby;
 *                                     remote_write does not wait for its
 *                                     flush)
 *   on, remote_apply           unchanged
 *
 * With no synchronous standby configured, 'on' flushes locally, like
 * 'local'.  set_config(..., true) lasts until the transaction ends.
 *
 * The one way around it: SET CONSTRAINTS ALL IMMEDIATE fires the trigger at
 * the end of the statement instead of at commit, after which the caller can
 * lower synchronous_commit again.  That takes two deliberate statements in
 * the caller's own transaction; the README states it and a test shows it.
 *
 * ENABLE ALWAYS keeps the trigger firing under session_replication_role =
 * replica (which only superusers may set).  Trigger functions need no
 * EXECUTE privilege of the role that fires them.
 */
CREATE OR REPLACE FUNCTION lease._durable_commit()
    RETURNS trigger
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    -- The common case ('on') costs this one test.
    IF pg_catalog.current_setting('synchronous_commit') IN ('off', 'local', 'remote_write') THEN
        IF pg_catalog.current_setting('synchronous_commit') = 'off'
           OR pg_catalog.current_setting('synchronous_standby_names') <> '' THEN
            PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
        END IF;
    END IF;
    RETURN NULL;
END;
$function$;

REVOKE ALL ON FUNCTION lease._durable_commit() FROM PUBLIC;

-- Not on DELETE: only lease.purge deletes, and a purge need not be durable
-- by itself.  Lost in a crash, it is lost whole (the rows and the floor come
-- back together); and any grant that relied on it commits after it in the
-- WAL, so that grant's durable commit flushes the purge too.  A trigger
-- event per deleted row made a purge of 1M keys in one call take 9.3 s
-- instead of 5.7 s (bench/ANALYSIS.md, section 5b).
DROP TRIGGER IF EXISTS leases_durable_commit ON lease.leases;
CREATE CONSTRAINT TRIGGER leases_durable_commit
    AFTER INSERT OR UPDATE ON lease.leases
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION lease._durable_commit();
ALTER TABLE lease.leases ENABLE ALWAYS TRIGGER leases_durable_commit;
