/* extension/sql/pg_lease--0.1.0.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION pg_lease" to load this file. \quit

/*
 * pg_lease 0.1.0: leases on named keys, in plain SQL and PL/pgSQL.
 *
 * The contract is specs/SEMANTICS.md; section numbers (§) below refer to it.
 *
 * Security model (§1).  The extension is trusted: a role with CREATE on
 * the database may install it, and this script then runs as the bootstrap
 * superuser, who owns the table and every function.  So the installing role
 * reaches the table only through the API, like everyone else.  The four API
 * functions are SECURITY DEFINER and therefore run as that superuser.  Every
 * PL/pgSQL function pins search_path to "pg_catalog, pg_temp" and names
 * every table and function with its schema; the SQL helpers have
 * SQL-standard bodies, whose names are resolved once, when they are
 * created.  Operators are left unqualified on purpose:
 * with that search_path, operator lookup sees pg_catalog only (pg_temp is
 * never searched for functions or operators), so a caller's
 * public.=(text, text) or similar cannot be picked up;
 * OPERATOR(pg_catalog.=) everywhere would add noise without closing
 * anything further.  Comparisons of key and owner carry an explicit
 * COLLATE "C": identity is byte equality, independent of the collation of
 * the caller's argument (a nondeterministic ICU collation would otherwise
 * make 'Worker' equal 'worker') and always able to use the primary key
 * index.
 *
 * CREATE EXTENSION creates schema lease as the installing role, before this
 * script runs.  The script takes the schema over (below): its owner could
 * otherwise rename it and plant look-alikes under the name lease, which the
 * PL/pgSQL bodies, resolving names at run time, would then call with
 * superuser rights.  It also refuses a schema lease that already holds
 * objects.
 *
 * Internal calls also pass arguments of exactly the declared types
 * (literals and NULLs are cast): function resolution takes an exact match
 * first, so no overload could ever be chosen in place of the extension's
 * own helper.
 *
 * The table is not registered with pg_extension_config_dump: its owner is a
 * superuser, so the installing role's own pg_dump could not read it and
 * would fail.  A logical dump therefore restores an empty lease table, like
 * a re-install (§1).
 *
 * Time (§2).  Each call reads clock_timestamp() once into v_now (a blocking
 * acquire once per attempt); every state test uses that value.  A grant is
 * held while v_now < expires_at, so at expires_at itself it has lapsed.
 * Expiry is lazy: nothing rewrites a lapsed row.
 *
 * The internal helpers (prefix "_") are not executable by PUBLIC.
 */

-- CREATE EXTENSION made schema lease (control file: schema) as the
-- installing role, or found it.  Accept it only empty: nothing placed there
-- beforehand may share a name with what follows (see the header).
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_class
                WHERE relnamespace = 'lease'::pg_catalog.regnamespace)
       OR EXISTS (SELECT FROM pg_catalog.pg_proc
                   WHERE pronamespace = 'lease'::pg_catalog.regnamespace) THEN
        RAISE EXCEPTION 'pg_lease: schema lease already contains objects'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'CREATE EXTENSION pg_lease needs schema lease to be empty or absent.';
    END IF;
END
$$;

-- Whoever owns schema lease can rename it and create objects in it, so it
-- must be the role that owns the functions.  (When a superuser installs,
-- this changes nothing.)  Callers get USAGE to reach the API; the table
-- stays closed.
ALTER SCHEMA lease OWNER TO CURRENT_USER;
GRANT USAGE ON SCHEMA lease TO PUBLIC;

/*
 * One row per key that was ever granted (§1).  Rows are never deleted:
 * epoch is the key's fencing counter and must survive release and lapse.
 *
 * Only the primary key is indexed.  acquire, renew and release change owner,
 * epoch and expires_at only, so with free space on the page every one of
 * them is a HOT update; fillfactor 70 keeps that space.  key is COLLATE "C"
 * so that the index never depends on the operating system's locale data (a
 * glibc collation change cannot corrupt it and make two rows for one key).
 */
CREATE TABLE lease.leases (
    key         text COLLATE pg_catalog."C" NOT NULL,
    owner       text COLLATE pg_catalog."C",
    epoch       bigint NOT NULL,
    expires_at  timestamptz,
    CONSTRAINT leases_pkey PRIMARY KEY (key),
    -- Mirror lease._validate: keys and owners are 1..1000 bytes (§3).  The
    -- API relies on them: a row that matches a key and an owner proves both
    -- valid (see lease._is_plain_text).
    CONSTRAINT leases_key_length
        CHECK (pg_catalog.octet_length(key) BETWEEN 1 AND 1000),
    CONSTRAINT leases_owner_length
        CHECK (owner IS NULL OR pg_catalog.octet_length(owner) BETWEEN 1 AND 1000),
    -- A row is either held/lapsed (both set) or free (both NULL) (§2).
    CONSTRAINT leases_holder_complete
        CHECK ((owner IS NULL) = (expires_at IS NULL)),
    -- The first grant of a key carries epoch 1 (§4).
    CONSTRAINT leases_epoch_positive
        CHECK (epoch >= 1)
) WITH (fillfactor = 70);

-- Nobody but the functions below reads or writes the table (§1).
REVOKE ALL ON TABLE lease.leases FROM PUBLIC;

COMMENT ON TABLE lease.leases IS
    'pg_lease internal state: one row per key ever granted; use the lease.* functions, never this table';

/*
 * lease._has_negative_field(interval): true when the months, days or time
 * field of the interval is negative.
 *
 * Interval comparison treats a month as 30 days, so '1 month -29 days' is
 * greater than zero, yet added to 2023-02-01 it yields 2023-01-31: a lease
 * granted with it would expire before it was granted.  §3 therefore reads
 * "positive" (ttl) and "not negative" (wait) as: no field is negative, and
 * for ttl at least one is positive.  Then server time + interval is never
 * earlier than server time, on any date and in any time zone.
 *
 * A SQL-standard body is bound at creation time (no search_path involved)
 * and is inlined into the caller.  The caller must pass a finite interval:
 * on PostgreSQL 17+ subtracting infinite intervals raises an error.
 */
CREATE FUNCTION lease._has_negative_field(p_interval interval)
    RETURNS boolean
    LANGUAGE sql
    IMMUTABLE PARALLEL SAFE
RETURN pg_catalog.date_trunc('month', p_interval) < interval '0'
    OR pg_catalog.date_trunc('day', p_interval)
       - pg_catalog.date_trunc('month', p_interval) < interval '0'
    OR p_interval - pg_catalog.date_trunc('day', p_interval) < interval '0';

REVOKE ALL ON FUNCTION lease._has_negative_field(interval) FROM PUBLIC;

/*
 * lease._validate: input validation shared by the API (§3).
 *
 * Raises one 22023 error whose DETAIL lists every violated constraint, in
 * parameter order, joined with "; ".  p_function names the calling API
 * function and decides which parameters apply.
 *
 * Limits, all documented in the README:
 *   - key and owner: 1 to 1000 bytes (octet_length), far below the btree
 *     tuple limit, so a long key is rejected here and never surfaces as an
 *     index or TOAST error; emptiness is tested by length, not by "= ''",
 *     so that no collation can make a non-empty string look empty.
 *   - ttl: finite, no negative field, greater than zero, at most 1000 years.
 *   - wait: finite, no negative field, at most 1000 years (zero allowed).
 *     The upper bound keeps server time + interval inside the timestamptz
 *     range, so a huge interval is invalid input rather than a 22008 error
 *     from deep inside the function.
 *   - epoch: not NULL.  Any other value is a valid question whose answer
 *     is a status (epoch_mismatch), not an input error.
 *
 * isfinite(interval) exists on every supported version; before 17 no
 * interval is infinite and it always returns true.
 */
CREATE FUNCTION lease._validate(
    p_function text,
    p_key      text,
    p_owner    text,
    p_epoch    bigint,
    p_ttl      interval,
    p_wait     interval)
    RETURNS void
    LANGUAGE plpgsql
    IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    c_max_bytes    CONSTANT integer  := 1000;
    c_max_interval CONSTANT interval := interval '1000 years';
    v_violations   text[] := ARRAY[]::text[];
BEGIN
    IF p_key IS NULL OR pg_catalog.octet_length(p_key) = 0 THEN
        v_violations := v_violations || 'key must be a non-empty string'::text;
    ELSIF pg_catalog.octet_length(p_key) > c_max_bytes THEN
        v_violations := v_violations || 'key must be at most 1000 bytes'::text;
    END IF;

    IF p_function <> 'inspect' THEN
        IF p_owner IS NULL OR pg_catalog.octet_length(p_owner) = 0 THEN
            v_violations := v_violations || 'owner must be a non-empty string'::text;
        ELSIF pg_catalog.octet_length(p_owner) > c_max_bytes THEN
            v_violations := v_violations || 'owner must be at most 1000 bytes'::text;
        END IF;
    END IF;

    IF p_function IN ('renew', 'release') AND p_epoch IS NULL THEN
        v_violations := v_violations || 'epoch must not be null'::text;
    END IF;

    IF p_function IN ('acquire', 'renew') THEN
        -- Nested tests: _has_negative_field needs a finite interval.
        IF p_ttl IS NULL OR NOT pg_catalog.isfinite(p_ttl) THEN
            v_violations := v_violations || 'ttl must be a positive finite interval'::text;
        ELSIF p_ttl <= interval '0' OR lease._has_negative_field(p_ttl) THEN
            v_violations := v_violations || 'ttl must be a positive finite interval'::text;
        ELSIF p_ttl > c_max_interval THEN
            v_violations := v_violations || 'ttl must be at most 1000 years'::text;
        END IF;
    END IF;

    IF p_function = 'acquire' THEN
        IF p_wait IS NULL OR NOT pg_catalog.isfinite(p_wait) THEN
            v_violations := v_violations || 'wait must be a non-negative finite interval'::text;
        ELSIF lease._has_negative_field(p_wait) THEN
            v_violations := v_violations || 'wait must be a non-negative finite interval'::text;
        ELSIF p_wait > c_max_interval THEN
            v_violations := v_violations || 'wait must be at most 1000 years'::text;
        END IF;
    END IF;

    IF pg_catalog.cardinality(v_violations) > 0 THEN
        RAISE EXCEPTION 'pg_lease: invalid input'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = pg_catalog.array_to_string(v_violations, '; '),
                  HINT = CASE p_function
                      WHEN 'inspect' THEN
                          'key is a non-empty string of at most 1000 bytes.'
                      WHEN 'release' THEN
                          'key and owner are non-empty strings of at most 1000 bytes; epoch is the one acquire returned.'
                      ELSE
                          'key and owner are non-empty strings of at most 1000 bytes; '
                          || 'intervals are finite, at most 1000 years, without negative fields; '
                          || 'ttl is greater than zero.'
                  END;
    END IF;
END;
$function$;

REVOKE ALL ON FUNCTION lease._validate(text, text, text, bigint, interval, interval) FROM PUBLIC;

/*
 * lease._begin_write: the preconditions of acquire, renew and release on the
 * transaction they run in (§5, I10).
 *
 * Read-only transactions, which include every transaction on a hot standby,
 * are refused.  renew and release would fail there anyway, at their UPDATE.
 * acquire would not always: a denied or same-owner acquire writes nothing,
 * so on a lagging standby it could confirm a grant that the primary has
 * already released and handed on.  Failing closed keeps one answer
 * everywhere: the writing API runs on the primary only.  inspect stays
 * available, being advisory.
 *
 * Commits must be durable.  With synchronous_commit = off a crash can lose a
 * grant or release the client already saw committed; recovery would then
 * hand the same epoch out a second time and fencing would be void (I2, I3,
 * I10).  So for a caller that turned it off, synchronous_commit goes back to
 * 'local' for the rest of the transaction (set_config with is_local = true:
 * the caller's session setting returns when the transaction ends).  'local'
 * is the weakest setting that flushes the commit record before reporting
 * success; stronger settings are left alone.
 */
CREATE FUNCTION lease._begin_write(p_function text)
    RETURNS void
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    IF pg_catalog.current_setting('transaction_read_only') = 'on' THEN
        RAISE EXCEPTION 'pg_lease: % needs a read-write transaction', p_function
            USING ERRCODE = 'read_only_sql_transaction',
                  DETAIL = 'transaction_read_only is on: a READ ONLY transaction, or a hot standby.',
                  HINT = 'Call it on the primary, outside READ ONLY transactions.';
    END IF;
    IF pg_catalog.current_setting('synchronous_commit') = 'off' THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'local', true);
    END IF;
END;
$function$;

REVOKE ALL ON FUNCTION lease._begin_write(text) FROM PUBLIC;

/*
 * Fast-path predicates (§3): true only for input that is plainly valid and
 * a transaction that needs no adjustment.  When a test built from them is
 * not true, the API function calls lease._validate (which raises with the
 * full DETAIL, or returns for valid input of an unusual form) and, before
 * writing, lease._begin_write.  So they decide how fast a call is, never
 * what it does.
 *
 * Why: every API call is usually a transaction of its own, and PL/pgSQL
 * builds the executor state of every expression it evaluates once per
 * transaction.  Those builds were the largest cost of a call beyond its
 * UPDATE, so the tests on the common path are kept few and small.
 * SQL-standard bodies are inlined into the calling expression when it is
 * planned: no function call at run time.
 *
 * What is tested when:
 *   - before any write: what the write would store unchecked (ttl), what
 *     picks the branch (wait) and the transaction (lease._is_plain_session);
 *   - only once the guarded UPDATE has matched nothing: key, owner and
 *     epoch.  A matching UPDATE proves them valid: the row it matched holds
 *     this key and owner byte for byte, and the table's CHECK constraints
 *     keep every stored key and owner within 1 to 1000 bytes; it holds this
 *     epoch, so the epoch is not NULL.  The owner that acquire writes is
 *     checked by those same constraints; acquire turns their error into
 *     lease._validate's.
 *
 * lease._is_plain_text: 1 to 1000 bytes.  A NULL gives NULL, which the
 * callers treat as "not plainly valid".
 */
CREATE FUNCTION lease._is_plain_text(p_value text)
    RETURNS boolean
    LANGUAGE sql
    IMMUTABLE PARALLEL SAFE
RETURN pg_catalog.octet_length(p_value) BETWEEN 1 AND 1000;

REVOKE ALL ON FUNCTION lease._is_plain_text(text) FROM PUBLIC;

/*
 * lease._is_plain_ttl: a time-only interval (no months, no days) greater
 * than zero and at most 1000 years, hence no negative field.  A ttl with
 * months or days, such as '1 day', is valid too but takes the slow path.
 * Interval equality compares lengths ('1 mon -30 days' = '0'), so "no
 * months and no days" is tested on the text form of the truncated
 * interval, which is '00:00:00' only for the zero interval in the default
 * IntervalStyle (postgres); under another IntervalStyle the test is false
 * and the call takes the slow path.  date_trunc passes infinite intervals
 * through, so they fail the test too.
 */
CREATE FUNCTION lease._is_plain_ttl(p_ttl interval)
    RETURNS boolean
    LANGUAGE sql
    STABLE PARALLEL SAFE
RETURN p_ttl > interval '0'
   AND p_ttl <= interval '1000 years'
   AND pg_catalog.date_trunc('day', p_ttl)::text = '00:00:00';

REVOKE ALL ON FUNCTION lease._is_plain_ttl(interval) FROM PUBLIC;

/*
 * lease._is_plain_zero: the zero interval with every field zero (the
 * default wait), by the same text test.
 */
CREATE FUNCTION lease._is_plain_zero(p_interval interval)
    RETURNS boolean
    LANGUAGE sql
    STABLE PARALLEL SAFE
RETURN p_interval::text = '00:00:00';

REVOKE ALL ON FUNCTION lease._is_plain_zero(interval) FROM PUBLIC;

/*
 * lease._is_plain_session: lease._begin_write would do nothing (a
 * read-write transaction, synchronous_commit not off).
 */
CREATE FUNCTION lease._is_plain_session()
    RETURNS boolean
    LANGUAGE sql
    STABLE PARALLEL SAFE
RETURN pg_catalog.current_setting('transaction_read_only') = 'off'
   AND pg_catalog.current_setting('synchronous_commit') <> 'off';

REVOKE ALL ON FUNCTION lease._is_plain_session() FROM PUBLIC;

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
CREATE FUNCTION lease._refusal(
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
 *   1. FREE or LAPSED: UPDATE ... WHERE <free or lapsed> inside a
 *      subtransaction (a BEGIN ... EXCEPTION block).  This is the common
 *      case and costs one statement.  Row locks serialize concurrent
 *      grants; the recheck admits exactly one winner.  When the UPDATE
 *      grants nothing, a private SQLSTATE rolls the subtransaction back,
 *      which releases any lock the recheck took.  On a key HELD by anyone
 *      the UPDATE matches nothing without taking a lock or an XID, so it
 *      writes nothing.
 *   2. Otherwise a plain SELECT (fresh READ COMMITTED snapshot, no lock)
 *      tells why.  HELD by the caller: its grant as it stands, with no write
 *      at all (I4).  HELD by another: denied.
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
 * Every granting statement runs in a subtransaction or is the INSERT, so a
 * transaction that grants more than 64 existing keys overflows the
 * subtransaction cache; the README notes this.
 */
CREATE FUNCTION lease.acquire(
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
    v_expires_at timestamptz;
    v_again      boolean;
BEGIN
    -- Fast path (see lease._is_plain_text); wait = 0 is part of it.
    IF (lease._is_plain_ttl(p_ttl) AND lease._is_plain_zero(p_wait)
        AND lease._is_plain_session()) IS NOT TRUE THEN
        PERFORM lease._validate('acquire'::text, p_key, p_owner, NULL::bigint, p_ttl, p_wait);
        PERFORM lease._begin_write('acquire'::text);
        IF p_wait <> interval '0' THEN
            RETURN QUERY
                SELECT w.acquired, w.epoch, w.expires_at
                  FROM lease._acquire_wait(p_key, p_owner, p_ttl, p_wait) AS w;
            RETURN;
        END IF;
    END IF;

    LOOP
        -- 1. FREE with epoch c, or LAPSED with epoch e -> HELD(owner, c+1 | e+1).
        BEGIN
            UPDATE lease.leases AS l
               SET owner = p_owner,
                   epoch = l.epoch + 1,
                   expires_at = v_now + p_ttl
             WHERE l.key = p_key COLLATE pg_catalog."C"
               AND (l.owner IS NULL OR l.expires_at <= v_now)
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
                PERFORM lease._validate('acquire'::text, p_key, p_owner, NULL::bigint, p_ttl, p_wait);
                RAISE;
        END;

        -- Nothing granted: now check what the UPDATE did not prove valid.
        IF (lease._is_plain_text(p_key) AND lease._is_plain_text(p_owner)) IS NOT TRUE THEN
            PERFORM lease._validate('acquire'::text, p_key, p_owner, NULL::bigint, p_ttl, p_wait);
        END IF;

        -- 2. Why not?
        SELECT l.owner, l.epoch, l.expires_at
          INTO v_owner, v_epoch, v_expires_at
          FROM lease.leases AS l
         WHERE l.key = p_key COLLATE pg_catalog."C";

        IF NOT FOUND THEN
            -- 3. NEVER -> HELD(owner, 1, now + ttl).
            INSERT INTO lease.leases AS l (key, owner, epoch, expires_at)
            VALUES (p_key, p_owner, 1, v_now + p_ttl)
            ON CONFLICT (key) DO NOTHING
            RETURNING true, l.epoch, l.expires_at INTO acquired, epoch, expires_at;

            IF acquired THEN
                RETURN NEXT;
                RETURN;
            END IF;
        ELSIF v_owner IS NOT NULL AND v_now < v_expires_at THEN
            -- HELD (§2): the same owner gets its grant unchanged, anyone
            -- else is denied.
            IF v_owner = p_owner COLLATE pg_catalog."C" THEN
                acquired := true;
                epoch := v_epoch;
                expires_at := v_expires_at;
                RETURN NEXT;
                RETURN;
            END IF;
            EXIT;
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
    'acquire(key, owner, ttl, wait => 0): grant key to owner until server time + ttl; returns (acquired, epoch, expires_at); '
    'the same owner gets its live grant back unchanged; wait > 0 polls every 50 ms and raises 57014 when it runs out';

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
CREATE FUNCTION lease._acquire_wait(
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

/*
 * lease.renew (§4 renew).  The success path is a single guarded UPDATE; the
 * row is read again only to name the refusal.  Non-ok changes nothing and
 * reports expires_at NULL.  renew never changes the epoch (I4).
 */
CREATE FUNCTION lease.renew(
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
        status := lease._refusal(p_key, p_owner, p_epoch, v_now);
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
CREATE FUNCTION lease.release(
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
               expires_at = NULL
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
        status := lease._refusal(p_key, p_owner, p_epoch, v_now);
        EXIT WHEN status IS NOT NULL;
    END LOOP;

    RETURN NEXT;
END;
$function$;

COMMENT ON FUNCTION lease.release(text, text, bigint) IS
    'release(key, owner, epoch): end the caller''s live grant; the key becomes free and its epoch increments; '
    'status ok, or not_owner / lapsed / epoch_mismatch (checked in that order) with nothing changed';

/*
 * lease.inspect (§4 inspect).  Advisory: the answer may be stale as soon as
 * it is returned.  No row for a key never granted; a free or lapsed key
 * reports held = false, no owner, no expiry, and its epoch as the fencing
 * watermark (anything guarded by an epoch <= it is stale).
 */
CREATE FUNCTION lease.inspect(p_key text)
    RETURNS TABLE (held boolean, owner text, epoch bigint, expires_at timestamptz)
    LANGUAGE plpgsql
    STABLE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    ROWS 1
AS $function$
DECLARE
    v_now CONSTANT timestamptz := pg_catalog.clock_timestamp();
BEGIN
    SELECT l.owner, l.epoch, l.expires_at
      INTO owner, epoch, expires_at
      FROM lease.leases AS l
     WHERE l.key = p_key COLLATE pg_catalog."C";
    IF NOT FOUND THEN
        -- No row: now check the key, which a matching row proves valid.
        IF lease._is_plain_text(p_key) IS NOT TRUE THEN
            PERFORM lease._validate('inspect'::text, p_key, NULL::text, NULL::bigint, NULL::interval, NULL::interval);
        END IF;
        RETURN;
    END IF;
    held := owner IS NOT NULL AND v_now < expires_at;
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
