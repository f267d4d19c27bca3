/*
 * lease._lock_margin: how much of a grant must be left, and how quickly the
 * guarded UPDATE must finish, for renew and release to skip locking the row
 * before deciding (§10, "Lapse is final, also after a lock wait").
 *
 * The rule: renew and release decide "live or lapsed" with a clock read once
 * the key's row is locked.  The guarded UPDATE locks the row only as it
 * writes it, after evaluating its WHERE with the clock read when the call
 * began; and when it had to wait for another transaction that then rolled
 * back, PostgreSQL does not evaluate the WHERE again.  So the UPDATE alone
 * could renew or release a grant that lapsed during the wait.  Instead:
 *
 *   1. The UPDATE requires more than the margin left at v_now, and the
 *      clock is read once it has written the row (after the statement:
 *      Citus refuses a volatile function in RETURNING).  If that
 *      reading is still within the margin of v_now, the row was locked
 *      before v_now + margin, which is before the grant's expiry: it was
 *      live.  That is the common case: one statement, no extra lock.
 *   2. If the UPDATE took longer (it waited for a lock, or the server
 *      stalled), its subtransaction is rolled back, and so is a grant that
 *      had too little left.  Then the row is locked first (FOR NO KEY
 *      UPDATE, which under READ COMMITTED finds the newest version), the
 *      clock is read, and only a grant live by that reading is written, by
 *      the same UPDATE.
 *
 * The new expiry is computed from v_now, earlier than the decision: that
 * only shortens it.  The margin decides speed, never the answer.
 */
CREATE OR REPLACE FUNCTION lease._lock_margin()
    RETURNS interval
    LANGUAGE sql
    IMMUTABLE PARALLEL SAFE
RETURN interval '100 milliseconds';

REVOKE ALL ON FUNCTION lease._lock_margin() FROM PUBLIC;

/*
 * lease.renew and lease.release (§4 renew, §4 release) are one body: the
 * block below defines both from it, filling in what differs, which is the
 * fast test of the arguments and the write itself.
 *
 *   renew     expires_at := now + ttl; the epoch never changes (I4)
 *   release   the key becomes FREE, its epoch moves past the released one,
 *             which fences it (I7), released_at records when (for
 *             lease.purge); waiters are notified when someone watches
 *             (37-watch.sql)
 *
 * A refusal (lease._refusal_of, I8) changes nothing; renew then reports
 * expires_at NULL.  Key, owner and epoch are checked once nothing matched:
 * a matching row proves them valid (see lease._is_plain_text).  A refusal
 * that matches after all (the row changed between the two statements'
 * snapshots) goes round again.
 *
 * A refusal keeps no lock (§12).  Under READ COMMITTED an UPDATE or a
 * SELECT ... FOR NO KEY UPDATE whose row version was changed by a
 * transaction that committed while it waited locks the newest version,
 * rechecks its WHERE clause there and, when that fails, skips the row but
 * keeps the lock.  After a takeover that would leave the former holder's
 * transaction holding the new holder's row.  So each of the two steps runs
 * in a subtransaction that is rolled back (PLL02) unless it wrote, or
 * locked, the caller's live grant.
 */
DO $define$
DECLARE
    v_body CONSTANT text := $body$
DECLARE
    v_now        CONSTANT timestamptz := pg_catalog.clock_timestamp();
    -- 1. needs more than the margin left; 2. (v_locked) a live grant.
    v_need       timestamptz := v_now + lease._lock_margin();
    v_locked     boolean;
    v_watched    timestamptz;
    v_expires_at timestamptz;
    v_owner      text;
    v_epoch      bigint;
    v_limit      integer;
BEGIN
    IF (%1$s AND lease._is_plain_session() AND NOT lease._owners_bound()) IS NOT TRUE THEN
        PERFORM lease._validate('%2$s', ARRAY[p_key], p_owner, ARRAY[p_epoch]%3$s);
        PERFORM lease._begin_write('%2$s');
        PERFORM lease._act_for(p_owner);
    END IF;

    LOOP
        -- 1. (and 2., once the row is locked) The guarded write.
        BEGIN
            %4$s
             WHERE l.key = p_key COLLATE pg_catalog."C"
               AND l.owner = p_owner COLLATE pg_catalog."C"
               AND l.epoch = p_epoch
               AND l.expires_at > v_need
            RETURNING %5$s INTO %6$s;
            -- Written within the margin (v_locked is NULL until 2.): a
            -- clock read after the UPDATE, not in its RETURNING list,
            -- which Citus refuses for a volatile function.
            IF FOUND AND (v_locked OR pg_catalog.clock_timestamp() < v_need) THEN
                %8$s
                RETURN NEXT;
                RETURN;
            END IF;
            -- Not written, or too late: undo the write, and any lock the
            -- UPDATE took on a newer row version that failed its recheck
            -- (a takeover that committed while it waited).
            RAISE EXCEPTION USING ERRCODE = 'PLL02';
        EXCEPTION
            WHEN SQLSTATE 'PLL02' THEN
                NULL;
        END;

        -- 2. Lock the row first and decide with a clock read then.  A grant
        -- that lapsed meanwhile is refused, and its lock given back with the
        -- subtransaction: a takeover must not wait for this transaction.
        BEGIN
            SELECT l.expires_at
              INTO v_expires_at
              FROM %9$s AS l
             WHERE l.key = p_key COLLATE pg_catalog."C"
               AND l.owner = p_owner COLLATE pg_catalog."C"
               AND l.epoch = p_epoch
               AND l.expires_at > v_now
               FOR NO KEY UPDATE;
            IF FOUND AND lease._is_live(p_owner, v_expires_at, pg_catalog.clock_timestamp()) THEN
                v_locked := true;
                v_need := v_now;
            ELSE
                -- Lapsed, or no row: also NOT FOUND may hold a lock, on a
                -- newer version that failed the recheck.
                RAISE EXCEPTION USING ERRCODE = 'PLL02';
            END IF;
        EXCEPTION
            WHEN SQLSTATE 'PLL02' THEN
                NULL;
        END;
        CONTINUE WHEN v_locked;

        -- Nothing matched: now check what a match would have proven valid.
        IF (lease._is_plain_text(p_key) AND lease._is_plain_text(p_owner)
            AND p_epoch IS NOT NULL) IS NOT TRUE THEN
            PERFORM lease._validate('%2$s', ARRAY[p_key], p_owner, ARRAY[p_epoch]%3$s);
        END IF;
        SELECT l.owner, l.epoch, l.expires_at, %11$s
          INTO v_owner, v_epoch, v_expires_at, v_limit
          FROM %9$s AS l
         WHERE l.key = p_key COLLATE pg_catalog."C"%10$s;
        status := lease._refusal_of(v_owner, v_epoch, v_expires_at,
                                    p_owner, p_epoch, pg_catalog.clock_timestamp());
        IF status IS NOT NULL AND v_limit IS NOT NULL THEN
            -- A counted key (§13): the caller's permit, by the same body.
            RETURN QUERY SELECT * FROM %12$s;
            RETURN;
        END IF;
        EXIT WHEN status IS NOT NULL;
    END LOOP;
    %7$s
    RETURN NEXT;
END;
$body$;
    v_header CONSTANT text := $sql$
CREATE OR REPLACE FUNCTION %s(
    p_key   text,
    p_owner text,
    p_epoch bigint%s)
    RETURNS TABLE (%s)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    ROWS 1
AS %s$sql$;
    -- The key's row (an exclusive grant) or the caller's permit (§13).
    v_exclusive CONSTANT text[] := ARRAY['lease.leases', '', 'l.permit_limit'];
    v_permit    CONSTANT text[] := ARRAY['lease.permits',
        ' AND l.owner = p_owner COLLATE pg_catalog."C"', 'NULL::integer'];
    v_wake      CONSTANT text := 'IF v_watched > v_now THEN PERFORM lease._wake(p_key); END IF;';
    v_table     text[];
BEGIN
    FOREACH v_table SLICE 1 IN ARRAY ARRAY[v_exclusive, v_permit] LOOP
        EXECUTE pg_catalog.format(v_header,
            CASE WHEN v_table = v_exclusive THEN 'lease.renew' ELSE 'lease._renew_permit' END,
            ',
    p_ttl   interval', 'status text, expires_at timestamptz',
            pg_catalog.quote_literal(pg_catalog.format(v_body,
                'lease._is_plain_ttl(p_ttl)',
                'renew',
                ', p_ttl => p_ttl',
                pg_catalog.format('UPDATE %s AS l SET expires_at = v_now + p_ttl', v_table[1]),
                '''ok'', l.expires_at',
                'status, expires_at',
                'expires_at := NULL;',
                '',
                v_table[1], v_table[2], v_table[3],
                'lease._renew_permit(p_key, p_owner, p_epoch, p_ttl)')));

        -- An exclusive release frees the key and moves its epoch on, which
        -- fences it (I7); a permit's release deletes the permit, whose epoch
        -- no later grant takes again.  Both wake the key's waiters.
        EXECUTE pg_catalog.format(v_header,
            CASE WHEN v_table = v_exclusive THEN 'lease.release' ELSE 'lease._release_permit' END,
            '', 'status text',
            pg_catalog.quote_literal(pg_catalog.format(v_body,
                'true',
                'release',
                '',
                CASE WHEN v_table = v_exclusive THEN
                    'UPDATE lease.leases AS l SET owner = NULL, epoch = lease._next_epoch(l.epoch), '
                    'expires_at = NULL, released_at = v_now'
                ELSE 'DELETE FROM lease.permits AS l' END,
                CASE WHEN v_table = v_exclusive THEN '''ok'', l.watched_until' ELSE '''ok''' END,
                CASE WHEN v_table = v_exclusive THEN 'status, v_watched' ELSE 'status' END,
                '',
                CASE WHEN v_table = v_exclusive THEN v_wake
                ELSE 'SELECT w.watched_until INTO v_watched FROM lease.leases AS w '
                     'WHERE w.key = p_key COLLATE pg_catalog."C"; ' || v_wake END,
                v_table[1], v_table[2], v_table[3],
                'lease._release_permit(p_key, p_owner, p_epoch)')));
    END LOOP;
END
$define$;

COMMENT ON FUNCTION lease.renew(text, text, bigint, interval) IS
    'renew(key, owner, epoch, ttl): extend the caller''s live grant to server time + ttl, epoch unchanged; '
    'status ok, or not_owner / lapsed / epoch_mismatch (checked in that order) with nothing changed';

REVOKE ALL ON FUNCTION lease._renew_permit(text, text, bigint, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._release_permit(text, text, bigint) FROM PUBLIC;

COMMENT ON FUNCTION lease.release(text, text, bigint) IS
    'release(key, owner, epoch): end the caller''s live grant; the key becomes free and its epoch increments; '
    'status ok, or not_owner / lapsed / epoch_mismatch (checked in that order) with nothing changed';
