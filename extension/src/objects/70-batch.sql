/*
 * Batches (§4 batches, §10 batches): lease.acquire_many, lease.renew_many,
 * lease.release_many.  Per key, each gives exactly what the single call
 * would give on the same state: same states, statuses, precedence (I8),
 * epochs, same-owner acquire and lazy expiry.  What a batch adds:
 *
 *   - One statement does the work of many: the rows are read, locked and
 *     written by set-based statements over unnest(), one round trip and one
 *     commit for up to 10000 keys.
 *   - Rows are locked in one fixed order, the keys' byte order (COLLATE
 *     "C"), by a single statement each time, so two batches never deadlock
 *     each other, whatever order their callers listed the keys in.
 *   - The result has one row per key, in the order of the input array.
 *   - Input errors (22023) name the offending array subscripts.
 *
 * A batch reads only its own keys' rows, whatever the table's size: every
 * read of lease.leases carries "l.key = ANY (p_keys)" besides its join on
 * the unnested keys, which an index scan of the primary key can search
 * for, and the functions that read run with enable_seqscan off.  The
 * planner's costs (a page read from disk for each key's search) had it
 * read and hash the whole table instead, for a batch of a thousand keys
 * among 40k rows, and on PostgreSQL 14 also with the ANY: two sequential
 * scans of 100k rows made renew_many of 1000 keys cost 40 us a key
 * instead of 11 (bench/ANALYSIS.md, "Batches").
 *
 * A batch is one statement of the caller's transaction: it commits or
 * rolls back as a whole.
 */

/*
 * lease._subscripts: "keys[2], keys[5]" for a DETAIL, at most ten of them
 * and then "and N more", so that a DETAIL stays readable for a batch of
 * ten thousand bad elements.
 */
CREATE OR REPLACE FUNCTION lease._subscripts(p_array text, p_subscripts integer[])
    RETURNS text
    LANGUAGE sql
    IMMUTABLE PARALLEL SAFE
RETURN (SELECT pg_catalog.string_agg(pg_catalog.format('%s[%s]', p_array, u.s), ', ' ORDER BY u.n)
          FROM pg_catalog.unnest(p_subscripts[1:10]) WITH ORDINALITY AS u(s, n))
    || CASE WHEN pg_catalog.cardinality(p_subscripts) > 10
            THEN pg_catalog.format(' and %s more', pg_catalog.cardinality(p_subscripts) - 10)
            ELSE '' END;

REVOKE ALL ON FUNCTION lease._subscripts(text, integer[]) FROM PUBLIC;

/*
 * lease._validate_batch: input validation of the batch functions (§3, §10
 * batches).  Like lease._validate it raises one 22023 error whose DETAIL
 * names every violated rule, joined with "; ", and it takes lease._validate's
 * rules for owner and ttl as they are (their DETAIL is carried over).
 *
 *   - keys: not NULL, one-dimensional, 1 to 10000 elements; every element a
 *     key lease._validate would accept (1 to 1000 bytes); no key twice
 *     (byte equality, as the table compares keys).
 *   - epochs (renew_many, release_many): not NULL, one-dimensional, as many
 *     elements as keys (paired by position), no NULL element.
 *
 * Offending elements are named by their subscripts in the array as passed
 * (keys[3]); a duplicate names both (keys[4] repeats keys[1]).
 *
 * 10000 keys bound the statement's memory and time (a batch holds all its
 * row locks until the caller's transaction ends); callers split larger sets.
 */
CREATE OR REPLACE FUNCTION lease._validate_batch(
    p_function text,
    p_keys     text[],
    p_owner    text,
    p_epochs   bigint[],
    p_ttl      interval)
    RETURNS void
    LANGUAGE plpgsql
    STABLE
    SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    c_max_keys   CONSTANT integer := 10000;
    v_single     CONSTANT text := pg_catalog.replace(p_function, '_many', '');
    v_violations text[] := ARRAY[]::text[];
    v_detail     text;
    v_empty      integer[];
    v_long       integer[];
    v_repeats    text[];
    v_nulls      integer[];
BEGIN
    IF p_keys IS NULL THEN
        v_violations := v_violations || 'keys must not be null'::text;
    ELSIF pg_catalog.cardinality(p_keys) = 0 THEN
        v_violations := v_violations || 'keys must not be empty'::text;
    ELSIF pg_catalog.array_ndims(p_keys) <> 1 THEN
        v_violations := v_violations || 'keys must be a one-dimensional array'::text;
    ELSIF pg_catalog.cardinality(p_keys) > c_max_keys THEN
        v_violations := v_violations
            || pg_catalog.format('keys must have at most %s elements, not %s',
                                 c_max_keys, pg_catalog.cardinality(p_keys));
    ELSE
        SELECT pg_catalog.array_agg(s.i ORDER BY s.i)
                   FILTER (WHERE pg_catalog.octet_length(s.k) IS DISTINCT FROM NULL
                             AND pg_catalog.octet_length(s.k) = 0 OR s.k IS NULL),
               pg_catalog.array_agg(s.i ORDER BY s.i)
                   FILTER (WHERE pg_catalog.octet_length(s.k) > 1000),
               pg_catalog.array_agg(pg_catalog.format('keys[%s] repeats keys[%s]', s.i, s.first) ORDER BY s.i)
                   FILTER (WHERE s.i > s.first AND pg_catalog.octet_length(s.k) > 0)
          INTO v_empty, v_long, v_repeats
          FROM (SELECT g.i, p_keys[g.i] AS k,
                       pg_catalog.min(g.i) OVER (PARTITION BY p_keys[g.i] COLLATE pg_catalog."C") AS first
                  FROM pg_catalog.generate_subscripts(p_keys, 1) AS g(i)) AS s;
        IF v_empty IS NOT NULL THEN
            v_violations := v_violations
                || ('each key must be a non-empty string: ' || lease._subscripts('keys', v_empty));
        END IF;
        IF v_long IS NOT NULL THEN
            v_violations := v_violations
                || ('each key must be at most 1000 bytes: ' || lease._subscripts('keys', v_long));
        END IF;
        IF v_repeats IS NOT NULL THEN
            v_violations := v_violations
                || ('keys must be distinct: '
                    || pg_catalog.array_to_string(v_repeats[1:10], ', ')
                    || CASE WHEN pg_catalog.cardinality(v_repeats) > 10
                            THEN pg_catalog.format(' and %s more', pg_catalog.cardinality(v_repeats) - 10)
                            ELSE '' END);
        END IF;
    END IF;

    -- owner and ttl: lease._validate's rules and words.  Its exception block
    -- is a subtransaction, entered only when the fast predicates fail.
    IF (lease._is_plain_text(p_owner)
        AND (v_single = 'release' OR lease._is_plain_ttl(p_ttl))) IS NOT TRUE THEN
        BEGIN
            PERFORM lease._validate(v_single, 'k'::text, p_owner, 0::bigint, p_ttl, interval '0');
        EXCEPTION
            WHEN invalid_parameter_value THEN
                GET STACKED DIAGNOSTICS v_detail = PG_EXCEPTION_DETAIL;
                v_violations := v_violations || v_detail;
        END;
    END IF;

    IF v_single IN ('renew', 'release') THEN
        IF p_epochs IS NULL THEN
            v_violations := v_violations || 'epochs must not be null'::text;
        ELSIF pg_catalog.cardinality(p_epochs) > 0 AND pg_catalog.array_ndims(p_epochs) <> 1 THEN
            v_violations := v_violations || 'epochs must be a one-dimensional array'::text;
        ELSE
            IF pg_catalog.array_ndims(p_keys) = 1
               AND pg_catalog.cardinality(p_epochs) <> pg_catalog.cardinality(p_keys) THEN
                v_violations := v_violations
                    || pg_catalog.format('epochs must have as many elements as keys (%s, not %s)',
                                         pg_catalog.cardinality(p_keys), pg_catalog.cardinality(p_epochs));
            END IF;
            IF pg_catalog.cardinality(p_epochs) > 0 THEN
                SELECT pg_catalog.array_agg(g.i ORDER BY g.i) FILTER (WHERE p_epochs[g.i] IS NULL)
                  INTO v_nulls
                  FROM pg_catalog.generate_subscripts(p_epochs, 1) AS g(i);
                IF v_nulls IS NOT NULL THEN
                    v_violations := v_violations
                        || ('each epoch must not be null: ' || lease._subscripts('epochs', v_nulls));
                END IF;
            END IF;
        END IF;
    END IF;

    IF pg_catalog.cardinality(v_violations) > 0 THEN
        RAISE EXCEPTION 'pg_lease: invalid input'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = pg_catalog.array_to_string(v_violations, '; '),
                  HINT = 'keys is a one-dimensional array of 1 to 10000 distinct keys'
                      || CASE WHEN v_single = 'acquire' THEN '' ELSE ', epochs one epoch per key, none NULL' END
                      || '; key and owner are non-empty strings of at most 1000 bytes'
                      || CASE WHEN v_single = 'release' THEN '.'
                              ELSE '; ttl is a positive finite interval of at most 1000 years.' END;
    END IF;
END;
$function$;

REVOKE ALL ON FUNCTION lease._validate_batch(text, text[], text, bigint[], interval) FROM PUBLIC;

/*
 * lease.acquire_many (§4 acquire with wait = 0, for each key; §5; §10).
 *
 * One statement reads every key's row and, for the keys it finds NEVER,
 * FREE or LAPSED, runs one INSERT ... ON CONFLICT DO UPDATE ... WHERE
 * <free or lapsed>, its rows sorted by key: that inserts the NEVER keys
 * (at the epoch floor + 1, as lease.acquire does) and grants the others,
 * locking in key order.  Keys held in that same
 * snapshot are answered from it: the same owner gets its grant unchanged
 * (I4), another owner's key is denied.  A denied key is never sent to the
 * upsert, so it takes no row lock (§5).
 *
 * The upsert locks a row before it tests its WHERE and keeps that lock
 * when the test fails: a key taken by someone else between the snapshot
 * and the upsert (a lost race) would stay locked.  So the statement runs
 * in a subtransaction, and when any key it sent is not granted, a private
 * SQLSTATE rolls it back, which drops every lock and write it made; then
 * each key is acquired on its own with lease.acquire, in key order (each
 * of those avoids keeping locks the same way).  Races are rare; in the
 * common case a batch is one statement and one subtransaction.
 *
 * Under REPEATABLE READ or SERIALIZABLE (§10 isolation) the snapshot may be
 * older than committed state.  The keys held by the caller in it are then
 * sent through the upsert too, whose WHERE they fail: the row is locked
 * (in key order, with the rest) and PostgreSQL raises 40001 if the row has
 * changed since the snapshot, so a same-owner answer is committed state;
 * a clock read after the lock must still find it live, else 40001 (as
 * lease.acquire does).  Such keys are not counted as lost.  Keys held by another owner are
 * denied from the snapshot, as §5 allows.
 *
 * With synchronous standbys configured (§10 Durable commits, as in
 * lease.acquire) the caller's own live grants go through the upsert too, and
 * its DO UPDATE rewrites them unchanged: this transaction's commit then waits
 * for the standbys, and so for the grant's own commit.  A rewrite that does
 * not match (the grant changed hands meanwhile) counts as lost: its row may
 * be locked, so the batch falls back to single calls.
 */
CREATE OR REPLACE FUNCTION lease.acquire_many(
    p_keys  text[],
    p_owner text,
    p_ttl   interval)
    RETURNS TABLE (key text, acquired boolean, epoch bigint, expires_at timestamptz)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    SET plan_cache_mode = force_custom_plan
    SET enable_seqscan = off
AS $function$
DECLARE
    v_now      CONSTANT timestamptz := pg_catalog.clock_timestamp();
    v_confirm  CONSTANT boolean :=
        pg_catalog.current_setting('transaction_isolation') <> 'read committed';
    v_rewrite  CONSTANT boolean :=
        pg_catalog.current_setting('synchronous_standby_names') <> '';
    v_lost     bigint;
    v_keys     text[];
    v_acquired boolean[];
    v_epochs   bigint[];
    v_expiries timestamptz[];
    v_mine     boolean[];
    v_never    boolean[];
    v_floor    bigint;
    v_key      text;
    v_n        bigint;
    v_one_by_one boolean := false;
BEGIN
    PERFORM lease._validate_batch('acquire_many'::text, p_keys, p_owner, NULL::bigint[], p_ttl);
    IF lease._is_plain_session() IS NOT TRUE THEN
        PERFORM lease._begin_write('acquire_many'::text);
    END IF;

    BEGIN
        WITH input AS (
            SELECT i.k, i.n
              FROM pg_catalog.unnest(p_keys) WITH ORDINALITY AS i(k, n)
        ), seen AS (
            SELECT i.k, i.n, l.owner, l.epoch, l.expires_at,
                   l.key IS NULL AS never,
                   (l.key IS NULL OR l.owner IS NULL OR l.expires_at <= v_now) AS grantable,
                   (l.owner = p_owner COLLATE pg_catalog."C" AND l.expires_at > v_now) AS mine
              FROM input AS i
              LEFT JOIN lease.leases AS l ON l.key = i.k COLLATE pg_catalog."C"
                                         AND l.key = ANY (p_keys)
        ), granted AS (
            INSERT INTO lease.leases AS l (key, owner, epoch, expires_at)
            SELECT s.k, p_owner, (SELECT f.epoch + 1 FROM lease.epoch_floor AS f), v_now + p_ttl
              FROM seen AS s
             WHERE s.grantable OR ((v_confirm OR v_rewrite) AND s.mine)
             ORDER BY s.k COLLATE pg_catalog."C"
            ON CONFLICT ON CONSTRAINT leases_pkey DO UPDATE
               SET owner = excluded.owner,
                   epoch = CASE WHEN l.owner IS NULL OR l.expires_at <= v_now
                                THEN l.epoch + 1 ELSE l.epoch END,
                   expires_at = CASE WHEN l.owner IS NULL OR l.expires_at <= v_now
                                     THEN excluded.expires_at ELSE l.expires_at END
             WHERE l.owner IS NULL OR l.expires_at <= v_now
                OR (v_rewrite AND l.owner = p_owner COLLATE pg_catalog."C"
                    AND l.expires_at > v_now)
            RETURNING l.key, l.epoch, l.expires_at
        )
        SELECT pg_catalog.count(*) FILTER (WHERE (s.grantable OR (v_rewrite AND s.mine IS TRUE))
                                                 AND g.key IS NULL),
               pg_catalog.array_agg(s.k ORDER BY s.n),
               pg_catalog.array_agg(g.key IS NOT NULL OR s.mine IS TRUE ORDER BY s.n),
               pg_catalog.array_agg(CASE WHEN g.key IS NOT NULL THEN g.epoch
                                         WHEN s.mine THEN s.epoch END ORDER BY s.n),
               pg_catalog.array_agg(CASE WHEN g.key IS NOT NULL THEN g.expires_at
                                         WHEN s.mine THEN s.expires_at END ORDER BY s.n),
               pg_catalog.array_agg(s.mine IS TRUE AND NOT s.grantable ORDER BY s.n),
               pg_catalog.array_agg(g.key IS NOT NULL AND s.never ORDER BY s.n)
          INTO v_lost, v_keys, v_acquired, v_epochs, v_expiries, v_mine, v_never
          FROM seen AS s
          LEFT JOIN granted AS g ON g.key = s.k COLLATE pg_catalog."C";

        IF v_lost > 0 THEN
            -- A lost race: undo the locks it may have left.
            RAISE EXCEPTION USING ERRCODE = 'PLL01';
        END IF;

        -- §4 purge, as lease._first_grant_epoch: a key granted without a
        -- row got the epoch floor + 1 as the upsert's snapshot saw it; a
        -- purge of that key may have committed after that snapshot.  Look
        -- again (FOR SHARE outside READ COMMITTED) and move such rows past
        -- the floor; they are ours and uncommitted.
        IF pg_catalog.array_position(v_never, true) IS NOT NULL THEN
            IF v_confirm THEN
                SELECT f.epoch INTO v_floor FROM lease.epoch_floor AS f FOR SHARE;
            ELSE
                SELECT f.epoch INTO v_floor FROM lease.epoch_floor AS f;
            END IF;
            IF EXISTS (SELECT FROM ROWS FROM (pg_catalog.unnest(v_never), pg_catalog.unnest(v_epochs)) AS m(never, e)
                        WHERE m.never AND m.e <= v_floor) THEN
                UPDATE lease.leases AS l
                   SET epoch = v_floor + 1
                  FROM ROWS FROM (pg_catalog.unnest(v_keys), pg_catalog.unnest(v_never), pg_catalog.unnest(v_epochs)) AS m(k, never, e)
                 WHERE m.never AND m.e <= v_floor
                   AND l.key = m.k COLLATE pg_catalog."C";
                v_epochs := ARRAY(
                    SELECT CASE WHEN m.never AND m.e <= v_floor THEN v_floor + 1 ELSE m.e END
                      FROM ROWS FROM (pg_catalog.unnest(v_never), pg_catalog.unnest(v_epochs)) WITH ORDINALITY AS m(never, e, n)
                     ORDER BY m.n);
            END IF;
        END IF;

        -- §10 Isolation, as in lease.acquire: a grant confirmed under its row
        -- lock must still be live by a clock read after the lock.  Under
        -- READ COMMITTED (a rewrite for the standbys) lease.acquire looks
        -- again instead: so do the single calls here.
        IF (v_confirm OR v_rewrite) AND EXISTS (
               SELECT FROM ROWS FROM (pg_catalog.unnest(v_mine), pg_catalog.unnest(v_expiries)) AS m(mine, x)
                WHERE m.mine AND m.x <= pg_catalog.clock_timestamp()) THEN
            IF NOT v_confirm THEN
                RAISE EXCEPTION USING ERRCODE = 'PLL01';
            END IF;
            RAISE EXCEPTION 'pg_lease: the grant lapsed while acquire_many waited for its row'
                USING ERRCODE = 'serialization_failure',
                      HINT = 'Retry the transaction; acquire_many then makes a new grant.';
        END IF;
    EXCEPTION
        WHEN SQLSTATE 'PLL01' THEN
            v_one_by_one := true;
    END;

    IF v_one_by_one THEN
        -- One key at a time, in key order.
        v_keys := ARRAY[]::text[];
        FOR v_key, v_n IN
            SELECT i.k, i.n
              FROM pg_catalog.unnest(p_keys) WITH ORDINALITY AS i(k, n)
             ORDER BY i.k COLLATE pg_catalog."C"
        LOOP
            SELECT a.acquired, a.epoch, a.expires_at
              INTO acquired, epoch, expires_at
              FROM lease.acquire(v_key, p_owner, p_ttl, interval '0') AS a;
            v_keys[v_n] := v_key;
            v_acquired[v_n] := acquired;
            v_epochs[v_n] := epoch;
            v_expiries[v_n] := expires_at;
        END LOOP;
    END IF;

    RETURN QUERY
        SELECT r.k, r.a, r.e, r.x
          FROM ROWS FROM (pg_catalog.unnest(v_keys), pg_catalog.unnest(v_acquired), pg_catalog.unnest(v_epochs), pg_catalog.unnest(v_expiries)) WITH ORDINALITY AS r(k, a, e, x, n)
         ORDER BY r.n;
END;
$function$;

COMMENT ON FUNCTION lease.acquire_many(text[], text, interval) IS
    'acquire_many(keys, owner, ttl): lease.acquire(key, owner, ttl) (no wait) for each of up to 10000 distinct keys in one statement; '
    'one row (key, acquired, epoch, expires_at) per key, in input order; rows are locked in key order (COLLATE "C")';

/*
 * lease._renew_or_release_many: the body of lease.renew_many (p_release
 * false) and lease.release_many (p_release true) (§4 renew and release for
 * each key; §10 lapse is final after a lock wait).
 *
 * Each round:
 *   1. Lock, in key order, every row the single call's guarded UPDATE would
 *      match: this owner, this key's epoch, live at the statement's clock
 *      reading.  Other rows are not locked, as the single call does not lock
 *      them.
 *   2. Read the clock again, now that those rows are locked.
 *   3. One statement writes the locked rows that are still live at that
 *      reading (renew: expires_at := first reading + ttl, which is never
 *      later than the second reading + ttl; release: FREE, epoch + 1) and
 *      names the refusal of every other key from the same snapshot, with the
 *      second reading, in the single call's precedence (lease._refusal, I8):
 *      not_owner, lapsed, epoch_mismatch.
 * A key that matches after all (it changed between the statements; the
 * single call retries in that case too) goes into another round.
 *
 * Under REPEATABLE READ or SERIALIZABLE, locking or writing a row that
 * changed since the snapshot raises 40001, so an ok is committed state.
 *
 * plan_cache_mode = force_custom_plan (here and in acquire_many): PL/pgSQL
 * switches a statement to a generic plan after five calls, and a generic
 * plan cannot see how many keys the arrays hold; it estimated a handful and
 * chose nested loops over the materialized input, quadratic in the batch
 * size (1000 keys: 5 ms, then 170 ms from the sixth call on).  Planning
 * each statement for its arrays costs far less than that.
 */
CREATE OR REPLACE FUNCTION lease._renew_or_release_many(
    p_keys    text[],
    p_owner   text,
    p_epochs  bigint[],
    p_ttl     interval,
    p_release boolean)
    RETURNS TABLE (key text, status text, expires_at timestamptz)
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
    SET plan_cache_mode = force_custom_plan
    SET enable_seqscan = off
AS $function$
DECLARE
    v_now      CONSTANT timestamptz := pg_catalog.clock_timestamp();
    v_checked  timestamptz;
    v_pending  boolean[];
    v_locked   text[];
    v_round_n  bigint[];
    v_round_s  text[];
    v_round_x  timestamptz[];
    v_statuses text[];
    v_expiries timestamptz[];
    v_first    boolean := true;
BEGIN
    LOOP
        -- 1. Lock in key order (§10 batches).
        SELECT pg_catalog.array_agg(c.key)
          INTO v_locked
          FROM (SELECT l.key
                  FROM ROWS FROM (pg_catalog.unnest(p_keys), pg_catalog.unnest(p_epochs)) WITH ORDINALITY AS i(k, e, n)
                  JOIN lease.leases AS l ON l.key = i.k COLLATE pg_catalog."C"
                 WHERE l.key = ANY (p_keys)
                   AND (v_first OR v_pending[i.n])
                   AND l.owner = p_owner COLLATE pg_catalog."C"
                   AND l.epoch = i.e
                   AND l.expires_at > v_now
                 ORDER BY l.key
                   FOR NO KEY UPDATE OF l) AS c;

        -- 2. Live or lapsed is decided by a reading taken under the locks (§10).
        v_checked := pg_catalog.clock_timestamp();

        -- 3. Write what is still live; name every refusal.
        WITH input AS (
            SELECT i.k, i.e, i.n
              FROM ROWS FROM (pg_catalog.unnest(p_keys), pg_catalog.unnest(p_epochs)) WITH ORDINALITY AS i(k, e, n)
             WHERE v_first OR v_pending[i.n]
        ), renewed AS (
            UPDATE lease.leases AS l
               SET expires_at = v_now + p_ttl
              FROM input AS i
             WHERE NOT p_release
               AND l.key = i.k COLLATE pg_catalog."C"
               AND l.key = ANY (v_locked)
               AND l.owner = p_owner COLLATE pg_catalog."C"
               AND l.epoch = i.e
               AND l.expires_at > v_checked
            RETURNING l.key, l.expires_at
        ), released AS (
            UPDATE lease.leases AS l
               SET owner = NULL,
                   epoch = l.epoch + 1,
                   expires_at = NULL,
                   released_at = v_now
              FROM input AS i
             WHERE p_release
               AND l.key = i.k COLLATE pg_catalog."C"
               AND l.key = ANY (v_locked)
               AND l.owner = p_owner COLLATE pg_catalog."C"
               AND l.epoch = i.e
               AND l.expires_at > v_checked
            -- Notify only when someone waits, as release does (37-watch.sql).
            RETURNING l.key, NULL::timestamptz AS expires_at,
                      CASE WHEN l.watched_until > v_now THEN lease._wake(l.key) END AS woke
        ), written AS (
            SELECT w.key, w.expires_at FROM renewed AS w
            UNION ALL
            SELECT w.key, w.expires_at FROM released AS w
        )
        SELECT pg_catalog.array_agg(i.n ORDER BY i.n),
               pg_catalog.array_agg(
                   CASE WHEN w.key IS NOT NULL THEN 'ok'
                        WHEN l.key IS NULL OR l.owner IS NULL
                             OR l.owner <> p_owner COLLATE pg_catalog."C" THEN 'not_owner'
                        WHEN v_checked >= l.expires_at THEN 'lapsed'
                        WHEN l.epoch <> i.e THEN 'epoch_mismatch'
                   END ORDER BY i.n),
               pg_catalog.array_agg(w.expires_at ORDER BY i.n)
          INTO v_round_n, v_round_s, v_round_x
          FROM input AS i
          LEFT JOIN written AS w ON w.key = i.k COLLATE pg_catalog."C"
          LEFT JOIN lease.leases AS l ON l.key = i.k COLLATE pg_catalog."C"
                                     AND l.key = ANY (p_keys);

        IF v_first THEN
            v_statuses := v_round_s;
            v_expiries := v_round_x;
            v_first := false;
        ELSE
            FOR v_i IN 1 .. pg_catalog.cardinality(v_round_n) LOOP
                v_statuses[v_round_n[v_i]] := v_round_s[v_i];
                v_expiries[v_round_n[v_i]] := v_round_x[v_i];
            END LOOP;
        END IF;

        -- A key that matched after all goes round again.
        EXIT WHEN pg_catalog.array_position(v_statuses, NULL::text) IS NULL;
        v_pending := ARRAY(SELECT s.st IS NULL
                             FROM pg_catalog.unnest(v_statuses) WITH ORDINALITY AS s(st, n)
                            ORDER BY s.n);
    END LOOP;

    RETURN QUERY
        SELECT r.k, r.s, r.x
          FROM ROWS FROM (pg_catalog.unnest(p_keys), pg_catalog.unnest(v_statuses), pg_catalog.unnest(v_expiries)) WITH ORDINALITY AS r(k, s, x, n)
         ORDER BY r.n;
END;
$function$;

REVOKE ALL ON FUNCTION lease._renew_or_release_many(text[], text, bigint[], interval, boolean) FROM PUBLIC;

/*
 * lease.renew_many (§4 renew, for each key).  Non-ok changes nothing and
 * reports expires_at NULL; renew never changes an epoch (I4).
 */
CREATE OR REPLACE FUNCTION lease.renew_many(
    p_keys   text[],
    p_owner  text,
    p_epochs bigint[],
    p_ttl    interval)
    RETURNS TABLE (key text, status text, expires_at timestamptz)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    PERFORM lease._validate_batch('renew_many'::text, p_keys, p_owner, p_epochs, p_ttl);
    IF lease._is_plain_session() IS NOT TRUE THEN
        PERFORM lease._begin_write('renew_many'::text);
    END IF;
    RETURN QUERY
        SELECT b.key, b.status, b.expires_at
          FROM lease._renew_or_release_many(p_keys, p_owner, p_epochs, p_ttl, false) AS b;
END;
$function$;

COMMENT ON FUNCTION lease.renew_many(text[], text, bigint[], interval) IS
    'renew_many(keys, owner, epochs, ttl): lease.renew(keys[i], owner, epochs[i], ttl) for each of up to 10000 distinct keys in one statement; '
    'one row (key, status, expires_at) per key, in input order; rows are locked in key order (COLLATE "C")';

/*
 * lease.release_many (§4 release, for each key).  On ok the key becomes FREE
 * and its epoch moves past the released one (I7).
 */
CREATE OR REPLACE FUNCTION lease.release_many(
    p_keys   text[],
    p_owner  text,
    p_epochs bigint[])
    RETURNS TABLE (key text, status text)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    PERFORM lease._validate_batch('release_many'::text, p_keys, p_owner, p_epochs, NULL::interval);
    IF lease._is_plain_session() IS NOT TRUE THEN
        PERFORM lease._begin_write('release_many'::text);
    END IF;
    RETURN QUERY
        SELECT b.key, b.status
          FROM lease._renew_or_release_many(p_keys, p_owner, p_epochs, NULL::interval, true) AS b;
END;
$function$;

COMMENT ON FUNCTION lease.release_many(text[], text, bigint[]) IS
    'release_many(keys, owner, epochs): lease.release(keys[i], owner, epochs[i]) for each of up to 10000 distinct keys in one statement; '
    'one row (key, status) per key, in input order; rows are locked in key order (COLLATE "C")';
