/*
 * Batches (§4 batches, §10 batches): lease.acquire_many, lease.renew_many,
 * lease.release_many.  Per key, each gives exactly what the single call
 * gives on the same state, because for each key it is the single call: a
 * batch checks its arrays once (lease._validate) and then calls
 * lease.acquire (wait 0), lease.renew or lease.release for every key.  So a
 * batch has no rule of its own about states, epochs, the epoch floor,
 * refusals, isolation, durability or owner binding.
 *
 *   - The keys are visited in byte order (COLLATE "C"): every batch locks
 *     rows in that one order, so two batches never deadlock each other,
 *     whatever order their callers listed the keys in.  The statement's
 *     outer scan is the sorted keys, and each call is made for one row of
 *     it (a lateral function scan), in that order.
 *   - The result has one row per key, in the order of the input array.
 *   - A batch is one statement of the caller's transaction: one round trip
 *     and one commit for up to lease._max_keys() keys, and it commits or
 *     rolls back as a whole.
 *   - Each statement is an index lookup of one key: a batch reads only its
 *     own keys' rows, whatever the table's size, with the server's default
 *     planner settings (no switch, no JIT: its cost estimate is small).
 *
 * Measured against the set-based statements of 0.2.0 (bench/ANALYSIS.md,
 * "Batches"), a key costs about the same; a single call per key also keeps
 * each statement routable to one shard on Citus.  Every single call that
 * writes uses a subtransaction, so a batch of more than 64 keys overflows
 * the subtransaction cache of its transaction, as the README notes.
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
AS $function$
BEGIN
    PERFORM lease._validate('acquire_many', p_keys, p_owner, p_ttl => p_ttl);
    RETURN QUERY
        SELECT i.k, a.acquired, a.epoch, a.expires_at
          FROM (SELECT u.k, u.n
                  FROM pg_catalog.unnest(p_keys) WITH ORDINALITY AS u(k, n)
                 ORDER BY u.k COLLATE pg_catalog."C"
                OFFSET 0) AS i
          CROSS JOIN LATERAL lease.acquire(i.k, p_owner, p_ttl) AS a
         ORDER BY i.n;
END;
$function$;

COMMENT ON FUNCTION lease.acquire_many(text[], text, interval) IS
    'acquire_many(keys, owner, ttl): lease.acquire(key, owner, ttl) (no wait) for each of up to 10000 distinct keys in one statement; '
    'one row (key, acquired, epoch, expires_at) per key, in input order; rows are locked in key order (COLLATE "C")';

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
    PERFORM lease._validate('renew_many', p_keys, p_owner, p_epochs, p_ttl => p_ttl);
    RETURN QUERY
        SELECT i.k, r.status, r.expires_at
          FROM (SELECT u.k, u.e, u.n
                  FROM ROWS FROM (pg_catalog.unnest(p_keys), pg_catalog.unnest(p_epochs)) WITH ORDINALITY AS u(k, e, n)
                 ORDER BY u.k COLLATE pg_catalog."C"
                OFFSET 0) AS i
          CROSS JOIN LATERAL lease.renew(i.k, p_owner, i.e, p_ttl) AS r
         ORDER BY i.n;
END;
$function$;

COMMENT ON FUNCTION lease.renew_many(text[], text, bigint[], interval) IS
    'renew_many(keys, owner, epochs, ttl): lease.renew(keys[i], owner, epochs[i], ttl) for each of up to 10000 distinct keys in one statement; '
    'one row (key, status, expires_at) per key, in input order; rows are locked in key order (COLLATE "C")';

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
    PERFORM lease._validate('release_many', p_keys, p_owner, p_epochs);
    RETURN QUERY
        SELECT i.k, r.status
          FROM (SELECT u.k, u.e, u.n
                  FROM ROWS FROM (pg_catalog.unnest(p_keys), pg_catalog.unnest(p_epochs)) WITH ORDINALITY AS u(k, e, n)
                 ORDER BY u.k COLLATE pg_catalog."C"
                OFFSET 0) AS i
          CROSS JOIN LATERAL lease.release(i.k, p_owner, i.e) AS r
         ORDER BY i.n;
END;
$function$;

COMMENT ON FUNCTION lease.release_many(text[], text, bigint[]) IS
    'release_many(keys, owner, epochs): lease.release(keys[i], owner, epochs[i]) for each of up to 10000 distinct keys in one statement; '
    'one row (key, status) per key, in input order; rows are locked in key order (COLLATE "C")';
