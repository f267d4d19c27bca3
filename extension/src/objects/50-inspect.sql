/*
 * lease.inspect (§4 inspect).  Advisory: the answer may be stale as soon as
 * it is returned.  No row for a key never granted; a free or lapsed key
 * reports held = false, no owner, no expiry, and its epoch as the fencing
 * watermark (anything guarded by an epoch <= it is stale).  A counted key
 * (§13) is held while any of its permits is live, shows no owner, the
 * latest permit's epoch and the latest expiry of its live permits.
 */
CREATE OR REPLACE FUNCTION lease.inspect(p_key text)
    RETURNS TABLE (held boolean, owner text, epoch bigint, expires_at timestamptz)
    LANGUAGE plpgsql
    STABLE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    ROWS 1
AS $function$
DECLARE
    v_now CONSTANT timestamptz := pg_catalog.clock_timestamp();
    v_limit integer;
BEGIN
    SELECT l.owner, l.epoch, l.expires_at, l.permit_limit
      INTO owner, epoch, expires_at, v_limit
      FROM lease.leases AS l
     WHERE l.key = p_key COLLATE pg_catalog."C";
    IF NOT FOUND THEN
        -- No row: now check the key, which a matching row proves valid.
        IF lease._is_plain_text(p_key) IS NOT TRUE THEN
            PERFORM lease._validate('inspect', ARRAY[p_key]);
        END IF;
        RETURN;
    END IF;
    IF v_limit IS NULL THEN
        held := lease._is_live(owner, expires_at, v_now);
    ELSE
        -- A counted key (§13): held while a permit is live, until the
        -- latest expiry among them, with no one owner; lease.holders lists
        -- them.
        expires_at := lease._held_until(p_key, owner, expires_at, v_limit, v_now);
        held := expires_at IS NOT NULL;
        owner := NULL;
    END IF;
    IF NOT held THEN
        owner := NULL;
        expires_at := NULL;
    END IF;
    RETURN NEXT;
END;
$function$;

COMMENT ON FUNCTION lease.inspect(text) IS
    'inspect(key): advisory view of a key: no row if never granted; (true, owner, epoch, expires_at) while held; '
    '(false, NULL, epoch, NULL) when free or lapsed, epoch being the fencing watermark';
