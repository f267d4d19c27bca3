--
-- pg_lease: the state tables of SEMANTICS.md (§2 states, §4 operations),
-- status precedence (I8) and the epoch sequence (I2, I3, I4, I7).
--
-- Timestamps are never printed: expiries are checked as booleans against
-- clock_timestamp() readings taken around the call (I5).  Lapses come from
-- short TTLs and pg_sleep.
--
CREATE EXTENSION pg_lease;
\pset null '(null)'

-- The stored rows, as the superuser running this test may see them.
CREATE TEMP VIEW stored AS
    SELECT key, owner, epoch, expires_at > clock_timestamp() AS live
      FROM lease.leases
     ORDER BY key;

-- A fingerprint of the whole table, to prove that a call changed nothing.
CREATE TEMP VIEW fingerprint AS
    SELECT md5(coalesce(string_agg(format('%s|%s|%s|%s|%s', key, owner, epoch, expires_at, ctid),
                                   ',' ORDER BY key), '')) AS f
      FROM lease.leases;

--
-- NEVER
--
-- inspect of a key never granted returns no row
SELECT * FROM lease.inspect('job-1');
-- renew and release of a key never granted report not_owner
SELECT * FROM lease.renew('job-1', 'worker-a', 1, interval '1 hour');
SELECT * FROM lease.release('job-1', 'worker-a', 1);
SELECT count(*) AS rows_stored FROM lease.leases;

--
-- NEVER -> HELD: acquire grants epoch 1 until server time + ttl (I5)
--
SELECT clock_timestamp() AS t0 \gset
SELECT acquired, epoch, expires_at AS x FROM lease.acquire('job-1', 'worker-a', interval '1 hour') \gset
SELECT clock_timestamp() AS t1 \gset
SELECT :'acquired' AS acquired, :'epoch' AS epoch,
       :'x'::timestamptz BETWEEN :'t0'::timestamptz + interval '1 hour'
                             AND :'t1'::timestamptz + interval '1 hour' AS expiry_is_now_plus_ttl;
-- inspect of a held key shows the grant
SELECT held, owner, epoch, expires_at = :'x' AS same_expiry FROM lease.inspect('job-1');
SELECT * FROM stored;

--
-- HELD by the same owner: same epoch, expiry unchanged, nothing written (I4)
--
SELECT xmin AS xmin0, ctid AS ctid0 FROM lease.leases WHERE key = 'job-1' \gset
BEGIN;
SELECT acquired, epoch, expires_at = :'x' AS same_expiry
  FROM lease.acquire('job-1', 'worker-a', interval '5 hours');
-- no transaction id was needed: no row written, no row locked
SELECT pg_current_xact_id_if_assigned() IS NULL AS wrote_nothing;
COMMIT;
SELECT xmin = :'xmin0' AND ctid = :'ctid0' AS same_row_version FROM lease.leases WHERE key = 'job-1';

--
-- HELD by another owner, wait = 0: (f, NULL, NULL), nothing written or locked
--
BEGIN;
SELECT * FROM lease.acquire('job-1', 'worker-b', interval '1 hour');
SELECT pg_current_xact_id_if_assigned() IS NULL AS wrote_nothing;
COMMIT;
SELECT * FROM stored;

--
-- renew by the holder: ok, expiry := server time + ttl, epoch unchanged (I4, I5)
--
SELECT clock_timestamp() AS t0 \gset
SELECT status, expires_at AS x FROM lease.renew('job-1', 'worker-a', 1, interval '2 hours') \gset
SELECT clock_timestamp() AS t1 \gset
SELECT :'status' AS status,
       :'x'::timestamptz BETWEEN :'t0'::timestamptz + interval '2 hours'
                             AND :'t1'::timestamptz + interval '2 hours' AS expiry_is_now_plus_ttl;
SELECT held, owner, epoch, expires_at = :'x' AS same_expiry FROM lease.inspect('job-1');
-- renew may also shorten the grant: the new expiry is always now + ttl
SELECT status, expires_at < :'x'::timestamptz AS shortened
  FROM lease.renew('job-1', 'worker-a', 1, interval '1 hour');

--
-- renew and release refusals on a HELD key change nothing
--
SELECT f AS fp0 FROM fingerprint \gset
BEGIN;
-- another owner: not_owner (also with the right epoch)
SELECT * FROM lease.renew('job-1', 'worker-b', 1, interval '1 hour');
SELECT * FROM lease.release('job-1', 'worker-b', 1);
-- the holder with a wrong epoch: epoch_mismatch
SELECT * FROM lease.renew('job-1', 'worker-a', 2, interval '1 hour');
SELECT * FROM lease.release('job-1', 'worker-a', 0);
-- another owner with a wrong epoch: not_owner comes first (I8)
SELECT * FROM lease.renew('job-1', 'worker-b', 2, interval '1 hour');
SELECT pg_current_xact_id_if_assigned() IS NULL AS wrote_nothing;
COMMIT;
SELECT f = :'fp0' AS unchanged FROM fingerprint;

--
-- HELD -> FREE: release by the holder; epoch + 1 fences the grant (I7)
--
SELECT * FROM lease.release('job-1', 'worker-a', 1);
SELECT * FROM lease.inspect('job-1');
SELECT * FROM stored;

--
-- FREE: renew and release report not_owner, also for the former holder
--
SELECT * FROM lease.renew('job-1', 'worker-a', 1, interval '1 hour');
SELECT * FROM lease.release('job-1', 'worker-a', 1);
SELECT * FROM lease.release('job-1', 'worker-a', 2);

--
-- FREE with epoch c -> HELD(owner, c + 1)
--
SELECT acquired, epoch, expires_at > clock_timestamp() AS live
  FROM lease.acquire('job-1', 'worker-b', interval '1 hour');
SELECT * FROM stored;

--
-- LAPSED: a grant is held only while server time < expires_at (I5)
--
SELECT acquired, epoch FROM lease.acquire('job-2', 'worker-a', interval '100 milliseconds');
SELECT pg_sleep(0.3);
-- inspect reports a lapsed key as unowned, with its epoch as watermark
SELECT * FROM lease.inspect('job-2');
-- expiry is lazy: the stored row still names the lapsed owner
SELECT * FROM stored WHERE key = 'job-2';

-- a lapsed grant cannot be renewed or released (I6), and nothing changes
SELECT f AS fp0 FROM fingerprint \gset
SELECT * FROM lease.renew('job-2', 'worker-a', 1, interval '1 hour');
SELECT * FROM lease.release('job-2', 'worker-a', 1);
-- lapsed comes before epoch_mismatch (I8)
SELECT * FROM lease.renew('job-2', 'worker-a', 7, interval '1 hour');
SELECT * FROM lease.release('job-2', 'worker-a', 7);
-- another owner on a lapsed row: not_owner comes before lapsed (I8)
SELECT * FROM lease.renew('job-2', 'worker-b', 1, interval '1 hour');
SELECT * FROM lease.release('job-2', 'worker-b', 1);
SELECT f = :'fp0' AS unchanged FROM fingerprint;

--
-- LAPSED with epoch e -> HELD(owner, e + 1), the former holder included
--
SELECT acquired, epoch FROM lease.acquire('job-2', 'worker-a', interval '100 milliseconds');
SELECT pg_sleep(0.3);
-- ... and any other owner: takeover
SELECT acquired, epoch FROM lease.acquire('job-2', 'worker-b', interval '1 hour');

-- renew after takeover reports not_owner to the old owner (§9, seed example 3)
SELECT * FROM lease.renew('job-2', 'worker-a', 2, interval '1 hour');
SELECT * FROM lease.release('job-2', 'worker-a', 2);
-- the new holder's stale epoch: epoch_mismatch; its own epoch: ok
SELECT * FROM lease.renew('job-2', 'worker-b', 2, interval '1 hour');
SELECT status FROM lease.renew('job-2', 'worker-b', 3, interval '1 hour');
SELECT * FROM lease.inspect('job-2') AS i(held, owner, epoch, x) \gset
SELECT :'held' AS held, :'owner' AS owner, :'epoch' AS epoch;

--
-- The holder's own live re-grant with an older epoch: epoch_mismatch, and
-- once that grant lapses as well: lapsed
--
SELECT acquired, epoch FROM lease.acquire('job-3', 'worker-a', interval '1 hour');
SELECT * FROM lease.release('job-3', 'worker-a', 1);
SELECT acquired, epoch FROM lease.acquire('job-3', 'worker-a', interval '200 milliseconds');
SELECT status FROM lease.renew('job-3', 'worker-a', 1, interval '1 hour');
SELECT pg_sleep(0.4);
SELECT status FROM lease.renew('job-3', 'worker-a', 1, interval '1 hour');

--
-- Epoch sequence of one key through every transition: strictly increasing
-- grants, watermark always past every epoch handed out (I2, I3, I7)
--
CREATE TEMP TABLE seen (step int GENERATED ALWAYS AS IDENTITY, what text, epoch bigint);
INSERT INTO seen (what, epoch)
    SELECT 'acquire a', epoch FROM lease.acquire('job-4', 'a', interval '1 hour');
INSERT INTO seen (what, epoch)
    SELECT 're-acquire a', epoch FROM lease.acquire('job-4', 'a', interval '1 hour');
SELECT status FROM lease.renew('job-4', 'a', 1, interval '100 milliseconds');
INSERT INTO seen (what, epoch)
    SELECT 'held after renew a', epoch FROM lease.inspect('job-4') WHERE held;
SELECT pg_sleep(0.3);
INSERT INTO seen (what, epoch)
    SELECT 'watermark after lapse', epoch FROM lease.inspect('job-4') WHERE NOT held;
INSERT INTO seen (what, epoch)
    SELECT 'takeover b', epoch FROM lease.acquire('job-4', 'b', interval '1 hour');
SELECT * FROM lease.release('job-4', 'b', 2);
INSERT INTO seen (what, epoch)
    SELECT 'watermark after release b', epoch FROM lease.inspect('job-4') WHERE NOT held;
INSERT INTO seen (what, epoch)
    SELECT 'acquire c', epoch FROM lease.acquire('job-4', 'c', interval '1 hour');
SELECT * FROM lease.release('job-4', 'c', 4);
INSERT INTO seen (what, epoch)
    SELECT 'watermark after release c', epoch FROM lease.inspect('job-4') WHERE NOT held;
INSERT INTO seen (what, epoch)
    SELECT 'acquire a again', epoch FROM lease.acquire('job-4', 'a', interval '1 hour');
SELECT step, what, epoch FROM seen ORDER BY step;
-- every fresh grant exceeds everything returned before it
SELECT bool_and(s.epoch > (SELECT max(p.epoch) FROM seen AS p WHERE p.step < s.step)) AS fresh_grants_increase
  FROM seen AS s
 WHERE s.what IN ('takeover b', 'acquire c', 'acquire a again');

--
-- Rollback undoes every call (§5, I9)
--
BEGIN;
SELECT acquired, epoch FROM lease.acquire('job-5', 'worker-a', interval '1 hour');
ROLLBACK;
-- the key was never granted
SELECT * FROM lease.inspect('job-5');

SELECT acquired, epoch FROM lease.acquire('job-5', 'worker-a', interval '1 hour');
SELECT f AS fp0 FROM fingerprint \gset
BEGIN;
SELECT status FROM lease.renew('job-5', 'worker-a', 1, interval '5 hours');
SELECT * FROM lease.release('job-5', 'worker-a', 1);
SELECT acquired, epoch FROM lease.acquire('job-5', 'worker-b', interval '1 hour');
ROLLBACK;
SELECT f = :'fp0' AS unchanged FROM fingerprint;
SELECT held, owner, epoch FROM lease.inspect('job-5');

--
-- Distinct keys never interact (I11)
--
SELECT acquired, epoch FROM lease.acquire('job-6', 'worker-a', interval '1 hour');
SELECT acquired, epoch FROM lease.acquire('job-7', 'worker-a', interval '1 hour');
SELECT * FROM lease.release('job-6', 'worker-a', 1);
SELECT held, owner, epoch FROM lease.inspect('job-7');
SELECT acquired, epoch FROM lease.acquire('job-6', 'worker-b', interval '1 hour');
SELECT held, owner, epoch FROM lease.inspect('job-7');

--
-- Calling conventions: positional, named (p_ names), wait defaulting to 0;
-- every call returns exactly one row (inspect: zero or one)
--
SELECT acquired, epoch
  FROM lease.acquire(p_key => 'job-8', p_owner => 'worker-a', p_ttl => interval '1 hour');
SELECT status FROM lease.renew(p_key => 'job-8', p_owner => 'worker-a', p_epoch => 1, p_ttl => interval '1 hour');
SELECT held FROM lease.inspect(p_key => 'job-8');
SELECT * FROM lease.release(p_key => 'job-8', p_owner => 'worker-a', p_epoch => 1);
SELECT count(*) AS acquire_rows FROM lease.acquire('job-9', 'worker-a', interval '1 hour');
SELECT count(*) AS denied_rows FROM lease.acquire('job-9', 'worker-b', interval '1 hour');
SELECT count(*) AS renew_rows FROM lease.renew('job-9', 'worker-b', 1, interval '1 hour');
SELECT count(*) AS release_rows FROM lease.release('job-9', 'worker-b', 1);
SELECT count(*) AS inspect_rows FROM lease.inspect('job-9');
SELECT count(*) AS inspect_never_rows FROM lease.inspect('job-never');

--
-- Keys and owners are compared byte for byte
--
SELECT acquired, epoch FROM lease.acquire('Job-10', 'Worker-A', interval '1 hour');
SELECT acquired, epoch FROM lease.acquire('job-10', 'Worker-A', interval '1 hour');
SELECT acquired FROM lease.acquire('Job-10', 'worker-a', interval '1 hour');
SELECT acquired FROM lease.acquire('Job-10 ', 'Worker-A', interval '1 hour');

--
-- acquire, renew and release need a read-write transaction, as on a hot
-- standby; even the holder's re-acquire, which writes nothing, is refused
-- rather than answered from possibly stale state.  inspect still answers.
--
\set SHOW_CONTEXT never
SET default_transaction_read_only = on;
SELECT * FROM lease.acquire('job-1', 'worker-b', interval '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('job-1', 'worker-c', interval '1 hour');
SELECT * FROM lease.renew('job-1', 'worker-b', 3, interval '1 hour');
SELECT * FROM lease.release('job-1', 'worker-b', 3);
SELECT held, owner, epoch FROM lease.inspect('job-1');
RESET default_transaction_read_only;
\set SHOW_CONTEXT errors

--
-- A grant or release must survive a crash once its commit returned, or its
-- epoch could be handed out twice.  The level is raised at commit time, by a
-- deferred trigger, and the caller's own setting is left alone.  A deferred
-- trigger queued after pg_lease's reports the level the commit uses.
--
CREATE TABLE level_probe (x int);
CREATE FUNCTION report_level() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'commit level: %', current_setting('synchronous_commit');
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER report_level AFTER INSERT ON level_probe
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION report_level();
SET synchronous_commit = off;
BEGIN;
SELECT acquired FROM lease.acquire('job-durable', 'worker-a', interval '1 hour');
INSERT INTO level_probe VALUES (1);
SHOW synchronous_commit;
COMMIT;
SHOW synchronous_commit;
BEGIN;
SELECT status FROM lease.release('job-durable', 'worker-a', 1);
SET LOCAL synchronous_commit = off;
INSERT INTO level_probe VALUES (1);
COMMIT;
SET synchronous_commit = remote_apply;
BEGIN;
SELECT acquired FROM lease.acquire('job-durable', 'worker-a', interval '1 hour');
INSERT INTO level_probe VALUES (1);
COMMIT;
RESET synchronous_commit;
DROP TABLE level_probe;
DROP FUNCTION report_level();

SELECT * FROM stored;

DROP VIEW stored, fingerprint;
DROP EXTENSION pg_lease;
-- CREATE EXTENSION made the schema; it is not a member, so drop it too
DROP SCHEMA lease;
