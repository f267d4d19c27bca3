/*
 * Lapse is final, also after a lock wait (§10, I6).
 *
 * renew and release find their row with a guarded UPDATE whose WHERE uses
 * the clock read when the call began.  If another transaction holds the
 * row's lock, the UPDATE waits; when that transaction rolls back the row is
 * unchanged and PostgreSQL does not recheck the WHERE, so without this
 * trigger a grant that lapsed during the wait (and that inspect already
 * reported lapsed) would be renewed or released as if it were live.
 *
 * A BEFORE ROW trigger runs once PostgreSQL has locked the row it updates,
 * and its WHEN condition is evaluated then, against that row: so the clock
 * read in WHEN is taken with the row locked.  WHEN is true for an update of
 * a row whose grant has lapsed by then; lease._skip_lapsed then skips the
 * update of that row, without an error, when it keeps the holder (renew:
 * same epoch) or ends it (release: owner becomes NULL).  The caller then
 * reports lapsed (lease._refusal, with a fresh clock).  A takeover by
 * acquire (owner set, epoch incremented) goes through: it needs the row
 * lapsed, which stays true as time passes.
 *
 * Cost: PostgreSQL stores WHEN as a node tree in text and reads it back in
 * every statement, so it is kept to one comparison (measured with
 * npm run bench:instructions: 25k instructions per renew, against 68k for
 * the same test written out in WHEN).  A free row (expires_at NULL) and a
 * live one never call the function.
 *
 * What remains: a renew whose row was locked, and its clock read, before
 * expires_at, but whose commit lands after it.  Between that reading and
 * the commit the row stays locked, so no acquire can take the key over:
 * the takeover's UPDATE waits for the renew to commit and then rechecks
 * against the renewed expiry.  inspect, which reads without a lock, may
 * report the key lapsed in that interval; a holder must never rely on a
 * renewal that has not returned.
 */
CREATE OR REPLACE FUNCTION lease._skip_lapsed()
    RETURNS trigger
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    IF NEW.owner IS NULL OR NEW.epoch = OLD.epoch THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END;
$function$;

REVOKE ALL ON FUNCTION lease._skip_lapsed() FROM PUBLIC;

DROP TRIGGER IF EXISTS leases_lapse_is_final ON lease.leases;
CREATE TRIGGER leases_lapse_is_final
    BEFORE UPDATE ON lease.leases
    FOR EACH ROW
    WHEN (OLD.expires_at <= pg_catalog.clock_timestamp())
    EXECUTE FUNCTION lease._skip_lapsed();
ALTER TABLE lease.leases ENABLE ALWAYS TRIGGER leases_lapse_is_final;
