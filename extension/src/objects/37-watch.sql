/*
 * Waking waiters that wait outside any transaction (§10 Waiting).
 *
 * A client that waits for a key LISTENs on channel pg_lease and sleeps
 * between attempts; a release of the key sends the key as the payload.
 * NOTIFY is not free: at commit it takes a lock on the database that
 * serializes every notifying transaction, so a release notifies only when
 * somebody said it waits.  That mark lives in the key's own row
 * (watched_until): release reads it from the row it updates anyway, so a
 * release nobody waits for costs one more expression in its RETURNING list.
 *
 * The mark is a time, not a count: "someone waits for a release of this
 * key until then".  A waiter that dies stops renewing it and it runs out
 * on its own; until then releases of the key notify for nobody, which
 * costs the notification and nothing else.  Since 0.2.1 the mark is
 * bounded twice: it lasts at most lease._watch_cap() (waiters renew it at
 * half, as the client does), and the next grant of the key ends it
 * (lease.acquire clears it), so a mark made against one grant never makes
 * a later holder's releases notify.  Waiters that cannot be
 * notified (LISTEN does not work behind a pooler in transaction mode) do
 * not mark: they poll, and their marks would only make releases pay.
 */

/*
 * lease._wake: the notification of a release of p_key, sent when the
 * releasing transaction commits (and never if it rolls back).  Returns
 * release's status 'ok'.  release calls it after its UPDATE, only for a
 * watched key (the UPDATE returns the mark; 0.2.1 took it out of the
 * RETURNING list, where Citus refuses a volatile function).  Anyone may LISTEN on pg_lease, and anyone
 * may NOTIFY it: a false notification makes a waiter try once more and
 * sleep again, nothing else.
 */
CREATE OR REPLACE FUNCTION lease._wake(p_key text)
    RETURNS text
    LANGUAGE sql
    VOLATILE
BEGIN ATOMIC
    SELECT pg_catalog.pg_notify('pg_lease', p_key);
    SELECT 'ok'::text;
END;

REVOKE ALL ON FUNCTION lease._wake(text) FROM PUBLIC;

/*
 * lease.watch(key, wait): "I wait for key for up to wait; tell me when it is
 * released", then inspect's view of the key.
 *
 * While the key is held it makes sure the key's mark lasts at least until
 * server time + wait, or + lease._watch_cap() if that is shorter: the row
 * is written only when the mark would end before half of that, so many
 * waiters of one key share one write.  A key
 * not held is not marked (the caller should try to acquire it now).
 *
 * No lost wake-up: the mark is written to the key's row, which a release
 * updates too, so the two serialize on the row lock.  A release that
 * commits before the mark does is seen here (the key is not held: no mark,
 * and the result says so); one that comes after reads the mark and
 * notifies.  The caller LISTENs before calling this and tries to acquire
 * after a notification, or when the holder's expiry comes.
 *
 * The write keeps the key's row locked until the caller's transaction
 * ends, which delays the holder's renew and release that long: call it
 * outside an explicit transaction, as the client does.  It never waits
 * for a row lock itself (SKIP LOCKED); notifies says whether the mark
 * stands.
 */
CREATE OR REPLACE FUNCTION lease._watch_cap()
    RETURNS interval
    LANGUAGE sql
    IMMUTABLE PARALLEL SAFE
RETURN interval '5 minutes';

REVOKE ALL ON FUNCTION lease._watch_cap() FROM PUBLIC;

-- Marks made before the cap (0.2.0 allowed up to 1000 years) end within it.
UPDATE lease.leases AS l
   SET watched_until = pg_catalog.clock_timestamp() + lease._watch_cap()
 WHERE l.watched_until > pg_catalog.clock_timestamp() + lease._watch_cap();

CREATE OR REPLACE FUNCTION lease.watch(
    p_key  text,
    p_wait interval)
    RETURNS TABLE (held boolean, owner text, epoch bigint, expires_at timestamptz,
                   notifies boolean)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    ROWS 1
AS $function$
DECLARE
    v_now    CONSTANT timestamptz := pg_catalog.clock_timestamp();
    v_span   interval;
    v_holder text;
    v_held   boolean;
    v_fresh  boolean;
    v_limit  integer;
BEGIN
    IF (lease._is_plain_text(p_key) AND p_wait IS NOT NULL
        AND lease._interval_problem('wait', p_wait, false) IS NULL) IS NOT TRUE THEN
        PERFORM lease._validate('watch', ARRAY[p_key], p_wait => p_wait);
    END IF;
    v_span := LEAST(p_wait, lease._watch_cap());

    SELECT l.owner, lease._is_live(l.owner, l.expires_at, v_now),
           l.watched_until >= v_now + v_span / 2, l.permit_limit
      INTO v_holder, v_held, v_fresh, v_limit
      FROM lease.leases AS l
     WHERE l.key = p_key COLLATE pg_catalog."C";

    -- A counted key (§13) with a live permit: its permits' releases notify
    -- once it is marked.  With owners bound nobody marks it (its holders
    -- are many): the caller polls.
    IF v_limit IS NOT NULL AND v_fresh IS NOT TRUE AND NOT lease._owners_bound()
       AND lease._held_until(p_key, NULL, NULL, v_limit, v_now) IS NOT NULL THEN
        UPDATE lease.leases AS l
           SET watched_until = v_now + v_span
         WHERE l.key = (SELECT c.key
                          FROM lease.leases AS c
                         WHERE c.key = p_key COLLATE pg_catalog."C"
                           AND c.permit_limit IS NOT NULL
                           FOR NO KEY UPDATE SKIP LOCKED)
           AND l.key = p_key COLLATE pg_catalog."C";
    END IF;

    -- §10 Waiting: mark a held key, at most once per half mark, and only a
    -- row nobody has locked: a fenced transaction holds its key's row for
    -- as long as it runs, and a waiter must not queue behind it.  Unmarked,
    -- the caller learns notifies = false and polls instead.  A mark already
    -- committed is read by any later release, locked row or not.  With
    -- owners bound to roles, only a role that may act for the holder marks
    -- (the mark's write would otherwise let anyone hold the holder's row
    -- lock and make its releases notify); others learn only whether a mark
    -- already stands.
    IF v_held AND v_fresh IS NOT TRUE AND lease._may_act_for(v_holder) THEN
        UPDATE lease.leases AS l
           SET watched_until = v_now + v_span
         WHERE l.key = (SELECT c.key
                          FROM lease.leases AS c
                         WHERE c.key = p_key COLLATE pg_catalog."C"
                           AND c.owner = v_holder COLLATE pg_catalog."C"
                           AND lease._is_live(c.owner, c.expires_at, v_now)
                           FOR NO KEY UPDATE SKIP LOCKED)
           AND l.key = p_key COLLATE pg_catalog."C";
    END IF;

    -- inspect's view (§4 inspect), read after the mark, and from the same
    -- row whether a release will notify: a grant made since the first read
    -- ended the mark that read saw, so only the mark on the grant reported
    -- counts.
    SELECT l.owner, l.epoch, l.expires_at, l.watched_until > pg_catalog.clock_timestamp(), l.permit_limit
      INTO owner, epoch, expires_at, notifies, v_limit
      FROM lease.leases AS l
     WHERE l.key = p_key COLLATE pg_catalog."C";
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- A counted key (§13) as inspect shows it.
    expires_at := lease._held_until(p_key, owner, expires_at, v_limit, pg_catalog.clock_timestamp());
    held := expires_at IS NOT NULL;
    IF v_limit IS NOT NULL THEN
        owner := NULL;
    END IF;
    IF NOT held THEN
        owner := NULL;
        expires_at := NULL;
    END IF;
    notifies := held AND notifies IS TRUE;
    RETURN NEXT;
END;
$function$;

COMMENT ON FUNCTION lease.watch(text, interval) IS
    'watch(key, wait): while key is held, have its releases notify channel pg_lease (payload: the key) for at least wait; '
    'returns what inspect(key) returns, and notifies: whether a release will notify (false while another transaction has the row locked, e.g. a fenced one: poll then). For waiting outside a transaction: LISTEN pg_lease, watch, sleep until notified or the expiry, acquire';
