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
 *   - Counted keys (§13) are refused with 0A000 before anything is done
 *     (lease._refuse_counted): a permit's grant locks the key's row that
 *     every grant of the key needs, and a batch would hold that lock until
 *     its transaction ends, stalling every other holder's grant behind it.
 *     A key made counted while the batch runs is treated as the single
 *     call treats it.
 *
 * renew_many(keys, owner, epochs, ttl, skip_locked => true) skips keys
 * whose row another transaction has locked instead of waiting for them
 * (§12): see lease._renew_unless_locked below.
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
    PERFORM lease._refuse_counted('acquire_many', p_keys);
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

/*
 * lease._renew_unless_locked: one key of renew_many(..., p_skip_locked =>
 * true) (§12).  The answer is lease.renew's, except where renew would wait
 * for a row another transaction holds locked (a fenced transaction of the
 * holder, a renew or release in progress, a purge): that key is 'locked',
 * with nothing changed and expires_at NULL, at once.  A caller renews it
 * again on its own, with lease.renew, which may wait for the lock; the
 * other keys of the batch need not wait with it.
 *
 *   - The probe locks the row renew would lock, the caller's live grant
 *     under p_epoch, FOR NO KEY UPDATE SKIP LOCKED, the lock renew's UPDATE
 *     takes, so lease.renew then never waits for it.  It conflicts with
 *     every lock that would make renew wait (FOR SHARE of a fence, FOR NO
 *     KEY UPDATE, FOR UPDATE, an UPDATE or DELETE), and not with locks of
 *     the caller's own transaction, which renew does not wait for either.
 *     Under READ COMMITTED a row version that a committed transaction
 *     replaced is followed to the newest one, as for renew.
 *   - A row that is not the caller's live grant is neither locked nor
 *     waited for, by the probe as by renew: the key gets renew's refusal
 *     (not_owner for a key with no row), and a caller never locks another
 *     owner's row, with owners bound to roles or not.
 *   - SKIP LOCKED returns nothing for a locked row and for a row that does
 *     not match alike; a match the statement's snapshot still shows is the
 *     locked one.
 *   - The probe's lock must not outlive a refusal (§12, "A refusal keeps no
 *     lock"): probe and renew run in one subtransaction, rolled back (PLL02)
 *     unless renew answered ok.  Renew changes nothing when it refuses, so
 *     the rollback undoes only the probe's lock.
 *   - Under REPEATABLE READ or SERIALIZABLE locking a row that changed
 *     since the snapshot raises 40001 even where renew would have answered
 *     from the snapshot without touching the row (a grant released or
 *     taken over since).  The probe's 40001 is therefore caught and the key
 *     gets what lease.renew answers; renew's own 40001 is raised as is.
 *   - Keys are probed in the batch's key order.  A batch that skips locked
 *     rows never waits for a row lock, so it takes part in no deadlock.
 *   - The cost: a renewed key keeps two subtransactions (the probe's and
 *     renew's) instead of one, so such a batch overflows the subtransaction
 *     cache of its transaction above 32 renewed keys, not 64.
 *
 * renew_many has validated the arrays, and checked the transaction and the
 * owner binding as lease.renew does, before any probe takes a lock.
 */
CREATE OR REPLACE FUNCTION lease._renew_unless_locked(
    p_key   text,
    p_owner text,
    p_epoch bigint,
    p_ttl   interval)
    RETURNS TABLE (status text, expires_at timestamptz)
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
    ROWS 1
AS $function$
DECLARE
    v_probed boolean := false;
BEGIN
    BEGIN
        PERFORM FROM lease.leases AS l
          WHERE l.key = p_key COLLATE pg_catalog."C"
            AND l.owner = p_owner COLLATE pg_catalog."C"
            AND l.epoch = p_epoch
            AND lease._is_live(l.owner, l.expires_at, pg_catalog.clock_timestamp())
            FOR NO KEY UPDATE SKIP LOCKED;
        v_probed := true;
        IF NOT FOUND
           AND EXISTS (SELECT FROM lease.leases AS l
                        WHERE l.key = p_key COLLATE pg_catalog."C"
                          AND l.owner = p_owner COLLATE pg_catalog."C"
                          AND l.epoch = p_epoch
                          AND lease._is_live(l.owner, l.expires_at, pg_catalog.clock_timestamp())) THEN
            status := 'locked';
        ELSE
            SELECT r.status, r.expires_at INTO status, expires_at
              FROM lease.renew(p_key, p_owner, p_epoch, p_ttl) AS r;
        END IF;
        IF status = 'ok' THEN
            RETURN NEXT;
            RETURN;
        END IF;
        -- Refused or locked: give the probe's lock back.
        RAISE EXCEPTION USING ERRCODE = 'PLL02';
    EXCEPTION
        WHEN SQLSTATE 'PLL02' THEN
            NULL;
        WHEN serialization_failure THEN
            IF v_probed THEN
                RAISE;
            END IF;
            SELECT r.status, r.expires_at INTO status, expires_at
              FROM lease.renew(p_key, p_owner, p_epoch, p_ttl) AS r;
    END;
    RETURN NEXT;
END;
$function$;

REVOKE ALL ON FUNCTION lease._renew_unless_locked(text, text, bigint, interval) FROM PUBLIC;

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
    PERFORM lease._refuse_counted('renew_many', p_keys);
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

/*
 * renew_many(keys, owner, epochs, ttl, skip_locked) (§12): with
 * skip_locked false, the four-argument renew_many; with true, each key is
 * lease._renew_unless_locked's, so a key whose row another transaction has
 * locked is answered 'locked' instead of waited for.  It is an overload, not
 * a parameter with a default added to the four-argument function: that
 * would change the signature of 0.2.0, which an update could replace only by
 * dropping it, and any role can pin a function (a view that calls it needs no
 * EXECUTE on it) and so make the update fail, or lose its objects to CASCADE.
 */
CREATE OR REPLACE FUNCTION lease.renew_many(
    p_keys        text[],
    p_owner       text,
    p_epochs      bigint[],
    p_ttl         interval,
    p_skip_locked boolean)
    RETURNS TABLE (key text, status text, expires_at timestamptz)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    IF NOT p_skip_locked THEN
        RETURN QUERY
            SELECT r.key, r.status, r.expires_at
              FROM lease.renew_many(p_keys, p_owner, p_epochs, p_ttl) AS r;
        RETURN;
    END IF;
    PERFORM lease._validate('renew_many', p_keys, p_owner, p_epochs, p_ttl => p_ttl,
                            p_skip_locked => p_skip_locked);
    PERFORM lease._refuse_counted('renew_many', p_keys);
    -- What lease.renew checks before it looks at a key, checked before the
    -- first probe locks one: a call that renew refuses takes no lock.
    PERFORM lease._begin_write('renew');
    PERFORM lease._act_for(p_owner);
    RETURN QUERY
        SELECT i.k, r.status, r.expires_at
          FROM (SELECT u.k, u.e, u.n
                  FROM ROWS FROM (pg_catalog.unnest(p_keys), pg_catalog.unnest(p_epochs)) WITH ORDINALITY AS u(k, e, n)
                 ORDER BY u.k COLLATE pg_catalog."C"
                OFFSET 0) AS i
          CROSS JOIN LATERAL lease._renew_unless_locked(i.k, p_owner, i.e, p_ttl) AS r
         ORDER BY i.n;
END;
$function$;

COMMENT ON FUNCTION lease.renew_many(text[], text, bigint[], interval, boolean) IS
    'renew_many(keys, owner, epochs, ttl, p_skip_locked): with p_skip_locked => false the four-argument renew_many; '
    'with p_skip_locked => true a key whose row another transaction has locked is answered (key, locked, NULL), nothing changed, instead of waited for';

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
    PERFORM lease._refuse_counted('release_many', p_keys);
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
