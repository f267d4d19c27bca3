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
 * read in WHEN is taken with the row locked.  It applies to updates that
 * keep the holder (renew: same epoch) or end it (release: owner becomes
 * NULL) of a row that was held; a takeover by acquire (owner set, epoch
 * incremented) is not concerned: it needs the row lapsed, which stays true
 * as time passes.  When the grant has lapsed by then, the function returns
 * NULL, which skips the update of that row without an error; the caller
 * then reports lapsed (lease._refusal, with a fresh clock).  The WHEN is
 * evaluated in the executor, so the common case calls no function.
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
    RETURN NULL;
END;
$function$;

REVOKE ALL ON FUNCTION lease._skip_lapsed() FROM PUBLIC;

DROP TRIGGER IF EXISTS leases_lapse_is_final ON lease.leases;
CREATE TRIGGER leases_lapse_is_final
    BEFORE UPDATE ON lease.leases
    FOR EACH ROW
    WHEN (OLD.owner IS NOT NULL
          AND (NEW.owner IS NULL OR NEW.epoch = OLD.epoch)
          AND OLD.expires_at <= pg_catalog.clock_timestamp())
    EXECUTE FUNCTION lease._skip_lapsed();
ALTER TABLE lease.leases ENABLE ALWAYS TRIGGER leases_lapse_is_final;
