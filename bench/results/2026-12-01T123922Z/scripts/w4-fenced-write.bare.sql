-- W4 fenced write, bare baseline: the same one-row UPDATE of app.jobs in the same
-- transaction shape (BEGIN, UPDATE, COMMIT), without the fence. The first transaction makes
-- the client's row (position 0, left out). Needs -D epoch=-1.
\if :bare_epoch < 0
INSERT INTO app.jobs AS j (key, epoch, n) VALUES ('w4-k01-' || :client_id::text, 1, 0)
  ON CONFLICT (key) DO UPDATE SET epoch = excluded.epoch
  RETURNING j.epoch \gset bare_
\else
BEGIN;
UPDATE app.jobs SET n = n + 1, epoch = :bare_epoch WHERE key = 'w4-k01-' || :client_id::text
  RETURNING true AS ok \gset bare_
END;
\endif
