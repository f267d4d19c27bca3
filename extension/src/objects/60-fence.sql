/*
 * lease.fence (SEMANTICS.md §10 Fence, invariant I12): a write commits only
 * under a grant that is live, in the same transaction.
 *
 * The fence returns only when p_epoch is the key's live grant at server time
 * now, and it leaves the key's row locked until the caller's transaction
 * ends.  acquire (of a free or lapsed key), renew and release all UPDATE that
 * row, so none of them can commit while the fenced transaction is open: its
 * writes commit under a grant that was live when the fence ran, and no later
 * grant of the key commits before them.  A key that was never granted has no
 * row to lock, and it needs none: the fence refuses it.
 *
 * The lock mode is FOR SHARE, the weakest mode that an UPDATE of non-key
 * columns waits for.  Several fenced transactions of the same holder run side
 * by side.  FOR KEY SHARE would not do: it is compatible with such UPDATEs,
 * so it neither blocks a renew, release or takeover nor waits for one, and
 * under REPEATABLE READ it locks a row version superseded after the
 * snapshot without an error, accepting the epoch that row carried.  Under
 * REPEATABLE READ and SERIALIZABLE, locking a row that changed after the
 * snapshot raises 40001, so a fence there answers from committed state or
 * fails: it never accepts a grant that ended after its snapshot.
 *
 * "Live" is decided with a clock reading taken after the lock is held, so a
 * fence that waited for the lock (behind a renew or release in progress)
 * does not accept a grant that lapsed meanwhile.  The scan also filters on
 * the clock, to pass over a lapsed row without locking it; that reading
 * decides nothing.
 *
 * What the fence waits for: only a transaction that is changing the row of
 * a grant live under p_epoch (a renew or release in progress).  The scan
 * reads the row version of its snapshot, and only a version that carries
 * p_epoch, a holder and a future expiry is locked; so a grant that is over
 * in committed state (taken over, released, lapsed, or another epoch) is
 * refused at once, also while a takeover of the key is uncommitted.  Under
 * READ COMMITTED a wait ends on the newest row version, which the executor
 * checks against the WHERE clause again: a release that committed meanwhile
 * makes the fence refuse, a renew lets it pass.
 *
 * A refused fence leaves no lock behind: its error aborts the caller's
 * transaction (or the caller's subtransaction, if it catches the error),
 * and an aborted transaction's row locks are gone at once, before the
 * client's ROLLBACK.  So a stale writer never delays the holder.
 *
 * The cost, documented in the README: while a fenced transaction is open,
 * the holder's own renew and release, and any takeover once the grant
 * lapses, wait for it.  Fenced transactions must stay short next to the ttl.
 *
 * Refusal: SQLSTATE PLF01, message "pg_lease: stale epoch", DETAIL naming
 * the key, the epoch presented and what stands now, read from committed
 * state (under REPEATABLE READ: from the snapshot).  Invalid input (a key
 * that is NULL, empty or over 1000 bytes, a NULL epoch): 22023 as everywhere
 * (§3), checked once nothing matched, since a matching row proves the key
 * valid and the epoch not NULL.
 */
CREATE OR REPLACE FUNCTION lease.fence(
    p_key   text,
    p_epoch bigint)
    RETURNS void
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    v_now        timestamptz;
    v_found      boolean;
    v_owner      text;
    v_epoch      bigint;
    v_expires_at timestamptz;
    v_validated  boolean := false;
    v_holder     text;
BEGIN
    LOOP
        -- With owners bound to roles, only a role that may act for the
        -- holder may fence (and so hold the row lock that stalls the
        -- holder's renew and release): check the holder before locking,
        -- and lock only that holder's grant.
        IF lease._owners_bound() THEN
            SELECT l.owner INTO v_holder
              FROM lease.leases AS l
             WHERE l.key = p_key COLLATE pg_catalog."C"
               AND l.epoch = p_epoch;
            IF v_holder IS NOT NULL THEN
                PERFORM lease._act_for(v_holder);
            END IF;
        END IF;

        -- The live grant's row, locked; then the clock.
        SELECT l.owner, l.expires_at
          INTO v_owner, v_expires_at
          FROM lease.leases AS l
         WHERE l.key = p_key COLLATE pg_catalog."C"
           AND l.epoch = p_epoch
           AND lease._is_live(l.owner, l.expires_at, pg_catalog.clock_timestamp())
           AND (NOT lease._owners_bound() OR l.owner = v_holder COLLATE pg_catalog."C")
           FOR SHARE;
        IF lease._is_live(v_owner, v_expires_at, pg_catalog.clock_timestamp()) THEN
            RETURN;
        END IF;

        IF NOT v_validated
           AND (lease._is_plain_text(p_key) AND p_epoch IS NOT NULL) IS NOT TRUE THEN
            PERFORM lease._validate('fence', ARRAY[p_key], p_epochs => ARRAY[p_epoch]);
        END IF;
        v_validated := true;

        -- A counted key (§13): the permit of that epoch.
        IF EXISTS (SELECT FROM lease.leases AS l
                    WHERE l.key = p_key COLLATE pg_catalog."C"
                      AND l.permit_limit IS NOT NULL) THEN
            PERFORM lease._fence_permit(p_key, p_epoch);
            RETURN;
        END IF;

        -- Refused: what stands now.  If that is the grant of p_epoch, live
        -- (it committed after the snapshot of the scan above), try again.
        SELECT l.owner, l.epoch, l.expires_at
          INTO v_owner, v_epoch, v_expires_at
          FROM lease.leases AS l
         WHERE l.key = p_key COLLATE pg_catalog."C";
        v_found := FOUND;
        v_now := pg_catalog.clock_timestamp();
        EXIT WHEN NOT v_found OR v_epoch <> p_epoch
               OR NOT lease._is_live(v_owner, v_expires_at, v_now);
    END LOOP;

    -- lease._quoted reads the key under COLLATE "C": with a nondeterministic
    -- collation of the caller's, replace() would raise 0A000 instead of PLF01
    -- before PostgreSQL 18.
    RAISE EXCEPTION 'pg_lease: stale epoch'
        USING ERRCODE = 'PLF01',
              DETAIL = pg_catalog.format('key %s: epoch %s presented, but %s',
                  lease._quoted(p_key), p_epoch,
                  CASE
                      WHEN NOT v_found THEN
                          'the key was never granted'
                      WHEN v_owner IS NULL THEN
                          pg_catalog.format('the key is free with watermark %s', v_epoch)
                      WHEN NOT lease._is_live(v_owner, v_expires_at, v_now) THEN
                          pg_catalog.format('the key lapsed (epoch %s)', v_epoch)
                      ELSE
                          pg_catalog.format('the key is held under epoch %s', v_epoch)
                  END),
              HINT = 'The grant of that epoch is over or never was: stop writing for it, and acquire the key again for a new epoch.';
END;
$function$;

COMMENT ON FUNCTION lease.fence(text, bigint) IS
    'fence(key, epoch): return only if epoch is the key''s live grant, then hold the key''s row lock until the transaction ends, '
    'so no acquire, renew or release of the key commits before it; otherwise SQLSTATE PLF01 (pg_lease: stale epoch)';

/*
 * lease.fence_row(key_column, epoch_column): a row trigger that fences every
 * inserted or updated row by its own key and epoch columns, through
 * lease.fence (§10 Fence).  Any table owner may attach it:
 *
 *   CREATE TRIGGER jobs_fence BEFORE INSERT OR UPDATE ON jobs
 *       FOR EACH ROW EXECUTE FUNCTION lease.fence_row('lease_key', 'lease_epoch');
 *
 * The row carries the claim: a writer must store its own epoch in the epoch
 * column with every write.  An UPDATE that leaves the column as it was is
 * fenced by the epoch already in the row, which says nothing about who
 * writes.  A NULL key or epoch is invalid input (22023, from lease.fence).
 *
 * DELETE (and TRUNCATE) is refused when the trigger is attached for it: a
 * deleted row has no new epoch, and fencing by the epoch the old row carries
 * would let a stale writer delete rows of the current holder.  Fence a
 * DELETE with lease.fence(key, epoch) in the deleting transaction instead.
 * For the same reason an UPDATE that changes the key column is refused
 * (0.2.1): it deletes the row from the old key.
 *
 * The trigger checks the row as it stands when it fires.  BEFORE triggers
 * fire in name order, so a BEFORE trigger that changes the key or epoch
 * column must sort before this one; an AFTER ROW trigger sees the final row.
 *
 * It is SECURITY INVOKER, like any trigger function, and runs as the role
 * that writes the row: that role needs nothing but EXECUTE on lease.fence,
 * which PUBLIC has.  search_path is pinned so that operators a writer's path
 * could supply are never used.
 *
 * The columns are found by name in pg_attribute on every call (trigger
 * arguments are fixed, but PL/pgSQL keeps no state between calls); the key
 * column must be text or varchar, the epoch column bigint.  Their values
 * come from the row as jsonb: to_jsonb reads every column of the row, so a
 * very wide row (large TOASTed values) costs more to fence this way than
 * with an explicit lease.fence call.
 */
CREATE OR REPLACE FUNCTION lease.fence_row()
    RETURNS trigger
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    v_key_type   oid;
    v_epoch_type oid;
    v_row        jsonb;
BEGIN
    IF TG_LEVEL <> 'ROW' OR TG_OP NOT IN ('INSERT', 'UPDATE') THEN
        RAISE EXCEPTION 'pg_lease: lease.fence_row fences inserted and updated rows only'
            USING ERRCODE = 'trigger_protocol_violated',
                  DETAIL = pg_catalog.format('Trigger %I on %s fired for %s %s.',
                                             TG_NAME, TG_RELID::pg_catalog.regclass, TG_OP,
                                             pg_catalog.lower(TG_LEVEL)),
                  HINT = CASE WHEN TG_OP IN ('DELETE', 'TRUNCATE') THEN
                             'A deleted row has no epoch of its writer: call lease.fence(key, epoch) in the deleting transaction, and attach the trigger FOR EACH ROW on INSERT OR UPDATE only.'
                         ELSE
                             'Attach it FOR EACH ROW on INSERT OR UPDATE.'
                         END;
    END IF;
    IF TG_NARGS <> 2 THEN
        RAISE EXCEPTION 'pg_lease: lease.fence_row needs two arguments, the key column and the epoch column'
            USING ERRCODE = 'trigger_protocol_violated',
                  DETAIL = pg_catalog.format('Trigger %I on %s has %s.',
                                             TG_NAME, TG_RELID::pg_catalog.regclass,
                                             CASE TG_NARGS WHEN 1 THEN '1 argument'
                                                 ELSE TG_NARGS || ' arguments' END),
                  HINT = 'For example: EXECUTE FUNCTION lease.fence_row(''lease_key'', ''lease_epoch'').';
    END IF;

    SELECT (SELECT a.atttypid FROM pg_catalog.pg_attribute AS a
             WHERE a.attrelid = TG_RELID AND a.attname = TG_ARGV[0]
               AND a.attnum > 0 AND NOT a.attisdropped),
           (SELECT a.atttypid FROM pg_catalog.pg_attribute AS a
             WHERE a.attrelid = TG_RELID AND a.attname = TG_ARGV[1]
               AND a.attnum > 0 AND NOT a.attisdropped)
      INTO v_key_type, v_epoch_type;

    IF v_key_type IS NULL OR v_epoch_type IS NULL THEN
        RAISE EXCEPTION 'pg_lease: lease.fence_row: column "%" of relation % does not exist',
                        CASE WHEN v_key_type IS NULL THEN TG_ARGV[0] ELSE TG_ARGV[1] END,
                        TG_RELID::pg_catalog.regclass
            USING ERRCODE = 'undefined_column',
                  DETAIL = pg_catalog.format('Trigger %I names key column %L and epoch column %L.',
                                             TG_NAME, TG_ARGV[0], TG_ARGV[1]);
    END IF;
    IF v_key_type NOT IN ('pg_catalog.text'::pg_catalog.regtype, 'pg_catalog.varchar'::pg_catalog.regtype)
       OR v_epoch_type <> 'pg_catalog.int8'::pg_catalog.regtype THEN
        RAISE EXCEPTION 'pg_lease: lease.fence_row: the key column must be text or varchar and the epoch column bigint'
            USING ERRCODE = 'datatype_mismatch',
                  DETAIL = pg_catalog.format('Trigger %I on %s: key column %I is %s, epoch column %I is %s.',
                                             TG_NAME, TG_RELID::pg_catalog.regclass,
                                             TG_ARGV[0], pg_catalog.format_type(v_key_type, NULL),
                                             TG_ARGV[1], pg_catalog.format_type(v_epoch_type, NULL));
    END IF;

    -- Moving a row to another partition fires only AFTER INSERT on the
    -- partitioned table, with no OLD row to compare: attached AFTER to a
    -- partition, the trigger could not refuse a key move, so it refuses to
    -- run there at all.
    IF TG_WHEN = 'AFTER'
       AND (SELECT c.relispartition FROM pg_catalog.pg_class AS c WHERE c.oid = TG_RELID) THEN
        RAISE EXCEPTION 'pg_lease: lease.fence_row must fire BEFORE on a partitioned table'
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = pg_catalog.format('Trigger %I on partition %s fires AFTER %s.',
                                             TG_NAME, TG_RELID::pg_catalog.regclass, TG_OP),
                  HINT = 'An UPDATE that moves a row between partitions fires only AFTER INSERT; attach the trigger BEFORE INSERT OR UPDATE.';
    END IF;
    v_row := pg_catalog.to_jsonb(NEW);
    -- An UPDATE that moves a row to another key takes it away from the old
    -- key's holder, for whom the row carries no epoch of this writer: the
    -- new key's grant proves nothing about the old one.  Refused, like
    -- DELETE; such a move is a DELETE and an INSERT under explicit fences.
    IF TG_OP = 'UPDATE'
       AND (pg_catalog.to_jsonb(OLD) -> TG_ARGV[0]) IS DISTINCT FROM (v_row -> TG_ARGV[0]) THEN
        RAISE EXCEPTION 'pg_lease: lease.fence_row refuses an UPDATE that moves a row to another key'
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = pg_catalog.format('Trigger %I on %s: column %I changes from %s to %s.',
                                             TG_NAME, TG_RELID::pg_catalog.regclass, TG_ARGV[0],
                                             pg_catalog.to_jsonb(OLD) -> TG_ARGV[0], v_row -> TG_ARGV[0]),
                  HINT = 'Delete the row and insert it under the new key in a transaction that calls lease.fence for both keys.';
    END IF;
    PERFORM lease.fence(v_row ->> TG_ARGV[0], (v_row ->> TG_ARGV[1])::bigint);
    RETURN NEW;
END;
$function$;

COMMENT ON FUNCTION lease.fence_row() IS
    'trigger fence_row(key_column, epoch_column): FOR EACH ROW on INSERT OR UPDATE, fences every new row with '
    'lease.fence(its key, its epoch); PLF01 when that epoch is not the key''s live grant; refuses DELETE and key changes';
