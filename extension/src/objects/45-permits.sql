/*
 * Counted keys (0.3.0, §13): lease.set_limit, the grant of a permit,
 * lease.holders, and what inspect, watch, list and fence read of a counted
 * key.  Shared grants (lease.acquire_shared) are permits of a key in its
 * shared phase (permit_limit 0): everything below holds for them too.
 *
 * A counted key is a row of lease.leases with permit_limit set; its owner
 * and expires_at stay NULL, and its epoch is the key's one epoch counter:
 * the epoch of its latest permit.  Each permit is a row of lease.permits
 * (key, owner, epoch, expires_at), live by lease._is_live like an exclusive
 * grant, renewed and released by the body that renews and releases the
 * key's row (40-renew-release.sql: lease._renew_permit and
 * lease._release_permit are made from it).  Only lease._acquire_permit
 * grants one, holding the key's row locked, taking the epoch from it with
 * lease._next_epoch.
 *
 * The count (lease._count_permits).  A grant, or lease.set_limit, locks the
 * key's row (FOR NO KEY UPDATE), reads the clock, deletes the key's permits
 * that are not live then, and counts the rest.  A renew or release of a permit locks that permit's row, and a
 * fenced transaction holds it FOR SHARE; the DELETE waits for either and
 * then decides on the newest version.  A renew writes only a permit live
 * when it took the row's lock, so a permit the grant did not delete is one
 * that was live at its clock reading or renewed before it lapsed: counted.
 * A permit the DELETE took is gone for the renew too (refused, not_owner).
 * New permits need the key's row lock, which the grant holds, so the count
 * is exact for the rest of the grant, or too high by permits that lapse
 * meanwhile, which only denies.
 */

/*
 * Durable like the key's rows (20-durability.sql): a permit's grant and its
 * renewals.  A release deletes, and is not forced: lost in a crash, the
 * permit comes back and lapses on its own, which denies more, never less.
 */
DROP TRIGGER IF EXISTS permits_durable_commit ON lease.permits;
CREATE CONSTRAINT TRIGGER permits_durable_commit
    AFTER INSERT OR UPDATE ON lease.permits
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION lease._durable_commit();
ALTER TABLE lease.permits ENABLE ALWAYS TRIGGER permits_durable_commit;

REVOKE ALL ON TABLE lease.permits FROM PUBLIC;

COMMENT ON TABLE lease.permits IS
    'pg_lease internal state: one row per permit of a counted key or shared grant of a key; use the lease.* functions, never this table';

/*
 * lease._count_permits(key, owner, at, room): the count (see above), the
 * one place it is made, by a caller that holds the key's row locked (FOR NO
 * KEY UPDATE) and read the clock (at) once it held it: the grant of a permit,
 * of a shared grant or of the exclusive grant of a key in its shared phase
 * (lease._acquire_permit), and lease.set_limit.  Deletes the key's permits
 * that are not live at at and returns how many are left (live) and how many
 * of those are owner's (owned, 0 or 1).
 *
 * A lapsed permit that another transaction holds locked (a fenced
 * transaction's FOR SHARE, a renew or release not yet committed) is waited
 * for: a renewal made in an open transaction before it lapsed makes it live,
 * and a plain read would see it lapsed, and a later statement that trusted
 * that read would act on a live permit (a DELETE of it, a grant beside it).
 * A grant passes room, the count it must stay below: it first sweeps only
 * the lapsed permits nobody holds, counts the locked ones as taken, and
 * waits only when it needs one of their places (the count reaches room, or
 * one is owner's own), so a fenced lapsed permit holds up only the grants
 * that need its place (§13).  lease.set_limit passes no room and always
 * waits: it reports the exact count.
 */
CREATE OR REPLACE FUNCTION lease._count_permits(
    p_key   text,
    p_owner text,
    p_at    timestamptz,
    p_room  integer,
    OUT live  integer,
    OUT owned integer)
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    v_held_lapsed integer;
    v_own_lapsed  integer;
BEGIN
    IF p_room IS NOT NULL THEN
        DELETE FROM lease.permits AS p
         WHERE p.key = p_key COLLATE pg_catalog."C"
           AND p.owner IN (SELECT q.owner
                             FROM lease.permits AS q
                            WHERE q.key = p_key COLLATE pg_catalog."C"
                              AND NOT lease._is_live(q.owner, q.expires_at, p_at)
                              FOR UPDATE SKIP LOCKED);
        SELECT pg_catalog.count(*),
               pg_catalog.count(*) FILTER (WHERE p.owner = p_owner COLLATE pg_catalog."C"),
               pg_catalog.count(*) FILTER (WHERE NOT lease._is_live(p.owner, p.expires_at, p_at)),
               pg_catalog.count(*) FILTER (WHERE p.owner = p_owner COLLATE pg_catalog."C"
                                             AND NOT lease._is_live(p.owner, p.expires_at, p_at))
          INTO live, owned, v_held_lapsed, v_own_lapsed
          FROM lease.permits AS p
         WHERE p.key = p_key COLLATE pg_catalog."C";
        IF v_held_lapsed = 0 OR (live < p_room AND v_own_lapsed = 0) THEN
            RETURN;
        END IF;
    END IF;
    DELETE FROM lease.permits AS p
     WHERE p.key = p_key COLLATE pg_catalog."C"
       AND NOT lease._is_live(p.owner, p.expires_at, p_at);
    SELECT pg_catalog.count(*),
           pg_catalog.count(*) FILTER (WHERE p.owner = p_owner COLLATE pg_catalog."C")
      INTO live, owned
      FROM lease.permits AS p
     WHERE p.key = p_key COLLATE pg_catalog."C";
END;
$function$;

REVOKE ALL ON FUNCTION lease._count_permits(text, text, timestamptz, integer) FROM PUBLIC;

/*
 * lease._acquire_permit(key, owner, ttl, shared): a grant on a key that has
 * permits (§13), after the caller has checked the input and the transaction.
 * Three grants share this one body, so that each rule is written once:
 *
 *   shared false, counted key (permit_limit >= 1): one of its permits
 *     (lease.acquire);
 *   shared false, key in its shared phase (permit_limit 0): the exclusive
 *     grant, once no shared grant is live (lease.acquire);
 *   shared true: a shared grant (lease.acquire_shared), on a key never
 *     granted, an exclusive key whose grant is not live (which enters its
 *     shared phase), or a key in its shared phase; refused (0A000) on a
 *     counted key; denied while an exclusive acquirer waits
 *     (lease._exclusive_waits).
 *
 *   1. The caller's own live permit or shared grant comes back unchanged
 *      (I4) when it is of the kind asked for, with the same confirmation
 *      as an exclusive grant under REPEATABLE READ, SERIALIZABLE or
 *      synchronous standbys (30-acquire.sql, step 2).
 *   2. A look without a lock: a full key, or a live grant of the other
 *      mode, denies at once, so a denial takes no lock and writes nothing.
 *   3. Under the key's row lock, in a subtransaction rolled back (PLL01)
 *      unless it grants: the row of a key never granted (a shared grant's
 *      first), the count (see above), then the key's next epoch and the
 *      permit's row (or, for the exclusive grant, the key's row).
 */
CREATE OR REPLACE FUNCTION lease._acquire_permit(
    p_key    text,
    p_owner  text,
    p_ttl    interval,
    p_shared boolean)
    RETURNS TABLE (acquired boolean, epoch bigint, expires_at timestamptz)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    ROWS 1
AS $function$
DECLARE
    v_now        timestamptz;
    v_found      boolean;
    v_limit      integer;
    v_holder     text;
    v_held_until timestamptz;
    v_count      integer;
    v_room       integer;
    v_epoch      bigint;
    v_first      bigint;
    v_expires_at timestamptz;
    v_confirmed  boolean;
    v_rounds     integer := 0;
BEGIN
    LOOP
        v_rounds := v_rounds + 1;
        SELECT l.permit_limit, l.owner, l.expires_at
          INTO v_limit, v_holder, v_held_until
          FROM lease.leases AS l
         WHERE l.key = p_key COLLATE pg_catalog."C";
        v_found := FOUND;
        IF p_shared AND v_limit > 0 THEN
            RAISE EXCEPTION 'pg_lease: key % is a counted key', lease._quoted(p_key)
                USING ERRCODE = 'feature_not_supported',
                      DETAIL = 'A counted key takes no shared grants.',
                      HINT = 'Acquire one of its permits with lease.acquire, or make it exclusive with lease.set_limit(key, NULL).';
        END IF;

        -- 1. The caller's own grant, when it is of the kind asked for.
        v_expires_at := NULL;
        IF v_limit > 0 OR (p_shared AND v_limit = 0) THEN
            SELECT p.epoch, p.expires_at
              INTO v_epoch, v_expires_at
              FROM lease.permits AS p
             WHERE p.key = p_key COLLATE pg_catalog."C"
               AND p.owner = p_owner COLLATE pg_catalog."C";
        END IF;
        IF lease._is_live(p_owner, v_expires_at, pg_catalog.clock_timestamp()) THEN
            v_confirmed := NULL;
            IF pg_catalog.current_setting('synchronous_standby_names') <> '' THEN
                -- Rewritten unchanged, so that this commit waits for the
                -- standby (§10 Durable commits).
                v_confirmed := false;
                BEGIN
                    UPDATE lease.permits AS p
                       SET epoch = p.epoch
                     WHERE p.key = p_key COLLATE pg_catalog."C"
                       AND p.owner = p_owner COLLATE pg_catalog."C"
                       AND p.epoch = v_epoch;
                    IF NOT FOUND THEN
                        RAISE EXCEPTION USING ERRCODE = 'PLL01';
                    END IF;
                    v_confirmed := true;
                EXCEPTION
                    WHEN SQLSTATE 'PLL01' THEN
                        NULL;
                END;
            ELSIF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
                PERFORM FROM lease.permits AS p
                 WHERE p.key = p_key COLLATE pg_catalog."C"
                   AND p.owner = p_owner COLLATE pg_catalog."C"
                   FOR SHARE;
                v_confirmed := true;
            END IF;
            IF v_confirmed AND NOT lease._is_live(p_owner, v_expires_at, pg_catalog.clock_timestamp()) THEN
                RAISE EXCEPTION 'pg_lease: the permit lapsed while acquire waited for its row'
                    USING ERRCODE = 'serialization_failure',
                          HINT = 'Retry the transaction; acquire then makes a new grant.';
            END IF;
            IF v_confirmed IS NOT FALSE THEN
                acquired := true;
                epoch := v_epoch;
                expires_at := v_expires_at;
                RETURN NEXT;
                RETURN;
            END IF;
        END IF;

        -- 2. A look without a lock.  An exclusive acquire on a key that no
        -- longer has permits (lease.set_limit meanwhile) is denied here:
        -- lease.acquire then makes the exclusive grant.
        v_count := (SELECT pg_catalog.count(*)
                      FROM lease.permits AS p
                     WHERE p.key = p_key COLLATE pg_catalog."C"
                       AND lease._is_live(p.owner, p.expires_at, pg_catalog.clock_timestamp()));
        IF p_shared THEN
            EXIT WHEN v_found AND v_limit IS NULL
                      AND lease._is_live(v_holder, v_held_until, pg_catalog.clock_timestamp());
            EXIT WHEN v_count >= lease._max_permits();
        ELSE
            EXIT WHEN v_limit IS NULL OR v_count >= GREATEST(v_limit, 1);
        END IF;

        -- 3. The grant, under the key's row lock.
        BEGIN
            IF NOT v_found THEN
                -- A shared grant of a key never granted: its row first, free
                -- and in its shared phase, with the epoch a first grant
                -- would have had (as lease.set_limit makes a counted key's
                -- row).  In this subtransaction, so that a denial below (a
                -- waiting exclusive acquirer's mark, also one of a key whose
                -- hash collides) takes the row back: nothing written,
                -- nothing kept locked.  A concurrent first grant's row is
                -- locked below instead.
                SELECT lease._next_epoch(f.epoch) INTO v_first FROM lease.epoch_floor AS f;
                INSERT INTO lease.leases AS l (key, owner, epoch, expires_at, released_at, permit_limit)
                VALUES (p_key, NULL, v_first, NULL, pg_catalog.clock_timestamp(), 0)
                ON CONFLICT (key) DO NOTHING;
                IF FOUND THEN
                    PERFORM lease._first_grant_epoch(p_key, v_first);
                END IF;
            END IF;
            SELECT l.permit_limit, l.owner, l.expires_at
              INTO v_limit, v_holder, v_held_until
              FROM lease.leases AS l
             WHERE l.key = p_key COLLATE pg_catalog."C"
               FOR NO KEY UPDATE;
            -- lease.purge deleted the row meanwhile: look again.
            IF NOT FOUND THEN
                RAISE EXCEPTION USING ERRCODE = 'PLL01';
            END IF;
            v_now := pg_catalog.clock_timestamp();
            IF p_shared THEN
                -- A live exclusive grant (§13 shared and exclusive), a key
                -- made counted meanwhile, or a waiting exclusive acquirer
                -- (the no-starvation rule): denied.
                IF v_limit > 0 OR lease._is_live(v_holder, v_held_until, v_now)
                   OR lease._exclusive_waits(p_key) THEN
                    RAISE EXCEPTION USING ERRCODE = 'PLL01';
                END IF;
            ELSIF v_limit IS NULL THEN
                RAISE EXCEPTION USING ERRCODE = 'PLL01';
            END IF;
            -- The count this grant must stay below: the exclusive grant
            -- of a key in its shared phase needs it empty; a permit, fewer
            -- than the limit; a shared grant, fewer than the most a shared
            -- phase admits.
            v_room := CASE WHEN NOT p_shared AND v_limit = 0 THEN 1
                           ELSE COALESCE(NULLIF(v_limit, 0), lease._max_permits()) END;
            SELECT c.live, c.owned INTO v_count, v_epoch
              FROM lease._count_permits(p_key, p_owner, v_now, v_room) AS c;

            IF NOT p_shared AND v_limit = 0 THEN
                -- The exclusive grant of a key in its shared phase: only
                -- once no shared grant is live (the caller's own neither:
                -- a shared grant is not upgraded).  The key is exclusive
                -- again from here.
                IF v_count >= v_room THEN
                    RAISE EXCEPTION USING ERRCODE = 'PLL01';
                END IF;
                UPDATE lease.leases AS l
                   SET owner = p_owner,
                       epoch = lease._next_epoch(l.epoch),
                       expires_at = v_now + p_ttl,
                       watched_until = NULL,
                       permit_limit = NULL
                 WHERE l.key = p_key COLLATE pg_catalog."C"
                RETURNING true, l.epoch, l.expires_at INTO acquired, epoch, expires_at;
                RETURN NEXT;
                RETURN;
            END IF;

            -- Full, or the caller's own permit appeared meanwhile (step 1
            -- then returns it): nothing granted, nothing kept.  A shared
            -- phase admits up to lease._max_permits() shared grants.
            IF v_count >= v_room OR v_epoch > 0 THEN
                RAISE EXCEPTION USING ERRCODE = 'PLL01';
            END IF;
            -- A shared grant of an exclusive key whose grant is not live
            -- starts its shared phase: the lapsed grant no longer names
            -- the key (as lease.set_limit makes a key counted).
            UPDATE lease.leases AS l
               SET epoch = lease._next_epoch(l.epoch),
                   permit_limit = COALESCE(l.permit_limit, 0),
                   owner = NULL,
                   expires_at = NULL,
                   released_at = CASE WHEN l.permit_limit IS NULL AND l.owner IS NOT NULL
                                      THEN v_now ELSE l.released_at END
             WHERE l.key = p_key COLLATE pg_catalog."C"
            RETURNING l.epoch INTO v_epoch;
            INSERT INTO lease.permits AS p (key, owner, epoch, expires_at)
            VALUES (p_key, p_owner, v_epoch, v_now + p_ttl)
            RETURNING true, p.epoch, p.expires_at INTO acquired, epoch, expires_at;
            RETURN NEXT;
            RETURN;
        EXCEPTION
            WHEN SQLSTATE 'PLL01' THEN
                NULL;
        END;
        -- Once more when the key changed between the look and the lock.
        EXIT WHEN v_rounds >= 2;
    END LOOP;

    acquired := false;
    epoch := NULL;
    expires_at := NULL;
    RETURN NEXT;
END;
$function$;

REVOKE ALL ON FUNCTION lease._acquire_permit(text, text, interval, boolean) FROM PUBLIC;

/*
 * The no-starvation rule (§13 shared and exclusive).  An exclusive acquirer
 * that waits in the server (lease.acquire with wait > 0) and is denied
 * while the key is in its shared phase takes a transaction-level advisory
 * lock in exclusive mode on (lease._waiter_class(), hashtext(key)), kept
 * until its transaction ends.  A shared grant is made only when it can take
 * that lock in share mode, under the key's row lock, so no new shared grant
 * is made while an exclusive acquirer waits; the shared grants already
 * live lapse or are released, and the waiter takes the key.  Shared grants
 * hold the share lock till their transactions end and never deny each
 * other; a waiter queues for the lock for at most a second (never past
 * its deadline; 35-acquire-wait.sql) and tries again at its next poll, also
 * while a reader's open transaction keeps the key's row locked, and a second waiter
 * finds the first one's mark, which already holds readers off.
 *
 * The mark is a lock rather than a row because the waiter's writes are not
 * seen by anybody before its transaction ends, and a written row would stay
 * locked for all of the wait.  A lock is fresh exactly as long as the
 * waiter's transaction: a waiter that gives up, fails or dies leaves no mark
 * behind.  Two keys whose hashes collide, or a user's advisory lock on the
 * same pair, only deny shared grants more often, never grant more.
 */
CREATE OR REPLACE FUNCTION lease._waiter_class()
    RETURNS integer
    LANGUAGE sql
    IMMUTABLE PARALLEL SAFE
RETURN 1885826149; -- 'pgle' in ASCII

REVOKE ALL ON FUNCTION lease._waiter_class() FROM PUBLIC;

/*
 * lease._exclusive_waits(key): the shared grant's side.  Transaction-level,
 * like the key's row lock the shared grant holds anyway until its
 * transaction ends (or its subtransaction rolls back): a session-level lock
 * given back at once could be left behind by a cancel between taking and
 * giving it back, and would then hold off every shared grant of the key for
 * the rest of the session.
 */
CREATE OR REPLACE FUNCTION lease._exclusive_waits(p_key text)
    RETURNS boolean
    LANGUAGE sql
    VOLATILE
RETURN NOT pg_catalog.pg_try_advisory_xact_lock_shared(
    lease._waiter_class(), pg_catalog.hashtext(p_key COLLATE pg_catalog."C"));

REVOKE ALL ON FUNCTION lease._exclusive_waits(text) FROM PUBLIC;

/*
 * lease._mark_exclusive_wait(key): the waiter's side of the rule above.
 * Exclusive mode, so that shared grants, which take the lock in share mode,
 * do not deny one another.  It waits for the lock (for at most the caller's
 * lock_timeout): while this request is queued, PostgreSQL's lock manager
 * already refuses the share mode to any new try, so the readers whose
 * transactions are open finish and no new one begins; without the queue a
 * steady stream of readers, each holding the share lock until its commit,
 * could keep a waiter from ever marking.
 */
CREATE OR REPLACE FUNCTION lease._mark_exclusive_wait(p_key text)
    RETURNS void
    LANGUAGE sql
    VOLATILE
BEGIN ATOMIC
    SELECT pg_catalog.pg_advisory_xact_lock(
        lease._waiter_class(), pg_catalog.hashtext(p_key COLLATE pg_catalog."C"));
END;

REVOKE ALL ON FUNCTION lease._mark_exclusive_wait(text) FROM PUBLIC;

/*
 * lease.acquire_shared(key, owner, ttl, wait) (§13 shared and exclusive):
 * a shared grant of key to owner until server time + ttl.  Many owners may
 * hold a key shared at once, never beside an exclusive grant.  Each shared
 * grant is a row of lease.permits with its own expiry and epoch, renewed,
 * released and fenced through lease.renew, lease.release and lease.fence.
 * A name of its own, not a mode argument of lease.acquire: a second
 * signature of acquire would make calls with unknown-typed literals
 * ambiguous.  wait > 0 waits as acquire does (lease._acquire_wait).
 */
CREATE OR REPLACE FUNCTION lease.acquire_shared(
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
BEGIN
    IF (lease._is_plain_text(p_key) AND lease._is_plain_text(p_owner) AND lease._is_plain_ttl(p_ttl)
        AND lease._is_plain_zero(p_wait) AND lease._is_plain_session()
        AND NOT lease._owners_bound()) IS NOT TRUE THEN
        PERFORM lease._validate('acquire', ARRAY[p_key], p_owner, p_ttl => p_ttl, p_wait => p_wait);
        PERFORM lease._begin_write('acquire_shared');
        PERFORM lease._act_for(p_owner);
    END IF;
    IF lease._is_distributed() THEN
        RAISE EXCEPTION 'pg_lease: shared grants are not available on Citus'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Use exclusive keys on a distributed pg_lease.';
    END IF;
    IF p_wait <> interval '0' THEN
        RETURN QUERY
            SELECT w.acquired, w.epoch, w.expires_at
              FROM lease._acquire_wait(p_key, p_owner, p_ttl, p_wait, true) AS w;
        RETURN;
    END IF;
    RETURN QUERY
        SELECT a.acquired, a.epoch, a.expires_at
          FROM lease._acquire_permit(p_key, p_owner, p_ttl, true) AS a;
END;
$function$;

COMMENT ON FUNCTION lease.acquire_shared(text, text, interval, interval) IS
    'acquire_shared(key, owner, ttl, p_wait => 0): a shared grant of key to owner until server time + ttl, beside other shared holders, never beside an exclusive one; '
    'returns (acquired, epoch, expires_at); denied while an exclusive acquirer waits (acquire with wait > 0); 0A000 on a counted key; renew, release and fence it as an exclusive grant';

/*
 * lease.set_limit(key, limit) (§13): make key a counted key of limit
 * permits, change its limit, or (limit NULL) make it exclusive again.
 * Returns the key's limit and how many permits are live now.
 *
 *   - A key never granted gets its row, counted, with the epoch a first
 *     grant would have had (so its first permit has the next one).
 *   - An exclusive key becomes counted unless its grant is live (55006):
 *     the holder must release it or let it lapse first.
 *   - A counted key's limit changes at once.  Live permits are kept, also
 *     beyond a smaller limit; no permit is granted until fewer than the new
 *     limit are live.  Nobody is fenced by a change of limit.
 *   - A counted key becomes exclusive (limit NULL) only when none of its
 *     permits is live (55006); it is then FREE, its epoch past every permit's.
 *   - Its permits (or shared grants) are counted as a grant counts them
 *     (lease._count_permits): a renewal in an open transaction is waited
 *     for and counted, so no change of kind goes by a live permit.
 *
 * With owners bound to roles (90-owner-binding.sql), only a superuser or a
 * member of the database owner's role (lease._may_administer) that may act
 * for every live holder of the key may change its limit.  On Citus
 * (lease.distribute()) counted keys are not available (0A000).
 */
CREATE OR REPLACE FUNCTION lease.set_limit(
    p_key   text,
    p_limit integer)
    RETURNS TABLE (permit_limit integer, holders integer)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    ROWS 1
AS $function$
DECLARE
    v_now        timestamptz;
    v_found      boolean;
    v_owner      text;
    v_expires_at timestamptz;
    v_limit      integer;
    v_first      bigint;
    v_holder     text;
BEGIN
    IF (lease._is_plain_text(p_key) AND (p_limit IS NULL OR p_limit BETWEEN 1 AND lease._max_permits())
        AND lease._is_plain_session()) IS NOT TRUE THEN
        PERFORM lease._validate('set_limit', ARRAY[p_key], p_limit => p_limit);
        PERFORM lease._begin_write('set_limit');
    END IF;
    -- With owners bound to roles, a limit is the database owner's to set:
    -- it makes lease.acquire of the key a permit for every role, so a role
    -- that may not act for a key's users could otherwise make their next
    -- exclusive acquire a permit beside one of its own.
    IF lease._owners_bound() AND NOT lease._may_administer(lease._calling_role()) THEN
        RAISE EXCEPTION 'pg_lease: only the database owner may set limits while owners are bound to roles'
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = pg_catalog.format('%s is neither a superuser nor a member of the database owner''s role.',
                                             lease._calling_role()),
                  HINT = 'Ask the database owner to set the limit, or turn the owner binding off with lease.bind_owners(false).';
    END IF;
    IF lease._is_distributed() THEN
        RAISE EXCEPTION 'pg_lease: counted keys are not available on Citus'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Use exclusive keys on a distributed pg_lease.';
    END IF;

    LOOP
        SELECT l.owner, l.expires_at, l.permit_limit
          INTO v_owner, v_expires_at, v_limit
          FROM lease.leases AS l
         WHERE l.key = p_key COLLATE pg_catalog."C"
           FOR NO KEY UPDATE;
        v_found := FOUND;
        v_now := pg_catalog.clock_timestamp();
        IF NOT v_found THEN
            permit_limit := NULL;
            holders := 0;
            IF p_limit IS NULL THEN
                -- Never granted: exclusive already.
                RETURN NEXT;
                RETURN;
            END IF;
            SELECT lease._next_epoch(f.epoch) INTO v_first FROM lease.epoch_floor AS f;
            INSERT INTO lease.leases AS l (key, owner, epoch, expires_at, released_at, permit_limit)
            VALUES (p_key, NULL, v_first, NULL, v_now, p_limit)
            ON CONFLICT (key) DO NOTHING;
            IF FOUND THEN
                PERFORM lease._first_grant_epoch(p_key, v_first);
                permit_limit := p_limit;
                RETURN NEXT;
                RETURN;
            END IF;
            -- A concurrent first grant: look again.
            CONTINUE;
        END IF;
        EXIT;
    END LOOP;

    -- The key's live permits or shared grants, counted as a grant counts
    -- them (a renewal in an open transaction is waited for and counted);
    -- when none is left, the key has no permit rows at all.
    holders := 0;
    IF v_limit IS NOT NULL THEN
        SELECT c.live INTO holders FROM lease._count_permits(p_key, NULL, v_now, NULL) AS c;
    END IF;

    -- Holders the caller must be able to act for (owners bound).
    IF lease._owners_bound() THEN
        IF lease._is_live(v_owner, v_expires_at, v_now) THEN
            PERFORM lease._act_for(v_owner);
        END IF;
        FOR v_holder IN
            SELECT p.owner FROM lease.permits AS p
             WHERE p.key = p_key COLLATE pg_catalog."C"
               AND lease._is_live(p.owner, p.expires_at, v_now)
        LOOP
            PERFORM lease._act_for(v_holder);
        END LOOP;
    END IF;

    IF v_limit IS NULL AND p_limit IS NOT NULL AND lease._is_live(v_owner, v_expires_at, v_now) THEN
        RAISE EXCEPTION 'pg_lease: key % is held exclusively', lease._quoted(p_key)
            USING ERRCODE = 'object_in_use',
                  DETAIL = pg_catalog.format('An exclusive grant holds it until %s.', v_expires_at),
                  HINT = 'Set a limit once the holder has released the key or its grant has lapsed.';
    END IF;

    IF v_limit = 0 AND p_limit IS NOT NULL AND holders > 0 THEN
        -- A key in its shared phase becomes counted only with no shared
        -- grant live: a shared grant is not a permit.
        RAISE EXCEPTION 'pg_lease: key % has live shared grants', lease._quoted(p_key)
            USING ERRCODE = 'object_in_use',
                  DETAIL = pg_catalog.format('%s shared grants are live.', holders),
                  HINT = 'Set a limit once every shared grant has been released or has lapsed.';
    END IF;
    IF p_limit IS NULL AND holders > 0 THEN
        RAISE EXCEPTION 'pg_lease: key % still has live permits', lease._quoted(p_key)
            USING ERRCODE = 'object_in_use',
                  DETAIL = pg_catalog.format('%s permits are live.', holders),
                  HINT = 'Make it exclusive once every permit has been released or has lapsed.';
    END IF;

    IF p_limit IS NULL THEN
        IF v_limit IS NOT NULL THEN
            -- Counted -> exclusive: FREE from now on, its epoch (the latest
            -- permit's) the watermark.  No permit row is left (counted
            -- above).
            UPDATE lease.leases AS l
               SET permit_limit = NULL, released_at = v_now
             WHERE l.key = p_key COLLATE pg_catalog."C";
        END IF;
    ELSIF v_limit IS NULL THEN
        -- Exclusive -> counted: a lapsed grant no longer names the key.
        UPDATE lease.leases AS l
           SET permit_limit = p_limit, owner = NULL, expires_at = NULL,
               released_at = COALESCE(CASE WHEN l.owner IS NULL THEN l.released_at END, v_now)
         WHERE l.key = p_key COLLATE pg_catalog."C";
    ELSIF v_limit <> p_limit THEN
        UPDATE lease.leases AS l
           SET permit_limit = p_limit
         WHERE l.key = p_key COLLATE pg_catalog."C";
    END IF;
    permit_limit := p_limit;
    RETURN NEXT;
END;
$function$;

COMMENT ON FUNCTION lease.set_limit(text, integer) IS
    'set_limit(key, limit): make key a counted key of limit permits (1 to 1000), change its limit, or with limit NULL make it exclusive again; '
    'returns (permit_limit, holders); live permits are kept when the limit shrinks; 55006 while an exclusive grant, a shared grant, or (for NULL) a permit, is live';

/*
 * lease._held_until(key, owner, expires_at, limit, at): until when a key
 * whose row reads (owner, expires_at, permit_limit) is held at at: the
 * live exclusive grant's expiry, or for a counted key the latest expiry of
 * its live permits; NULL when nothing holds it.  inspect, watch and list
 * report with it.  PL/pgSQL, not a SQL-standard body, so that nothing
 * depends on lease.permits' columns.
 */
CREATE OR REPLACE FUNCTION lease._held_until(
    p_key        text,
    p_owner      text,
    p_expires_at timestamptz,
    p_limit      integer,
    p_at         timestamptz)
    RETURNS timestamptz
    LANGUAGE plpgsql
    STABLE
    SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    IF p_limit IS NULL THEN
        RETURN CASE WHEN lease._is_live(p_owner, p_expires_at, p_at) THEN p_expires_at END;
    END IF;
    RETURN (SELECT pg_catalog.max(p.expires_at)
              FROM lease.permits AS p
             WHERE p.key = p_key COLLATE pg_catalog."C"
               AND lease._is_live(p.owner, p.expires_at, p_at));
END;
$function$;

REVOKE ALL ON FUNCTION lease._held_until(text, text, timestamptz, integer, timestamptz) FROM PUBLIC;

/*
 * lease.holders(key) (§13): every grant of key live now, as (owner, epoch,
 * expires_at), in epoch order: the exclusive holder, or each permit.
 * Advisory, like inspect.
 */
CREATE OR REPLACE FUNCTION lease.holders(p_key text)
    RETURNS TABLE (owner text, epoch bigint, expires_at timestamptz)
    LANGUAGE plpgsql
    STABLE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    ROWS 4
AS $function$
DECLARE
    v_now CONSTANT timestamptz := pg_catalog.clock_timestamp();
BEGIN
    IF lease._is_plain_text(p_key) IS NOT TRUE THEN
        PERFORM lease._validate('holders', ARRAY[p_key]);
    END IF;
    RETURN QUERY
        SELECT l.owner::text, l.epoch::bigint, l.expires_at
          FROM lease.leases AS l
         WHERE l.key = p_key COLLATE pg_catalog."C"
           AND lease._is_live(l.owner, l.expires_at, v_now)
        UNION ALL
        SELECT p.owner::text, p.epoch::bigint, p.expires_at
          FROM lease.permits AS p
         WHERE p.key = p_key COLLATE pg_catalog."C"
           AND lease._is_live(p.owner, p.expires_at, v_now)
         ORDER BY 2;
END;
$function$;

COMMENT ON FUNCTION lease.holders(text) IS
    'holders(key): every live grant of key as (owner, epoch, expires_at) in epoch order: the exclusive holder, or each permit of a counted key';

/*
 * lease._fence_permit(key, epoch): lease.fence for a counted key (§13): the
 * permit of that epoch must be live; its row is then held FOR SHARE until
 * the transaction ends, so that permit is neither renewed, released nor
 * swept by a grant before the transaction ends, while the key's other
 * permits go on.  Otherwise PLF01, as fence raises it.
 */
CREATE OR REPLACE FUNCTION lease._fence_permit(
    p_key   text,
    p_epoch bigint)
    RETURNS void
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    v_owner      text;
    v_expires_at timestamptz;
    v_holder     text;
    v_found      boolean;
BEGIN
    LOOP
        IF lease._owners_bound() THEN
            SELECT p.owner INTO v_holder
              FROM lease.permits AS p
             WHERE p.key = p_key COLLATE pg_catalog."C"
               AND p.epoch = p_epoch;
            IF v_holder IS NOT NULL THEN
                PERFORM lease._act_for(v_holder);
            END IF;
        END IF;

        SELECT p.owner, p.expires_at
          INTO v_owner, v_expires_at
          FROM lease.permits AS p
         WHERE p.key = p_key COLLATE pg_catalog."C"
           AND p.epoch = p_epoch
           AND lease._is_live(p.owner, p.expires_at, pg_catalog.clock_timestamp())
           AND (NOT lease._owners_bound() OR p.owner = v_holder COLLATE pg_catalog."C")
           FOR SHARE;
        IF lease._is_live(v_owner, v_expires_at, pg_catalog.clock_timestamp()) THEN
            RETURN;
        END IF;

        -- Refused: go round only if that permit is live after all (it
        -- committed after the scan's snapshot).
        SELECT p.owner, p.expires_at
          INTO v_owner, v_expires_at
          FROM lease.permits AS p
         WHERE p.key = p_key COLLATE pg_catalog."C"
           AND p.epoch = p_epoch;
        v_found := FOUND;
        EXIT WHEN NOT v_found OR NOT lease._is_live(v_owner, v_expires_at, pg_catalog.clock_timestamp());
    END LOOP;

    RAISE EXCEPTION 'pg_lease: stale epoch'
        USING ERRCODE = 'PLF01',
              DETAIL = pg_catalog.format('key %s: epoch %s presented, but %s',
                  lease._quoted(p_key), p_epoch,
                  CASE WHEN v_found THEN 'the permit of that epoch lapsed'
                       ELSE 'no permit or shared grant of the key has that epoch now' END),
              HINT = 'The grant of that epoch is over or never was: stop writing for it, and acquire the key again for a new epoch.';
END;
$function$;

REVOKE ALL ON FUNCTION lease._fence_permit(text, bigint) FROM PUBLIC;

/*
 * lease._refuse_counted(call, keys): the batches (70-batch.sql) do not take
 * counted keys (§13): raises 0A000 naming them.
 */
CREATE OR REPLACE FUNCTION lease._refuse_counted(p_call text, p_keys text[])
    RETURNS void
    LANGUAGE plpgsql
    STABLE
    SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    v_counted text[];
BEGIN
    SELECT pg_catalog.array_agg(lease._quoted(l.key::text) ORDER BY l.key)
      INTO v_counted
      FROM lease.leases AS l
     WHERE l.key = ANY (p_keys::text[] COLLATE pg_catalog."C")
       AND l.permit_limit IS NOT NULL;
    IF v_counted IS NOT NULL THEN
        RAISE EXCEPTION 'pg_lease: % does not take counted or shared keys', p_call
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = pg_catalog.format('Counted keys, or keys in their shared phase: %s.',
                      pg_catalog.array_to_string(v_counted[1:10], ', ')
                      || CASE WHEN pg_catalog.cardinality(v_counted) > 10
                              THEN pg_catalog.format(' and %s more', pg_catalog.cardinality(v_counted) - 10)
                              ELSE '' END),
                  HINT = 'Acquire, renew and release the permits and shared grants of such a key one call at a time.';
    END IF;
END;
$function$;

REVOKE ALL ON FUNCTION lease._refuse_counted(text, text[]) FROM PUBLIC;
