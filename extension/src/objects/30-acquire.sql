/*
 * lease.acquire (§4 acquire, §5).
 *
 * wait = 0 is one attempt, with no sleep.  wait > 0 goes to
 * lease._acquire_wait, which repeats such attempts (each a call of this
 * function with wait = 0) until one succeeds or the wait runs out.
 *
 * The contract's trap (§5): INSERT ... ON CONFLICT DO UPDATE ... WHERE locks
 * the existing row even when its WHERE rejects it, and that lock lives until
 * the caller's transaction ends, so a denied acquire in an open transaction
 * would block the holder's renew and release.  A plain UPDATE has the same
 * flaw in a race: under READ COMMITTED, when the row it wants was changed by
 * a concurrent transaction, it locks the newest version before rechecking
 * its WHERE (EvalPlanQual) and keeps that lock if the recheck fails.
 *
 * So an attempt never keeps a lock on a row it did not win:
 *
 *   1. FREE or LAPSED: UPDATE ... WHERE <free or lapsed, not counted> inside a
 *      subtransaction (a BEGIN ... EXCEPTION block).  This is the common
 *      case and costs one statement.  Row locks serialize concurrent
 *      grants; the recheck admits exactly one winner.  When the UPDATE
 *      grants nothing, a private SQLSTATE rolls the subtransaction back,
 *      which releases any lock the recheck took.  On a key HELD by anyone
 *      the UPDATE matches nothing without taking a lock or an XID, so it
 *      writes nothing.
 *   2. Otherwise a plain SELECT (fresh READ COMMITTED snapshot, no lock)
 *      tells why.  A counted key (§13) gets one of its permits instead
 *      (lease._acquire_permit, 45-permits.sql).  HELD by the caller: its grant as it stands, with no write
 *      at all (I4); under REPEATABLE READ or SERIALIZABLE only after a row
 *      lock has proved the snapshot current (§10).  HELD by another: denied.
 *   3. NEVER: INSERT ... ON CONFLICT (key) DO NOTHING.  DO NOTHING takes no
 *      row lock; it waits for a concurrent uncommitted insert of the key to
 *      finish and then either inserts (the other side rolled back) or does
 *      nothing (it committed).  The unique index admits one winner.
 *   4. The SELECT finds the key FREE or LAPSED, or the insert lost its
 *      race: the key changed after the UPDATE's snapshot.  Go round once
 *      more; if that second round ends the same way, deny.  A denial is
 *      linearizable: when the UPDATE matched nothing, the key was held.
 *
 * Like any UPDATE, step 1 or 3 waits for a concurrent uncommitted operation
 * on the same row (§4: wait = 0 may do so); the caller's lock_timeout
 * applies.  lease._acquire_wait caps that wait for blocking acquires.
 *
 * A grant ends the key's watch mark (37-watch.sql): a waiter marked the
 * grant it waited for, and marks the next one itself if it still waits.
 *
 * Every granting statement runs in a subtransaction or is the INSERT, so a
 * transaction that grants more than 64 existing keys overflows the
 * subtransaction cache; the README notes this.  The batches are made of
 * this call (70-batch.sql).
 */
CREATE OR REPLACE FUNCTION lease.acquire(
    p_key   text,
    p_owner text,
    p_ttl   interval,
    p_wait  interval DEFAULT interval '0')
    RETURNS TABLE (acquired boolean, epoch bigint, expires_at timestamptz)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    ROWS 1
AS $function$
DECLARE
    v_now        CONSTANT timestamptz := pg_catalog.clock_timestamp();
    v_owner      text;
    v_epoch      bigint;
    v_first      bigint;
    v_expires_at timestamptz;
    v_again      boolean;
    v_confirmed  boolean;
    v_limit      integer;
BEGIN
    -- Fast path (see lease._is_plain_text); wait = 0 is part of it, and an
    -- owner, which the UPDATE writes and its domain would let through NULL.
    IF (lease._is_plain_ttl(p_ttl) AND p_owner IS NOT NULL AND lease._is_plain_zero(p_wait)
        AND lease._is_plain_session() AND NOT lease._owners_bound()) IS NOT TRUE THEN
        PERFORM lease._validate('acquire', ARRAY[p_key], p_owner, p_ttl => p_ttl, p_wait => p_wait);
        PERFORM lease._begin_write('acquire');
        PERFORM lease._act_for(p_owner);
        IF p_wait <> interval '0' THEN
            RETURN QUERY
                SELECT w.acquired, w.epoch, w.expires_at
                  FROM lease._acquire_wait(p_key, p_owner, p_ttl, p_wait, false) AS w;
            RETURN;
        END IF;
    END IF;

    LOOP
        -- 1. FREE with epoch c, or LAPSED with epoch e -> HELD(owner, c+1 | e+1).
        BEGIN
            UPDATE lease.leases AS l
               SET owner = p_owner,
                   epoch = lease._next_epoch(l.epoch),
                   expires_at = v_now + p_ttl,
                   watched_until = NULL
             WHERE l.key = p_key COLLATE pg_catalog."C"
               AND NOT lease._is_live(l.owner, l.expires_at, v_now)
               AND l.permit_limit IS NULL
            RETURNING true, l.epoch, l.expires_at INTO acquired, epoch, expires_at;

            IF acquired THEN
                RETURN NEXT;
                RETURN;
            END IF;
            -- Nothing granted: undo the row lock a lost race may hold.
            RAISE EXCEPTION USING ERRCODE = 'PLL01';
        EXCEPTION
            WHEN SQLSTATE 'PLL01' THEN
                NULL;
            WHEN check_violation THEN
                -- The new row broke the table's CHECK constraints: the owner
                -- is invalid.  lease._validate says so (22023).
                PERFORM lease._validate('acquire', ARRAY[p_key], p_owner, p_ttl => p_ttl, p_wait => p_wait);
                RAISE;
        END;

        -- Nothing granted: now check what the UPDATE did not prove valid.
        IF (lease._is_plain_text(p_key) AND lease._is_plain_text(p_owner)) IS NOT TRUE THEN
            PERFORM lease._validate('acquire', ARRAY[p_key], p_owner, p_ttl => p_ttl, p_wait => p_wait);
        END IF;

        -- 2. Why not?
        SELECT l.owner, l.epoch, l.expires_at, l.permit_limit
          INTO v_owner, v_epoch, v_expires_at, v_limit
          FROM lease.leases AS l
         WHERE l.key = p_key COLLATE pg_catalog."C";

        IF v_limit IS NOT NULL THEN
            -- A counted key (§13): one of its permits; a key in its shared
            -- phase: the exclusive grant once no shared grant is live.
            SELECT a.acquired, a.epoch, a.expires_at
              INTO acquired, epoch, expires_at
              FROM lease._acquire_permit(p_key, p_owner, p_ttl, false) AS a;
            -- Unless the key was made exclusive (lease.set_limit(key, NULL))
            -- while the grant waited for its row: then the exclusive
            -- grant's rules answer, in the round below.
            IF acquired OR NOT EXISTS (SELECT FROM lease.leases AS l
                                        WHERE l.key = p_key COLLATE pg_catalog."C"
                                          AND l.permit_limit IS NULL) THEN
                RETURN NEXT;
                RETURN;
            END IF;
        ELSIF NOT FOUND THEN
            -- 3. NEVER -> HELD(owner, floor + 1, now + ttl); the floor is 0
            -- until lease.purge deletes a key.  The floor is read before the
            -- INSERT and again after it (lease._first_grant_epoch).
            SELECT lease._next_epoch(f.epoch) INTO v_first FROM lease.epoch_floor AS f;
            INSERT INTO lease.leases AS l (key, owner, epoch, expires_at)
            VALUES (p_key, p_owner, v_first, v_now + p_ttl)
            ON CONFLICT (key) DO NOTHING
            RETURNING true, l.epoch, l.expires_at INTO acquired, epoch, expires_at;

            IF acquired THEN
                epoch := lease._first_grant_epoch(p_key, epoch);
                RETURN NEXT;
                RETURN;
            END IF;
        ELSIF lease._is_live(v_owner, v_expires_at, v_now) THEN
            -- HELD (§2): the same owner gets its grant unchanged, anyone
            -- else is denied.
            IF v_owner = p_owner COLLATE pg_catalog."C" THEN
                -- v_confirmed: true once the row is locked, NULL when no
                -- lock is needed, false when the grant changed meanwhile.
                v_confirmed := NULL;
                IF pg_catalog.current_setting('synchronous_standby_names') <> '' THEN
                    -- §10 Durable commits: the grant's own commit may have
                    -- been acknowledged before a synchronous standby had it
                    -- (a cancelled wait).  Rewriting the row unchanged makes
                    -- this transaction's commit wait for the standby, and so
                    -- for everything before it.  The UPDATE also locks the
                    -- row (40001 under REPEATABLE READ if it changed).  If the
                    -- grant changed meanwhile, the subtransaction gives back
                    -- the lock a failed recheck may have taken, and we look
                    -- again.
                    v_confirmed := false;
                    BEGIN
                        UPDATE lease.leases AS l
                           SET epoch = l.epoch
                         WHERE l.key = p_key COLLATE pg_catalog."C"
                           AND l.owner = p_owner COLLATE pg_catalog."C"
                           AND l.epoch = v_epoch;
                        IF NOT FOUND THEN
                            RAISE EXCEPTION USING ERRCODE = 'PLL01';
                        END IF;
                        v_confirmed := true;
                    EXCEPTION
                        WHEN SQLSTATE 'PLL01' THEN
                            NULL;
                    END;
                ELSIF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
                    -- §10 Isolation: under REPEATABLE READ or SERIALIZABLE
                    -- the SELECT read the transaction's snapshot, which may
                    -- predate a release and a new grant.  Confirm from
                    -- committed state: locking the row fails with 40001 when
                    -- it changed after the snapshot, so once it is locked the
                    -- snapshot's row is the committed one.
                    PERFORM FROM lease.leases AS l
                     WHERE l.key = p_key COLLATE pg_catalog."C"
                       FOR SHARE;
                    v_confirmed := true;
                END IF;
                -- A clock read after the lock says whether the grant is still
                -- live (the lock may have been waited for).  If it is not,
                -- the error ends the transaction, and with it the lock.
                IF v_confirmed AND NOT lease._is_live(v_owner, v_expires_at, pg_catalog.clock_timestamp()) THEN
                    RAISE EXCEPTION 'pg_lease: the grant lapsed while acquire waited for its row'
                        USING ERRCODE = 'serialization_failure',
                              HINT = 'Retry the transaction; acquire then makes a new grant.';
                END IF;
                IF v_confirmed IS NOT FALSE THEN
                    acquired := true;
                    epoch := v_epoch;
                    expires_at := v_expires_at;
                    RETURN NEXT;
                    RETURN;
                END IF;
            ELSE
                EXIT;
            END IF;
        END IF;

        -- 4. The key changed since the UPDATE's snapshot.
        EXIT WHEN v_again;
        v_again := true;
    END LOOP;

    acquired := false;
    epoch := NULL;
    expires_at := NULL;
    RETURN NEXT;
END;
$function$;

COMMENT ON FUNCTION lease.acquire(text, text, interval, interval) IS
    'acquire(key, owner, ttl, p_wait => 0): grant key to owner until server time + ttl; returns (acquired, epoch, expires_at); '
    'the same owner gets its live grant back unchanged; wait > 0 polls every 50 ms and raises 57014 when it runs out';

