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
 * lease.renew (§4 renew).  The success path is a single guarded UPDATE; the
 * row is read again only to name the refusal.  Non-ok changes nothing and
 * reports expires_at NULL.  renew never changes the epoch (I4).
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
    v_now CONSTANT timestamptz := pg_catalog.clock_timestamp();
BEGIN
    -- Fast path: see lease._is_plain_text.
    IF (lease._is_plain_ttl(p_ttl) AND lease._is_plain_session()) IS NOT TRUE THEN
        PERFORM lease._validate('renew'::text, p_key, p_owner, p_epoch, p_ttl, NULL::interval);
        PERFORM lease._begin_write('renew'::text);
    END IF;

    LOOP
        UPDATE lease.leases AS l
           SET expires_at = v_now + p_ttl
         WHERE l.key = p_key COLLATE pg_catalog."C"
           AND l.owner = p_owner COLLATE pg_catalog."C"
           AND l.epoch = p_epoch
           AND l.expires_at > v_now
        RETURNING 'ok', l.expires_at INTO status, expires_at;

        IF FOUND THEN
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
 * FREE and its epoch moves past the released one, which fences it (I7).
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
    v_now CONSTANT timestamptz := pg_catalog.clock_timestamp();
BEGIN
    -- Fast path: see lease._is_plain_text.
    IF lease._is_plain_session() IS NOT TRUE THEN
        PERFORM lease._validate('release'::text, p_key, p_owner, p_epoch, NULL::interval, NULL::interval);
        PERFORM lease._begin_write('release'::text);
    END IF;

    LOOP
        UPDATE lease.leases AS l
           SET owner = NULL,
               epoch = l.epoch + 1,
               expires_at = NULL,
               released_at = v_now
         WHERE l.key = p_key COLLATE pg_catalog."C"
           AND l.owner = p_owner COLLATE pg_catalog."C"
           AND l.epoch = p_epoch
           AND l.expires_at > v_now
        RETURNING 'ok' INTO status;

        IF FOUND THEN
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

