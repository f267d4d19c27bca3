/*
 * Operating pg_lease (0.2.0): lease.list shows every key, lease.purge bounds
 * the table's growth, and the epoch floor keeps fencing intact across purges.
 */
REVOKE ALL ON TABLE lease.epoch_floor FROM PUBLIC;

COMMENT ON TABLE lease.epoch_floor IS
    'pg_lease internal state: the highest epoch of any purged key; keys without a row are granted epoch + 1';

/*
 * lease._prefix_upper_bound(prefix): the smallest string that sorts after
 * every string starting with prefix under COLLATE "C", or NULL when there
 * is none (an empty prefix, or one made only of the largest character).
 * lease.list scans key >= prefix AND key < this bound, a range of the
 * primary key index.
 *
 * "C" compares bytes, which in UTF8 is code point order, so the bound is
 * the prefix with its last character replaced by the next code point
 * (skipping the surrogates, which no text holds); a last character that
 * has no successor (U+10FFFF) is dropped and the one before it is
 * incremented instead.  Incrementing the last byte would be wrong: it can
 * make invalid UTF8.  In a single-byte encoding characters are bytes.  In
 * another multibyte encoding only ASCII characters are incremented; a
 * bound made from an earlier character is larger than the exact one,
 * which only widens the scan: list checks starts_with() on every row
 * anyway.
 */
CREATE OR REPLACE FUNCTION lease._prefix_upper_bound(p_prefix text)
    RETURNS text
    LANGUAGE plpgsql
    STABLE
    SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    v_encoding CONSTANT name := pg_catalog.getdatabaseencoding();
    v_max      CONSTANT integer := CASE
        WHEN v_encoding = 'UTF8' THEN 1114111
        WHEN pg_catalog.pg_encoding_max_length(pg_catalog.pg_char_to_encoding(v_encoding)) = 1 THEN 255
        ELSE 126
    END;
    v_base     text := p_prefix;
    v_last     text;
    v_code     integer;
BEGIN
    WHILE pg_catalog.length(v_base) > 0 LOOP
        v_last := pg_catalog.right(v_base, 1);
        v_base := pg_catalog.left(v_base, -1);
        -- ascii() raises for a non-ASCII character of a non-UTF8 multibyte
        -- encoding; such a character is one that cannot be incremented.
        IF v_max > 126 OR pg_catalog.octet_length(v_last) = 1 THEN
            v_code := pg_catalog.ascii(v_last);
            IF v_code < v_max THEN
                v_code := CASE WHEN v_code + 1 BETWEEN 55296 AND 57343 THEN 57344 ELSE v_code + 1 END;
                RETURN v_base || pg_catalog.chr(v_code);
            END IF;
        END IF;
    END LOOP;
    RETURN NULL;
END;
$function$;

REVOKE ALL ON FUNCTION lease._prefix_upper_bound(text) FROM PUBLIC;

/*
 * lease.list (§4 list).  Advisory, like inspect, whose lazy-expiry rules it
 * applies to every row: a lapsed grant is not held and shows no owner and
 * no expiry; epoch is the key's fencing watermark unless held.  Rows come
 * in key order (COLLATE "C", byte order).  With a prefix the scan is a
 * range of the primary key index: key >= prefix AND key < the bound of
 * lease._prefix_upper_bound, never a sequential scan of the table for a
 * selective prefix.  The two statements differ only in that bound.  A
 * counted key (§13) shows as inspect shows it: held while a permit is live,
 * no owner, the latest expiry of its live permits.
 *
 * Anyone who may call the API may list: it shows what inspect shows, key
 * by key.  The result is built in full before the first row is returned
 * (RETURN QUERY), so a large listing uses work_mem, then a temporary file.
 */
CREATE OR REPLACE FUNCTION lease.list(
    p_prefix    text DEFAULT NULL,
    p_held_only boolean DEFAULT true)
    RETURNS TABLE (key text, held boolean, owner text, epoch bigint, expires_at timestamptz)
    LANGUAGE plpgsql
    STABLE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    ROWS 100
AS $function$
DECLARE
    v_now    CONSTANT timestamptz := pg_catalog.clock_timestamp();
    v_prefix CONSTANT text COLLATE pg_catalog."C" := COALESCE(p_prefix, '');
    v_upper  text COLLATE pg_catalog."C";
BEGIN
    IF (p_held_only IS NOT NULL AND pg_catalog.octet_length(v_prefix) <= lease._max_bytes()) IS NOT TRUE THEN
        PERFORM lease._validate('list', ARRAY[p_prefix], p_held_only => p_held_only);
    END IF;
    v_upper := lease._prefix_upper_bound(v_prefix);

    -- RETURN QUERY wants the declared result types exactly: the columns
    -- are domains over them (install.sql), hence the casts.
    IF v_upper IS NULL THEN
        RETURN QUERY
            SELECT l.key::text, v.until IS NOT NULL,
                   CASE WHEN v.until IS NOT NULL AND l.permit_limit IS NULL THEN l.owner::text END,
                   l.epoch::bigint,
                   v.until
              FROM lease.leases AS l,
                   LATERAL (SELECT CASE WHEN l.permit_limit IS NULL
                                        THEN CASE WHEN lease._is_live(l.owner, l.expires_at, v_now)
                                                  THEN l.expires_at END
                                        ELSE lease._held_until(l.key, l.owner, l.expires_at,
                                                               l.permit_limit, v_now) END) AS v (until)
             WHERE l.key >= v_prefix
               AND pg_catalog.starts_with(l.key, v_prefix)
               AND (v.until IS NOT NULL OR NOT p_held_only)
             ORDER BY l.key;
    ELSE
        RETURN QUERY
            SELECT l.key::text, v.until IS NOT NULL,
                   CASE WHEN v.until IS NOT NULL AND l.permit_limit IS NULL THEN l.owner::text END,
                   l.epoch::bigint,
                   v.until
              FROM lease.leases AS l,
                   LATERAL (SELECT CASE WHEN l.permit_limit IS NULL
                                        THEN CASE WHEN lease._is_live(l.owner, l.expires_at, v_now)
                                                  THEN l.expires_at END
                                        ELSE lease._held_until(l.key, l.owner, l.expires_at,
                                                               l.permit_limit, v_now) END) AS v (until)
             WHERE l.key >= v_prefix
               AND l.key < v_upper
               AND pg_catalog.starts_with(l.key, v_prefix)
               AND (v.until IS NOT NULL OR NOT p_held_only)
             ORDER BY l.key;
    END IF;
END;
$function$;

COMMENT ON FUNCTION lease.list(text, boolean) IS
    'list(p_prefix => NULL, p_held_only => true): every key starting with prefix, in key order, as inspect reports it: '
    '(key, held, owner, epoch, expires_at); p_held_only => false adds free and lapsed keys';

/*
 * lease._first_grant_epoch (§4 purge): called by acquire right after its
 * INSERT granted a key that had no row, with the epoch it stored: the
 * floor + 1 as its snapshot saw it.  It is the only place that decides the
 * epoch of a key's first grant after the INSERT; the batches are made of
 * lease.acquire, so they come here too.
 *
 * That snapshot can be older than a purge of this very key: the INSERT
 * takes its snapshot, then waits for (or finds already gone) a row of the
 * key that another session inserted and released and a purge deleted
 * meanwhile; the purge's higher floor is not in the snapshot.  Once the
 * INSERT is done, every purge that deleted a row of the key has committed
 * (the INSERT's uniqueness check waited for it), so a fresh look at the
 * floor sees them all.  If the floor has reached the stored epoch, the
 * row, still uncommitted and ours, moves to floor + 1.  A purge of other
 * keys can raise the floor too; the epoch then jumps further than needed,
 * which costs nothing.
 *
 * READ COMMITTED reads the floor with a new snapshot and no lock.  Under
 * REPEATABLE READ and SERIALIZABLE the snapshot is the transaction's, so
 * the floor is read FOR SHARE instead: a floor changed after the snapshot
 * then fails the call with 40001 (§5: fail, never grant wrongly).  Purge
 * takes the floor's row lock before any key's, so the two cannot
 * deadlock.
 */
CREATE OR REPLACE FUNCTION lease._first_grant_epoch(p_key text, p_epoch bigint)
    RETURNS bigint
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    v_floor bigint;
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') = 'read committed' THEN
        SELECT f.epoch INTO v_floor FROM lease.epoch_floor AS f;
    ELSE
        SELECT f.epoch INTO v_floor FROM lease.epoch_floor AS f FOR SHARE;
    END IF;
    IF v_floor < p_epoch THEN
        RETURN p_epoch;
    END IF;
    UPDATE lease.leases AS l
       SET epoch = lease._next_epoch(v_floor)
     WHERE l.key = p_key COLLATE pg_catalog."C";
    RETURN lease._next_epoch(v_floor);
END;
$function$;

REVOKE ALL ON FUNCTION lease._first_grant_epoch(text, bigint) FROM PUBLIC;

/*
 * lease.purge (§4 purge): deletes the rows of keys that are FREE and were
 * released at least older_than ago, or LAPSED and expired at least
 * older_than ago; returns how many.  A held key is never touched, and
 * neither is a row another transaction has locked (SKIP LOCKED): purge
 * never waits for a key's row lock, and a key being acquired, renewed,
 * released or fenced right now stays.  limit caps the rows of one call
 * (NULL: all), so that a large purge can run as several short
 * transactions.
 *
 * Fencing survives (I2, I3): in the same transaction the epoch floor rises
 * to the highest epoch deleted, and a key without a row is granted
 * floor + 1 (lease.acquire, lease._first_grant_epoch).  A FREE key's epoch
 * c is its watermark and a LAPSED key's epoch e its last grant; the next
 * grant would have been c + 1 or e + 1, and floor + 1 is at least that.
 *
 * The floor's row lock is taken first: purges run one at a time, and a
 * REPEATABLE READ acquire that read the floor FOR SHARE is waited for
 * before any key is locked.  Then the victims are locked FOR UPDATE SKIP
 * LOCKED, which under READ COMMITTED rechecks the condition on a row's
 * newest version, so a key acquired meanwhile drops out; the DELETE only
 * removes rows this statement holds locked.
 *
 * Who may call it: the extension's owner (the role that ran CREATE
 * EXTENSION), the roles it grants EXECUTE to, and superusers; not PUBLIC
 * (see below and the README).
 */
CREATE OR REPLACE FUNCTION lease.purge(
    p_older_than interval,
    p_limit      bigint DEFAULT NULL)
    RETURNS bigint
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    v_now    CONSTANT timestamptz := pg_catalog.clock_timestamp();
    v_cutoff timestamptz;
    v_count  bigint;
    v_max    bigint;
    v_key    text;
    v_epoch  bigint;
BEGIN
    PERFORM lease._validate('purge', NULL, p_older_than => p_older_than, p_limit => p_limit);
    PERFORM lease._begin_write('purge');
    v_cutoff := v_now - p_older_than;

    PERFORM FROM lease.epoch_floor AS f FOR NO KEY UPDATE;

    IF lease._is_distributed() THEN
        -- Citus runs no multi-shard statement that locks rows: the victims
        -- are found on every shard without a lock, then each is locked
        -- (SKIP LOCKED, rechecked) and deleted by its key, on its shard.
        -- Sequential mode keeps one connection per node, so on each node
        -- the deleted rows and the floor's copy commit in one transaction.
        PERFORM pg_catalog.set_config('citus.multi_shard_modify_mode', 'sequential', true);
        v_count := 0;
        FOR v_key IN
            SELECT l.key
              FROM lease.leases AS l
             WHERE NOT lease._is_live(l.owner, l.expires_at, v_cutoff)
               AND CASE WHEN l.owner IS NULL THEN l.released_at ELSE l.expires_at END <= v_cutoff
               AND l.permit_limit IS NULL
             LIMIT p_limit
        LOOP
            v_epoch := NULL;
            SELECT l.epoch INTO v_epoch
              FROM lease.leases AS l
             WHERE l.key = v_key
               AND NOT lease._is_live(l.owner, l.expires_at, v_cutoff)
               AND CASE WHEN l.owner IS NULL THEN l.released_at ELSE l.expires_at END <= v_cutoff
               AND l.permit_limit IS NULL
               FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN v_epoch IS NULL;
            DELETE FROM lease.leases AS l WHERE l.key = v_key;
            v_count := v_count + 1;
            v_max := GREATEST(v_max, v_epoch);
        END LOOP;
        IF v_count > 0 THEN
            UPDATE lease.epoch_floor AS f
               SET epoch = GREATEST(f.epoch, v_max);
        END IF;
        RETURN v_count;
    END IF;

    WITH victims AS (
        SELECT l.key
          FROM lease.leases AS l
         WHERE NOT lease._is_live(l.owner, l.expires_at, v_cutoff)
           AND CASE WHEN l.owner IS NULL THEN l.released_at ELSE l.expires_at END <= v_cutoff
               AND l.permit_limit IS NULL
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    ), purged AS (
        DELETE FROM lease.leases AS l
         USING victims AS v
         WHERE l.key = v.key
        RETURNING l.epoch
    )
    SELECT pg_catalog.count(*), pg_catalog.max(p.epoch)
      INTO v_count, v_max
      FROM purged AS p;

    IF v_count > 0 THEN
        UPDATE lease.epoch_floor AS f
           SET epoch = GREATEST(f.epoch, v_max);
    END IF;
    RETURN v_count;
END;
$function$;

COMMENT ON FUNCTION lease.purge(interval, bigint) IS
    'purge(older_than, p_limit => NULL): delete keys free or lapsed for at least older_than (at most limit of them), '
    'returning how many; held keys stay, and a purged key''s next grant still gets a greater epoch';

/*
 * Purge is not for everyone.  It is an operator's decision for the whole
 * database: it deletes every dead key's watermark (a purged key then
 * reads as never leased), raises the first epoch of new keys, and one
 * call can lock and delete millions of rows, writing WAL for each.  A role
 * that may take leases must not be able to do that to everybody else's
 * keys.  So PUBLIC has no EXECUTE; the extension's owner (for a trusted
 * extension, the non-superuser that created it) gets it WITH GRANT OPTION
 * and hands it on, e.g. to the role a pg_cron job runs as.  A bundle
 * install has no extension and its installing role owns the function.
 */
REVOKE ALL ON FUNCTION lease.purge(interval, bigint) FROM PUBLIC;

DO $grant$
DECLARE
    v_owner oid := (SELECT e.extowner FROM pg_catalog.pg_extension AS e WHERE e.extname = 'pg_lease');
BEGIN
    IF v_owner IS NOT NULL AND v_owner <> current_user::pg_catalog.regrole::oid THEN
        EXECUTE 'GRANT EXECUTE ON FUNCTION lease.purge(interval, pg_catalog.int8) TO '
            || v_owner::pg_catalog.regrole::text || ' WITH GRANT OPTION';
    END IF;
END
$grant$;
