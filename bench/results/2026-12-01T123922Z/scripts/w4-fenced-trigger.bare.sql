-- W4 fenced trigger, bare baseline: the same autocommit UPDATE on app.jobs, a table of the
-- same shape without the trigger. The first transaction makes the client's row (position 0,
-- left out). Needs -D epoch=-1.
\if :bare_epoch < 0
INSERT INTO app.jobs AS j (key, epoch, n) VALUES ('w4t-k01-' || :client_id::text, 1, 0)
  ON CONFLICT (key) DO UPDATE SET epoch = excluded.epoch
  RETURNING j.epoch \gset bare_
\else
UPDATE app.jobs SET n = n + 1, epoch = :bare_epoch WHERE key = 'w4t-k01-' || :client_id::text
  RETURNING true AS ok \gset bare_
\endif
