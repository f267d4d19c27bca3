/*
 * The rules of a key, each written once (0.2.1).  Every function of the
 * extension that needs one of them calls it; none restates it.
 *
 *   lease._max_bytes, _max_years, _max_interval, _max_keys   the limits (§3)
 *   lease._is_live        when a grant holds (§2): the predicate of every call
 *   lease._next_epoch     the epoch a key's next grant or release moves to (§4)
 *   lease._refusal_of     why a renew, release or epoch check does not match (I8)
 *   lease._validate       every input check of every call, scalar or array (§3)
 *   lease._message        the wording of the refusals the client gives too
 *   lease._quoted         a key or owner as a message shows it
 *   lease._begin_write    the transaction a write may run in (§5)
 *
 * The small ones are SQL-standard functions: PostgreSQL binds their bodies
 * when they are created (no search_path is involved) and inlines them into
 * the statement that calls them when it plans it, so calling them costs
 * nothing at run time.
 */

CREATE OR REPLACE FUNCTION lease._max_bytes()
    RETURNS integer
    LANGUAGE sql
    IMMUTABLE PARALLEL SAFE
RETURN 1000;

REVOKE ALL ON FUNCTION lease._max_bytes() FROM PUBLIC;

/*
 * The longest ttl, wait and older_than.  It keeps server time + interval
 * inside the timestamptz range, so that a huge interval is invalid input
 * rather than a 22008 error from deep inside a call.
 */
CREATE OR REPLACE FUNCTION lease._max_years()
    RETURNS integer
    LANGUAGE sql
    IMMUTABLE PARALLEL SAFE
RETURN 1000;

REVOKE ALL ON FUNCTION lease._max_years() FROM PUBLIC;

CREATE OR REPLACE FUNCTION lease._max_interval()
    RETURNS interval
    LANGUAGE sql
    IMMUTABLE PARALLEL SAFE
RETURN pg_catalog.make_interval(years => lease._max_years());

REVOKE ALL ON FUNCTION lease._max_interval() FROM PUBLIC;

/*
 * The most keys of one batch: it bounds the statement's memory and time (a
 * batch holds all its row locks until the caller's transaction ends).
 */
CREATE OR REPLACE FUNCTION lease._max_keys()
    RETURNS integer
    LANGUAGE sql
    IMMUTABLE PARALLEL SAFE
RETURN 10000;

REVOKE ALL ON FUNCTION lease._max_keys() FROM PUBLIC;

/*
 * The largest limit of a counted key (0.3.0, §13): every grant of a permit
 * counts the key's live permits under the key's row lock.
 */
CREATE OR REPLACE FUNCTION lease._max_permits()
    RETURNS integer
    LANGUAGE sql
    IMMUTABLE PARALLEL SAFE
RETURN 1000;

REVOKE ALL ON FUNCTION lease._max_permits() FROM PUBLIC;

/*
 * lease._message(id): the wording of each DETAIL phrase and HINT that the
 * client also gives, when it refuses input before sending it, as a
 * pg_catalog.format template.  The phrases take the argument's name first
 * (%s), then the limit; the hints take _max_bytes as %1$s and _max_years as
 * %2$s.  scripts/generate-sql.mjs copies these templates into the client's
 * generated module, so that neither side writes them by hand: keep each
 * entry on one line, WHEN 'id' THEN 'template'.
 */
CREATE OR REPLACE FUNCTION lease._message(p_id text)
    RETURNS text
    LANGUAGE sql
    IMMUTABLE PARALLEL SAFE
RETURN CASE p_id
    WHEN 'empty' THEN '%s must be a non-empty string'
    WHEN 'too_long' THEN '%s must be at most %s bytes'
    WHEN 'not_positive' THEN '%s must be a positive finite interval'
    WHEN 'negative' THEN '%s must be a non-negative finite interval'
    WHEN 'too_far' THEN '%s must be at most %s years'
    WHEN 'null' THEN '%s must not be null'
    WHEN 'hint_key' THEN 'key is a non-empty string of at most %1$s bytes.'
    WHEN 'hint_release' THEN 'key and owner are non-empty strings of at most %1$s bytes; epoch is the one acquire returned.'
    WHEN 'hint_grant' THEN 'key and owner are non-empty strings of at most %1$s bytes; intervals are finite, at most %2$s years, without negative fields; ttl is greater than zero.'
END;

REVOKE ALL ON FUNCTION lease._message(text) FROM PUBLIC;

/*
 * lease._quoted(text): a key or owner as every message and notice shows it,
 * in double quotes, a double quote inside doubled, so that no key can end
 * the quotes early and pass for another.  Under COLLATE "C": the text
 * carries the caller's collation, and before PostgreSQL 18 replace()
 * refuses a nondeterministic one.
 */
CREATE OR REPLACE FUNCTION lease._quoted(p_text text)
    RETURNS text
    LANGUAGE sql
    IMMUTABLE PARALLEL SAFE
RETURN '"' || pg_catalog.replace(p_text COLLATE pg_catalog."C", '"', '""') || '"';

REVOKE ALL ON FUNCTION lease._quoted(text) FROM PUBLIC;

/*
 * lease._is_live(owner, expires_at, at): the row's grant holds at server
 * time at (§2).  Expiry is exclusive.  A free row (owner NULL) is not live;
 * a row that is not live is grantable.  A missing row gives NULL for owner
 * and so false.
 */
CREATE OR REPLACE FUNCTION lease._is_live(p_owner text, p_expires_at timestamptz, p_at timestamptz)
    RETURNS boolean
    LANGUAGE sql
    IMMUTABLE PARALLEL SAFE
RETURN p_owner IS NOT NULL AND p_at < p_expires_at;

REVOKE ALL ON FUNCTION lease._is_live(text, timestamptz, timestamptz) FROM PUBLIC;

/*
 * lease._next_epoch(epoch): the epoch that follows a key's epoch (§4).
 * Every statement that moves a key's epoch on (a grant, a release, a
 * permit's grant) takes it from here, on the key's row in lease.leases,
 * which it holds locked: that row is the key's one epoch counter, for its
 * exclusive grants and its permits alike (I1).
 */
CREATE OR REPLACE FUNCTION lease._next_epoch(p_epoch bigint)
    RETURNS bigint
    LANGUAGE sql
    IMMUTABLE PARALLEL SAFE
RETURN p_epoch + 1;

REVOKE ALL ON FUNCTION lease._next_epoch(bigint) FROM PUBLIC;

/*
 * lease._refusal_of: why a call presenting (owner, epoch) at server time at
 * does not match the row (held_by, held_epoch, held_until), in the
 * contract's order, the first failing check deciding (I8):
 *   not_owner       no row, row free, or another owner (even if lapsed)
 *   lapsed          the caller's grant has expired
 *   epoch_mismatch  the caller's live grant has another epoch
 * NULL when it matches.  IS DISTINCT FROM makes a NULL epoch a refusal.
 */
CREATE OR REPLACE FUNCTION lease._refusal_of(
    p_held_by    text,
    p_held_epoch bigint,
    p_held_until timestamptz,
    p_owner      text,
    p_epoch      bigint,
    p_at         timestamptz)
    RETURNS text
    LANGUAGE sql
    IMMUTABLE PARALLEL SAFE
RETURN CASE
    WHEN p_held_by IS NULL OR p_held_by <> p_owner COLLATE pg_catalog."C" THEN 'not_owner'
    WHEN NOT lease._is_live(p_held_by, p_held_until, p_at) THEN 'lapsed'
    WHEN p_held_epoch IS DISTINCT FROM p_epoch THEN 'epoch_mismatch'
END;

REVOKE ALL ON FUNCTION lease._refusal_of(text, bigint, timestamptz, text, bigint, timestamptz) FROM PUBLIC;

/*
 * lease._has_negative_field(interval): true when the months, days or time
 * field of the interval is negative.
 *
 * Interval comparison treats a month as 30 days, so '1 month -29 days' is
 * greater than zero, yet added to 2023-02-01 it yields 2023-01-31: a lease
 * granted with it would expire before it was granted.  §3 therefore reads
 * "positive" (ttl) and "not negative" (wait, older_than) as: no field is
 * negative, and for ttl at least one is positive.  Then server time +
 * interval is never earlier than server time, on any date and in any time
 * zone.  The caller must pass a finite interval: on PostgreSQL 17+
 * subtracting infinite intervals raises an error.
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
 * lease._text_problem(name, value): what is wrong with a key, owner or
 * prefix, as a DETAIL phrase, or NULL.  Emptiness is tested by length, not
 * by "= ''", so that no collation can make a non-empty string look empty.
 */
CREATE OR REPLACE FUNCTION lease._text_problem(p_name text, p_value text)
    RETURNS text
    LANGUAGE sql
    IMMUTABLE PARALLEL SAFE
RETURN CASE
    WHEN p_value IS NULL OR pg_catalog.octet_length(p_value) = 0
        THEN pg_catalog.format(lease._message('empty'), p_name)
    WHEN pg_catalog.octet_length(p_value) > lease._max_bytes()
        THEN pg_catalog.format(lease._message('too_long'), p_name, lease._max_bytes())
END;

REVOKE ALL ON FUNCTION lease._text_problem(text, text) FROM PUBLIC;

/*
 * lease._interval_problem(name, value, positive): what is wrong with an
 * interval argument, or NULL.  positive: ttl (greater than zero); otherwise
 * zero is allowed (wait, older_than).  isfinite(interval) exists on every
 * supported version; before 17 no interval is infinite.
 */
CREATE OR REPLACE FUNCTION lease._interval_problem(p_name text, p_value interval, p_positive boolean)
    RETURNS text
    LANGUAGE sql
    IMMUTABLE PARALLEL SAFE
RETURN CASE
    WHEN p_value IS NULL OR NOT pg_catalog.isfinite(p_value)
         OR (p_positive AND p_value <= interval '0')
         -- Only a finite interval reaches _has_negative_field (CASE order).
         OR CASE WHEN pg_catalog.isfinite(p_value) THEN lease._has_negative_field(p_value) END
        THEN pg_catalog.format(lease._message(CASE WHEN p_positive THEN 'not_positive' ELSE 'negative' END), p_name)
    WHEN p_value > lease._max_interval()
        THEN pg_catalog.format(lease._message('too_far'), p_name, lease._max_years())
END;

REVOKE ALL ON FUNCTION lease._interval_problem(text, interval, boolean) FROM PUBLIC;

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
 * lease._validate: the input check of every call (§3, §10 batches, §4 list
 * and purge).  p_call names the API function and decides which arguments
 * apply; the others are ignored.  A scalar call passes its key as a
 * one-element array (ARRAY[key]) and its epoch likewise.
 *
 * It raises one 22023 error whose DETAIL lists every violated rule, in
 * argument order, joined with "; ", and whose HINT describes the call's
 * arguments; or returns when the input is valid.  Batch elements are named
 * by their subscripts as passed (keys[3]); a duplicate names both (keys[4]
 * repeats keys[1]); keys are compared by bytes, as the table compares them.
 *
 * The API calls it only when a fast test (lease._is_plain_*) did not prove
 * the input valid, so its cost is paid by unusual or invalid input only.
 */
CREATE OR REPLACE FUNCTION lease._validate(
    p_call        text,
    p_keys        text[],
    p_owner       text DEFAULT NULL,
    p_epochs      bigint[] DEFAULT NULL,
    p_ttl         interval DEFAULT NULL,
    p_wait        interval DEFAULT NULL,
    p_older_than  interval DEFAULT NULL,
    p_limit       bigint DEFAULT NULL,
    p_held_only   boolean DEFAULT NULL,
    p_skip_locked boolean DEFAULT false)
    RETURNS void
    LANGUAGE plpgsql
    IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    -- A caller's nondeterministic collation reaches every text parameter
    -- (PL/pgSQL takes the call's input collation), and substring searches
    -- refuse those.
    v_batch      CONSTANT boolean := pg_catalog.right(p_call COLLATE pg_catalog."C", 5) = '_many';
    v_single     CONSTANT text := pg_catalog.replace(p_call COLLATE pg_catalog."C", '_many', '');
    v_max_keys   CONSTANT integer := lease._max_keys();
    v_problems   text[] := ARRAY[]::text[];
    v_empty      integer[];
    v_long       integer[];
    v_repeats    text[];
    v_nulls      integer[];
    v_hint       text;
BEGIN
    IF p_call = 'list' THEN
        -- p_keys[1] is the prefix: NULL (every key) or at most _max_bytes.
        IF pg_catalog.octet_length(p_keys[1]) > lease._max_bytes() THEN
            v_problems := v_problems
                || pg_catalog.format(lease._message('too_long'), 'prefix', lease._max_bytes());
        END IF;
        IF p_held_only IS NULL THEN
            v_problems := v_problems || pg_catalog.format(lease._message('null'), 'held_only');
        END IF;
        v_hint := pg_catalog.format(
            'prefix is NULL or a string of at most %s bytes; held_only is true or false.',
            lease._max_bytes());
    ELSIF p_call = 'purge' THEN
        v_problems := v_problems || lease._interval_problem('older_than', p_older_than, false);
        IF p_limit < 1 THEN
            v_problems := v_problems || 'limit must be at least 1'::text;
        END IF;
        v_hint := pg_catalog.format(
            'older_than is a finite interval without negative fields, at most %s years; limit is NULL or positive.',
            lease._max_years());
    ELSE
        IF NOT v_batch THEN
            v_problems := v_problems || lease._text_problem('key', p_keys[1]);
        ELSIF p_keys IS NULL THEN
            v_problems := v_problems || pg_catalog.format(lease._message('null'), 'keys');
        ELSIF pg_catalog.cardinality(p_keys) = 0 THEN
            v_problems := v_problems || 'keys must not be empty'::text;
        ELSIF pg_catalog.array_ndims(p_keys) <> 1 THEN
            v_problems := v_problems || 'keys must be a one-dimensional array'::text;
        ELSIF pg_catalog.cardinality(p_keys) > v_max_keys THEN
            v_problems := v_problems
                || pg_catalog.format('keys must have at most %s elements, not %s',
                                     v_max_keys, pg_catalog.cardinality(p_keys));
        ELSE
            SELECT pg_catalog.array_agg(s.i ORDER BY s.i)
                       FILTER (WHERE s.k IS NULL OR pg_catalog.octet_length(s.k) = 0),
                   pg_catalog.array_agg(s.i ORDER BY s.i)
                       FILTER (WHERE pg_catalog.octet_length(s.k) > lease._max_bytes()),
                   pg_catalog.array_agg(pg_catalog.format('keys[%s] repeats keys[%s]', s.i, s.first) ORDER BY s.i)
                       FILTER (WHERE s.i > s.first AND pg_catalog.octet_length(s.k) > 0)
              INTO v_empty, v_long, v_repeats
              FROM (SELECT g.i, p_keys[g.i] AS k,
                           pg_catalog.min(g.i) OVER (PARTITION BY p_keys[g.i] COLLATE pg_catalog."C") AS first
                      FROM pg_catalog.generate_subscripts(p_keys, 1) AS g(i)) AS s;
            IF v_empty IS NOT NULL THEN
                v_problems := v_problems
                    || ('each key must be a non-empty string: ' || lease._subscripts('keys', v_empty));
            END IF;
            IF v_long IS NOT NULL THEN
                v_problems := v_problems
                    || (pg_catalog.format('each key must be at most %s bytes: ', lease._max_bytes())
                        || lease._subscripts('keys', v_long));
            END IF;
            IF v_repeats IS NOT NULL THEN
                v_problems := v_problems
                    || ('keys must be distinct: '
                        || pg_catalog.array_to_string(v_repeats[1:10], ', ')
                        || CASE WHEN pg_catalog.cardinality(v_repeats) > 10
                                THEN pg_catalog.format(' and %s more', pg_catalog.cardinality(v_repeats) - 10)
                                ELSE '' END);
            END IF;
        END IF;

        IF v_single IN ('acquire', 'renew', 'release') THEN
            v_problems := v_problems || lease._text_problem('owner', p_owner);
        END IF;

        IF p_call IN ('renew', 'release', 'fence') THEN
            IF p_epochs[1] IS NULL THEN
                v_problems := v_problems || pg_catalog.format(lease._message('null'), 'epoch');
            END IF;
        ELSIF p_call IN ('renew_many', 'release_many') THEN
            IF p_epochs IS NULL THEN
                v_problems := v_problems || pg_catalog.format(lease._message('null'), 'epochs');
            ELSIF pg_catalog.cardinality(p_epochs) > 0 AND pg_catalog.array_ndims(p_epochs) <> 1 THEN
                v_problems := v_problems || 'epochs must be a one-dimensional array'::text;
            ELSE
                IF pg_catalog.array_ndims(p_keys) = 1
                   AND pg_catalog.cardinality(p_epochs) <> pg_catalog.cardinality(p_keys) THEN
                    v_problems := v_problems
                        || pg_catalog.format('epochs must have as many elements as keys (%s, not %s)',
                                             pg_catalog.cardinality(p_keys), pg_catalog.cardinality(p_epochs));
                END IF;
                SELECT pg_catalog.array_agg(g.i ORDER BY g.i) FILTER (WHERE p_epochs[g.i] IS NULL)
                  INTO v_nulls
                  FROM pg_catalog.generate_subscripts(p_epochs, 1) AS g(i);
                IF v_nulls IS NOT NULL THEN
                    v_problems := v_problems
                        || ('each epoch must not be null: ' || lease._subscripts('epochs', v_nulls));
                END IF;
            END IF;
        END IF;

        IF v_single IN ('acquire', 'renew') THEN
            v_problems := v_problems || lease._interval_problem('ttl', p_ttl, true);
        END IF;
        IF p_call = 'renew_many' AND p_skip_locked IS NULL THEN
            v_problems := v_problems || pg_catalog.format(lease._message('null'), 'skip_locked');
        END IF;
        IF p_call IN ('acquire', 'watch') THEN
            v_problems := v_problems || lease._interval_problem('wait', p_wait, false);
        END IF;
        IF p_call = 'set_limit' AND NOT p_limit BETWEEN 1 AND lease._max_permits() THEN
            v_problems := v_problems
                || pg_catalog.format('limit must be NULL or from 1 to %s', lease._max_permits());
        END IF;

        v_hint := CASE
            WHEN v_batch THEN
                pg_catalog.format('keys is a one-dimensional array of 1 to %s distinct keys', v_max_keys)
                || CASE WHEN v_single = 'acquire' THEN '' ELSE ', epochs one epoch per key, none NULL' END
                || pg_catalog.format('; key and owner are non-empty strings of at most %s bytes', lease._max_bytes())
                || CASE WHEN v_single = 'release' THEN '.'
                        ELSE pg_catalog.format('; ttl is a positive finite interval of at most %s years.',
                                               lease._max_years()) END
            WHEN p_call IN ('inspect', 'holders') THEN
                pg_catalog.format(lease._message('hint_key'), lease._max_bytes())
            WHEN p_call = 'set_limit' THEN
                pg_catalog.format('key is a non-empty string of at most %s bytes; '
                                  'limit is NULL (an exclusive key) or a number of permits from 1 to %s.',
                                  lease._max_bytes(), lease._max_permits())
            WHEN p_call = 'fence' THEN
                pg_catalog.format('key is a non-empty string of at most %s bytes; epoch is the one acquire returned.',
                                  lease._max_bytes())
            WHEN p_call = 'release' THEN
                pg_catalog.format(lease._message('hint_release'), lease._max_bytes())
            WHEN p_call = 'watch' THEN
                pg_catalog.format('key is a non-empty string of at most %s bytes; '
                                  'wait is a finite interval, at most %s years, without negative fields.',
                                  lease._max_bytes(), lease._max_years())
            ELSE
                pg_catalog.format(lease._message('hint_grant'), lease._max_bytes(), lease._max_years())
        END;
    END IF;

    -- The *_problem helpers give NULL for a valid argument.
    v_problems := pg_catalog.array_remove(v_problems, NULL);
    IF pg_catalog.cardinality(v_problems) > 0 THEN
        RAISE EXCEPTION 'pg_lease: invalid input'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = pg_catalog.array_to_string(v_problems, '; '),
                  HINT = v_hint;
    END IF;
END;
$function$;

REVOKE ALL ON FUNCTION lease._validate(text, text[], text, bigint[], interval, interval, interval, bigint, boolean, boolean) FROM PUBLIC;

/*
 * lease._begin_write: the precondition of every call that writes, on the
 * transaction it runs in (§5).
 *
 * Read-only transactions, which include every transaction on a hot standby,
 * are refused.  renew and release would fail there anyway, at their UPDATE.
 * acquire would not always: a denied or same-owner acquire writes nothing,
 * so on a lagging standby it could confirm a grant that the primary has
 * already released and handed on.  Failing closed keeps one answer
 * everywhere: the writing API runs on the primary only.  inspect and list
 * stay available, being advisory.
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
 * writing, lease._begin_write and the owner binding (90-owner-binding.sql).
 * So they decide how fast a call is, never what it does.
 *
 * Why: every API call is usually a transaction of its own, and PL/pgSQL
 * builds the executor state of every expression it evaluates once per
 * transaction.  Those builds were the largest cost of a call beyond its
 * UPDATE, so the tests on the common path are kept few and small.
 *
 * What is tested when:
 *   - before any write: what the write would store unchecked (ttl), what
 *     picks the branch (wait) and the transaction (lease._is_plain_session);
 *   - only once the guarded UPDATE has matched nothing: key, owner and
 *     epoch.  A matching UPDATE proves them valid: the row it matched holds
 *     this key and owner byte for byte, and the table's domains keep every
 *     stored key and owner within 1 to _max_bytes bytes; it holds this
 *     epoch, so the epoch is not NULL.  The owner that acquire writes is
 *     checked by those same domains (acquire turns their error into
 *     lease._validate's); a NULL owner, which a domain lets through, never
 *     takes acquire's fast path.
 *
 * lease._is_plain_text: 1 to _max_bytes bytes.  A NULL gives NULL, which
 * the callers treat as "not plainly valid".
 */
CREATE OR REPLACE FUNCTION lease._is_plain_text(p_value text)
    RETURNS boolean
    LANGUAGE sql
    IMMUTABLE PARALLEL SAFE
RETURN pg_catalog.octet_length(p_value) BETWEEN 1 AND lease._max_bytes();

REVOKE ALL ON FUNCTION lease._is_plain_text(text) FROM PUBLIC;

/*
 * lease._is_plain_ttl: a time-only interval (no months, no days) greater
 * than zero and at most _max_interval, hence no negative field.  A ttl with
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
   AND p_ttl <= lease._max_interval()
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
