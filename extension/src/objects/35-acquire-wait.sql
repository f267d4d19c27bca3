/*
 * lease._acquire_wait: a blocking acquire (§4, wait > 0), called by
 * lease.acquire after validation.
 *
 * It makes attempts (lease.acquire with wait = 0) until one succeeds or the
 * deadline (start + wait) has passed, sleeping the poll interval (50 ms,
 * less if less remains) between attempts.  Every attempt is a new
 * statement and therefore reads a fresh READ COMMITTED snapshot: it sees a
 * release or a lapse that committed meanwhile.  A failed attempt leaves no
 * row lock behind (see lease.acquire), so waiting never delays the holder's
 * renew and release (§5).
 *
 * An attempt's only waits are heavyweight lock waits (a row lock, or an
 * uncommitted insert of the same key).  lock_timeout caps each at the time
 * left, at most one poll interval, so the call ends no later than wait +
 * one poll interval + one attempt, also under a foreign row lock (§4).  The
 * timeout error (55P03) rolls back the attempt's subtransaction and so
 * everything the attempt did; the attempt then counts as "not acquirable
 * yet, another transaction has the row locked".  lock_timeout appears in
 * the SET clause only to scope the set_config() calls below: a
 * function-level SET makes PostgreSQL restore the variable when the
 * function exits, so the caller's own lock_timeout is untouched.
 *
 * On timeout: SQLSTATE 57014.  statement_timeout raises the same SQLSTATE;
 * the message tells them apart.
 */
CREATE OR REPLACE FUNCTION lease._acquire_wait(
    p_key   text,
    p_owner text,
    p_ttl   interval,
    p_wait  interval)
    RETURNS TABLE (acquired boolean, epoch bigint, expires_at timestamptz)
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
    SET lock_timeout = '50ms'
    ROWS 1
AS $function$
DECLARE
    c_poll     CONSTANT interval := interval '50 milliseconds';
    v_deadline CONSTANT timestamptz := pg_catalog.clock_timestamp() + p_wait;
    v_now      timestamptz;
    v_locked   boolean;
BEGIN
    LOOP
        PERFORM pg_catalog.set_config(
            'lock_timeout',
            GREATEST(pg_catalog.ceil(1000 * pg_catalog.date_part(
                         'epoch', LEAST(c_poll, v_deadline - pg_catalog.clock_timestamp()))),
                     1)::text || 'ms',
            true);
        v_locked := false;
        BEGIN
            SELECT a.acquired, a.epoch, a.expires_at
              INTO acquired, epoch, expires_at
              FROM lease.acquire(p_key, p_owner, p_ttl, interval '0') AS a;
        EXCEPTION
            WHEN lock_not_available THEN
                acquired := false;
                v_locked := true;
        END;

        IF acquired THEN
            RETURN NEXT;
            RETURN;
        END IF;

        v_now := pg_catalog.clock_timestamp();
        EXIT WHEN v_now >= v_deadline;
        PERFORM pg_catalog.pg_sleep(
            pg_catalog.date_part('epoch', LEAST(c_poll, v_deadline - v_now)));
    END LOOP;

    -- The last attempt says why: the key was held by another owner, or its
    -- row was locked by a transaction that had not ended (in practice an
    -- acquire that has not committed yet).
    IF v_locked THEN
        RAISE EXCEPTION 'pg_lease: acquire timed out'
            USING ERRCODE = 'query_canceled',
                  DETAIL = pg_catalog.format('key "%s" was still locked by another transaction after waiting %s',
                                             pg_catalog.replace(p_key, '"', '""'), p_wait),
                  HINT = 'A transaction that is changing this key, typically an uncommitted acquire, has not ended.';
    END IF;
    RAISE EXCEPTION 'pg_lease: acquire timed out'
        USING ERRCODE = 'query_canceled',
              DETAIL = pg_catalog.format('key "%s" was still held after waiting %s',
                                         pg_catalog.replace(p_key, '"', '""'), p_wait),
              HINT = 'lease.inspect(key) shows the current holder and its expiry.';
END;
$function$;

REVOKE ALL ON FUNCTION lease._acquire_wait(text, text, interval, interval) FROM PUBLIC;

