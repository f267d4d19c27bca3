/*
 * lease._acquire_wait: a blocking acquire (§4, wait > 0), called by
 * lease.acquire after validation.
 *
 * It makes attempts (lease.acquire with wait = 0) until one succeeds or the
 * deadline (start + wait) has passed.  Every attempt is a new statement and
 * therefore reads a fresh READ COMMITTED snapshot: it sees a release or a
 * lapse that committed meanwhile.  A failed attempt leaves no row lock
 * behind (see lease.acquire), so waiting never delays the holder's renew
 * and release (§5).
 *
 * Sleeps (§4, §10 Waiting).  After a denied attempt it sleeps until the
 * first of: the next poll (50 ms), the holder's expiry, the deadline.  A
 * lapse is therefore taken over at the expiry itself (server time), not up
 * to a poll interval later.  A release by another session cannot wake a
 * sleeping backend without C (a notification reaches a session only between
 * transactions), so releases are seen at the next poll; clients that want
 * to be woken by a release wait outside any transaction instead (see
 * lease.watch).
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
 * A client that has gone (§10 Waiting) must not be granted anything.  The
 * backend learns that its client has gone only when it reads from or
 * writes to the socket, or when client_connection_check_interval makes it
 * look.  That setting takes effect only when a statement starts: set in a
 * function's SET clause or by set_config() inside the statement it never
 * arms (checked on 14 to 18).  So:
 *   - While it sleeps: with client_connection_check_interval > 0 in the
 *     caller's session, PostgreSQL checks the connection at that interval
 *     and ends a backend whose client has gone (FATAL, the transaction
 *     rolls back).  Otherwise the wait probes by writing to the client, a
 *     NOTICE after every second of waiting.
 *   - Between a grant made after sleeping and its commit, in both cases,
 *     two NOTICEs 2 ms apart: the session's check may be a long interval
 *     away, and the grant must not go to a client that died meanwhile.
 * A write to a socket whose peer has gone fails at once for a Unix socket;
 * over TCP the first write after the peer closed still succeeds and draws a
 * reset, so the second one fails.  PostgreSQL then ends the backend at the
 * next interrupt check (pg_sleep checks first), before the grant commits.
 * client_min_messages is raised to notice for the probes to be sent.
 * Left open either way, and nothing can close it: a client that goes after
 * the last check and before the commit is granted the key, which lapses at
 * its expiry like any dead holder's (FAILURE-MODEL.md).
 *
 * On timeout: SQLSTATE 57014.  statement_timeout raises the same SQLSTATE;
 * the message tells them apart.
 */
CREATE OR REPLACE FUNCTION lease._acquire_wait(
    p_key   text,
    p_owner text,
    p_ttl   interval,
    p_wait  interval,
    p_shared boolean)
    RETURNS TABLE (acquired boolean, epoch bigint, expires_at timestamptz)
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
    SET lock_timeout = '50ms'
    SET client_min_messages = notice
    ROWS 1
AS $function$
DECLARE
    c_poll        CONSTANT interval := interval '50 milliseconds';
    c_probe_every CONSTANT interval := interval '1 second';
    v_start       CONSTANT timestamptz := pg_catalog.clock_timestamp();
    v_deadline    CONSTANT timestamptz := v_start + p_wait;
    -- Read before anything in this function changes settings: the
    -- session's value, in force since the statement started.
    v_probe       CONSTANT boolean :=
        pg_catalog.current_setting('client_connection_check_interval') = '0';
    v_now         timestamptz;
    v_next_probe  timestamptz := v_start + c_probe_every;
    v_slept       boolean := false;
    v_locked      boolean;
    v_holder_until timestamptz;
    v_limit       integer;
    v_marked      boolean := false;
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
            IF p_shared THEN
                SELECT a.acquired, a.epoch, a.expires_at
                  INTO acquired, epoch, expires_at
                  FROM lease.acquire_shared(p_key, p_owner, p_ttl, interval '0') AS a;
            ELSE
                SELECT a.acquired, a.epoch, a.expires_at
                  INTO acquired, epoch, expires_at
                  FROM lease.acquire(p_key, p_owner, p_ttl, interval '0') AS a;
            END IF;
        EXCEPTION
            WHEN lock_not_available THEN
                acquired := false;
                v_locked := true;
        END;

        IF acquired THEN
            IF v_slept THEN
                -- The client may have gone while this call slept: probe
                -- twice before the grant can commit (see above).
                RAISE NOTICE 'pg_lease: % is free, granting it', lease._quoted(p_key);
                PERFORM pg_catalog.pg_sleep(0.002);
                RAISE NOTICE 'pg_lease: granted % after waiting', lease._quoted(p_key);
                PERFORM pg_catalog.pg_sleep(0);
            END IF;
            RETURN NEXT;
            RETURN;
        END IF;

        v_now := pg_catalog.clock_timestamp();
        EXIT WHEN v_now >= v_deadline;

        -- Held by another owner: its expiry, as committed now.  Sleep no
        -- further than that (a lapse is taken at once), and no longer than
        -- a poll while a transaction keeps the row locked.  The read takes
        -- no lock, so it runs also while the row is locked.
        -- A counted key (§13): the first of its permits to lapse.
        SELECT COALESCE(l.expires_at,
                        (SELECT pg_catalog.min(p.expires_at) FROM lease.permits AS p
                          WHERE p.key = p_key COLLATE pg_catalog."C"
                            AND p.expires_at > v_now)),
               l.permit_limit
          INTO v_holder_until, v_limit
          FROM lease.leases AS l
         WHERE l.key = p_key COLLATE pg_catalog."C";
        IF v_locked THEN
            v_holder_until := NULL;
        END IF;
        -- An exclusive acquirer denied by shared grants marks the key until
        -- its transaction ends: no new shared grant meanwhile (the
        -- no-starvation rule, 45-permits.sql, §13).  Also while a shared
        -- grant's open transaction keeps the row locked: readers whose
        -- transactions overlap lock the row without a pause.  The mark
        -- queues for up to a probe interval (never past the deadline), so
        -- that the shared grants' open transactions end meanwhile while no
        -- new one takes the share mode.
        IF NOT p_shared AND v_limit = 0 AND NOT v_marked THEN
            PERFORM pg_catalog.set_config(
                'lock_timeout',
                GREATEST(pg_catalog.ceil(1000 * pg_catalog.date_part(
                             'epoch', LEAST(c_probe_every, v_deadline - v_now))),
                         1)::text || 'ms',
                true);
            BEGIN
                PERFORM lease._mark_exclusive_wait(p_key);
                v_marked := true;
            EXCEPTION
                -- A shared grant's transaction outlived the wait: try
                -- again at the next poll.
                WHEN lock_not_available THEN NULL;
            END;
            v_now := pg_catalog.clock_timestamp();
            EXIT WHEN v_now >= v_deadline;
        END IF;

        IF v_probe AND v_now >= v_next_probe THEN
            RAISE NOTICE 'pg_lease: still waiting for %', lease._quoted(p_key);
            v_next_probe := v_now + c_probe_every;
        END IF;

        PERFORM pg_catalog.pg_sleep(GREATEST(pg_catalog.date_part('epoch',
            LEAST(c_poll, v_deadline - v_now, v_holder_until - v_now)), 0));
        v_slept := true;
    END LOOP;

    -- The last attempt says why: the key was held by another owner, or its
    -- row was locked by a transaction that had not ended (in practice an
    -- acquire that has not committed yet).
    IF v_locked THEN
        RAISE EXCEPTION 'pg_lease: acquire timed out'
            USING ERRCODE = 'query_canceled',
                  DETAIL = pg_catalog.format('key %s was still locked by another transaction after waiting %s',
                                             lease._quoted(p_key), p_wait),
                  HINT = 'A transaction that is changing this key, typically an uncommitted acquire, has not ended.';
    END IF;
    RAISE EXCEPTION 'pg_lease: acquire timed out'
        USING ERRCODE = 'query_canceled',
              DETAIL = pg_catalog.format('key %s was still held after waiting %s',
                                         lease._quoted(p_key), p_wait),
              HINT = 'lease.inspect(key) shows the current holder and its expiry.';
END;
$function$;

REVOKE ALL ON FUNCTION lease._acquire_wait(text, text, interval, interval, boolean) FROM PUBLIC;
