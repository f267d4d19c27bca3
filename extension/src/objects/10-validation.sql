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
CREATE OR REPLACE FUNCTION lease._has_negative_field(p_interval interval)
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
CREATE OR REPLACE FUNCTION lease._validate(
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

    IF p_function NOT IN ('inspect', 'fence') THEN
        IF p_owner IS NULL OR pg_catalog.octet_length(p_owner) = 0 THEN
            v_violations := v_violations || 'owner must be a non-empty string'::text;
        ELSIF pg_catalog.octet_length(p_owner) > c_max_bytes THEN
            v_violations := v_violations || 'owner must be at most 1000 bytes'::text;
        END IF;
    END IF;

    IF p_function IN ('renew', 'release', 'fence') AND p_epoch IS NULL THEN
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
                      WHEN 'fence' THEN
                          'key is a non-empty string of at most 1000 bytes; epoch is the one acquire returned.'
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
 * lease._begin_write: the precondition of acquire, renew and release on the
 * transaction they run in (§5).
 *
 * Read-only transactions, which include every transaction on a hot standby,
 * are refused.  renew and release would fail there anyway, at their UPDATE.
 * acquire would not always: a denied or same-owner acquire writes nothing,
 * so on a lagging standby it could confirm a grant that the primary has
 * already released and handed on.  Failing closed keeps one answer
 * everywhere: the writing API runs on the primary only.  inspect stays
 * available, being advisory.
 *
 * Durability of the commit is not decided here but at commit time, by the
 * trigger lease._durable_commit (objects/20-durability.sql): a setting
 * raised here could be lowered again before COMMIT.
 */
CREATE OR REPLACE FUNCTION lease._begin_write(p_function text)
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
CREATE OR REPLACE FUNCTION lease._is_plain_text(p_value text)
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
CREATE OR REPLACE FUNCTION lease._is_plain_ttl(p_ttl interval)
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
CREATE OR REPLACE FUNCTION lease._is_plain_zero(p_interval interval)
    RETURNS boolean
    LANGUAGE sql
    STABLE PARALLEL SAFE
RETURN p_interval::text = '00:00:00';

REVOKE ALL ON FUNCTION lease._is_plain_zero(interval) FROM PUBLIC;

/*
 * lease._is_plain_session: lease._begin_write would do nothing (a
 * read-write transaction).
 */
CREATE OR REPLACE FUNCTION lease._is_plain_session()
    RETURNS boolean
    LANGUAGE sql
    STABLE PARALLEL SAFE
RETURN pg_catalog.current_setting('transaction_read_only') = 'off';

REVOKE ALL ON FUNCTION lease._is_plain_session() FROM PUBLIC;
