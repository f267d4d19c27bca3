-- W4 fenced trigger, lease arm: one autocommit UPDATE of app.jobs_fenced, whose
-- lease.fence_row trigger fences the row by its own key and epoch (so one statement, one
-- round trip, like the bare arm). The client's first transaction takes the lease and makes
-- its row (position 0, left out). A refused write (PLF01) aborts the run. Needs -D epoch=-1.
\if :lease_epoch < 0
SELECT acquired, epoch FROM lease.acquire('w4t-k00-' || :client_id::text, 'bench-' || :client_id::text, interval '1 hour') \gset lease_
\if NOT :lease_acquired
\set lease_failed 1/0
\endif
INSERT INTO app.jobs_fenced (key, epoch, n) VALUES ('w4t-k00-' || :client_id::text, :lease_epoch, 0)
  ON CONFLICT (key) DO UPDATE SET epoch = excluded.epoch;
\else
UPDATE app.jobs_fenced SET n = n + 1, epoch = :lease_epoch WHERE key = 'w4t-k00-' || :client_id::text
  RETURNING true AS ok \gset lease_
\endif
