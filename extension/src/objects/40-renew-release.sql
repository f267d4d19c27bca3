/*
 * lease._refusal: why a renew or release did not match (§4 renew).
 *
 * Called only after the guarded UPDATE changed nothing.  Applies the checks
 * in contract order, so the first failing one decides (I8):
 *   not_owner       no row, row free, or another owner (even if lapsed)
 *   lapsed          the caller's grant has expired
 *   epoch_mismatch  the caller's live grant has another epoch
 * Returns NULL when the row now matches after all: it changed between the
 * UPDATE's snapshot and this one, and the caller should try again.  The
 * callers validate a NULL epoch away first; IS DISTINCT FROM still makes
 * one a refusal rather than a "matches after all" that they would retry
 * for ever.
 */
CREATE OR REPLACE FUNCTION lease._refusal(
    p_key   text,
    p_owner text,
    p_epoch bigint,
    p_now   timestamptz)
    RETURNS text
    LANGUAGE plpgsql
    STABLE
    SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    v_owner      text;
    v_epoch      bigint;
    v_expires_at timestamptz;
BEGIN
    SELECT l.owner, l.epoch, l.expires_at
      INTO v_owner, v_epoch, v_expires_at
      FROM lease.leases AS l
     WHERE l.key = p_key COLLATE pg_catalog."C";

    IF NOT FOUND OR v_owner IS NULL
       OR v_owner <> p_owner COLLATE pg_catalog."C" THEN
        RETURN 'not_owner';
    ELSIF p_now >= v_expires_at THEN
        RETURN 'lapsed';
    ELSIF v_epoch IS DISTINCT FROM p_epoch THEN
        RETURN 'epoch_mismatch';
    END IF;
    RETURN NULL;
END;
$function$;

REVOKE ALL ON FUNCTION lease._refusal(text, text, bigint, timestamptz) FROM PUBLIC;
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
 *   1. The UPDATE requires more than the margin left at v_now, and returns
 *      a clock read after it wrote the row (RETURNING runs then).  If that
 *      reading is still within the margin of v_now, the row was locked
 *      before v_now + margin, which is before the grant's expiry: it was
 *      live.  That is the common case: one statement, no extra lock.
 *   2. If the UPDATE took longer (it waited for a lock, or the server
 *      stalled), its subtransaction is rolled back, and so is a grant that
 *      had too little left.  Then the row is locked first (FOR NO KEY
 *      UPDATE, which under READ COMMITTED finds the newest version), the
 *      clock is read, and only a live grant is written.
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
 * lease.renew (§4 renew).  Non-ok changes nothing and reports expires_at
 * NULL.  renew never changes the epoch (I4).
 */
CREATE OR REPLACE FUNCTION lease.renew(
    p_key   text,
    p_owner text,
    p_epoch bigint,
    p_ttl   interval)
    RETURNS TABLE (status text, expires_at timestamptz)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    ROWS 1
AS $function$
DECLARE
    c_margin     CONSTANT interval := lease._lock_margin();
    v_now        CONSTANT timestamptz := pg_catalog.clock_timestamp();
    v_locked     timestamptz;
    v_expires_at timestamptz;
BEGIN
    -- Fast path: see lease._is_plain_text.
    IF (lease._is_plain_ttl(p_ttl) AND lease._is_plain_session()) IS NOT TRUE THEN
        PERFORM lease._validate('renew'::text, p_key, p_owner, p_epoch, p_ttl, NULL::interval);
        PERFORM lease._begin_write('renew'::text);
    END IF;

    -- 1. A grant with more than the margin left, renewed within the margin
    -- (see lease._lock_margin).
    BEGIN
        UPDATE lease.leases AS l
           SET expires_at = v_now + p_ttl
         WHERE l.key = p_key COLLATE pg_catalog."C"
           AND l.owner = p_owner COLLATE pg_catalog."C"
           AND l.epoch = p_epoch
           AND l.expires_at > v_now + c_margin
        RETURNING 'ok', l.expires_at, pg_catalog.clock_timestamp()
             INTO status, expires_at, v_locked;
        IF FOUND THEN
            IF v_locked < v_now + c_margin THEN
                RETURN NEXT;
                RETURN;
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'PLL02';
        END IF;
    EXCEPTION
        WHEN SQLSTATE 'PLL02' THEN
            NULL;
    END;

    -- 2. Otherwise lock the row first and decide with a clock read then.
    LOOP
        SELECT l.expires_at
          INTO v_expires_at
          FROM lease.leases AS l
         WHERE l.key = p_key COLLATE pg_catalog."C"
           AND l.owner = p_owner COLLATE pg_catalog."C"
           AND l.epoch = p_epoch
           AND l.expires_at > v_now
           FOR NO KEY UPDATE;
        IF FOUND AND pg_catalog.clock_timestamp() < v_expires_at THEN
            UPDATE lease.leases AS l
               SET expires_at = v_now + p_ttl
             WHERE l.key = p_key COLLATE pg_catalog."C"
            RETURNING 'ok', l.expires_at INTO status, expires_at;
            RETURN NEXT;
            RETURN;
        END IF;

        -- Nothing matched: now check what a match would have proven valid.
        IF (lease._is_plain_text(p_key) AND lease._is_plain_text(p_owner)
            AND p_epoch IS NOT NULL) IS NOT TRUE THEN
            PERFORM lease._validate('renew'::text, p_key, p_owner, p_epoch, p_ttl, NULL::interval);
        END IF;
        status := lease._refusal(p_key, p_owner, p_epoch, pg_catalog.clock_timestamp());
        EXIT WHEN status IS NOT NULL;
    END LOOP;

    expires_at := NULL;
    RETURN NEXT;
END;
$function$;

COMMENT ON FUNCTION lease.renew(text, text, bigint, interval) IS
    'renew(key, owner, epoch, ttl): extend the caller''s live grant to server time + ttl, epoch unchanged; '
    'status ok, or not_owner / lapsed / epoch_mismatch (checked in that order) with nothing changed';

/*
 * lease.release (§4 release).  Same shape as renew; on ok the key becomes
 * FREE, its epoch moves past the released one, which fences it (I7), and
 * released_at records when (for lease.purge).
 */
CREATE OR REPLACE FUNCTION lease.release(
    p_key   text,
    p_owner text,
    p_epoch bigint)
    RETURNS TABLE (status text)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    ROWS 1
AS $function$
DECLARE
    c_margin     CONSTANT interval := lease._lock_margin();
    v_now        CONSTANT timestamptz := pg_catalog.clock_timestamp();
    v_locked     timestamptz;
    v_expires_at timestamptz;
BEGIN
    -- Fast path: see lease._is_plain_text.
    IF lease._is_plain_session() IS NOT TRUE THEN
        PERFORM lease._validate('release'::text, p_key, p_owner, p_epoch, NULL::interval, NULL::interval);
        PERFORM lease._begin_write('release'::text);
    END IF;

    -- 1. As in renew.
    BEGIN
        UPDATE lease.leases AS l
           SET owner = NULL,
               epoch = l.epoch + 1,
               expires_at = NULL,
               released_at = v_now
         WHERE l.key = p_key COLLATE pg_catalog."C"
           AND l.owner = p_owner COLLATE pg_catalog."C"
           AND l.epoch = p_epoch
           AND l.expires_at > v_now + c_margin
        -- §10 Waiting: notify only when someone waits (37-watch.sql).
        RETURNING CASE WHEN l.watched_until > v_now THEN lease._wake(p_key) ELSE 'ok' END,
                  pg_catalog.clock_timestamp()
             INTO status, v_locked;
        IF FOUND THEN
            IF v_locked < v_now + c_margin THEN
                RETURN NEXT;
                RETURN;
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'PLL02';
        END IF;
    EXCEPTION
        WHEN SQLSTATE 'PLL02' THEN
            NULL;
    END;

    -- 2. As in renew.
    LOOP
        SELECT l.expires_at
          INTO v_expires_at
          FROM lease.leases AS l
         WHERE l.key = p_key COLLATE pg_catalog."C"
           AND l.owner = p_owner COLLATE pg_catalog."C"
           AND l.epoch = p_epoch
           AND l.expires_at > v_now
           FOR NO KEY UPDATE;
        IF FOUND AND pg_catalog.clock_timestamp() < v_expires_at THEN
            UPDATE lease.leases AS l
               SET owner = NULL,
                   epoch = l.epoch + 1,
                   expires_at = NULL,
                   released_at = v_now
             WHERE l.key = p_key COLLATE pg_catalog."C"
            RETURNING CASE WHEN l.watched_until > v_now THEN lease._wake(p_key) ELSE 'ok' END
                 INTO status;
            RETURN NEXT;
            RETURN;
        END IF;

        -- Nothing matched: now check what a match would have proven valid.
        IF (lease._is_plain_text(p_key) AND lease._is_plain_text(p_owner)
            AND p_epoch IS NOT NULL) IS NOT TRUE THEN
            PERFORM lease._validate('release'::text, p_key, p_owner, p_epoch, NULL::interval, NULL::interval);
        END IF;
        status := lease._refusal(p_key, p_owner, p_epoch, pg_catalog.clock_timestamp());
        EXIT WHEN status IS NOT NULL;
    END LOOP;

    RETURN NEXT;
END;
$function$;

COMMENT ON FUNCTION lease.release(text, text, bigint) IS
    'release(key, owner, epoch): end the caller''s live grant; the key becomes free and its epoch increments; '
    'status ok, or not_owner / lapsed / epoch_mismatch (checked in that order) with nothing changed';

