-- W4 fenced write, lease arm: a business write under the lease the client holds, fenced by
-- the database: BEGIN, lease.fence(key, epoch), a one-row UPDATE of app.jobs, COMMIT. The
-- client's first transaction takes the lease and makes its row (position 0, left out of the
-- statistics). A refused fence (PLF01) aborts the run. Needs -D epoch=-1.
\if :lease_noset_epoch < 0
SELECT acquired, epoch FROM lease_noset.acquire('w4-k03-' || :client_id::text, 'bench-' || :client_id::text, interval '1 hour') \gset lease_noset_
\if NOT :lease_noset_acquired
\set lease_noset_failed 1/0
\endif
INSERT INTO app.jobs (key, epoch, n) VALUES ('w4-k03-' || :client_id::text, :lease_noset_epoch, 0)
  ON CONFLICT (key) DO UPDATE SET epoch = excluded.epoch;
\else
BEGIN;
SELECT lease_noset.fence('w4-k03-' || :client_id::text, :lease_noset_epoch);
UPDATE app.jobs SET n = n + 1, epoch = :lease_noset_epoch WHERE key = 'w4-k03-' || :client_id::text
  RETURNING true AS ok \gset lease_noset_
END;
\endif
