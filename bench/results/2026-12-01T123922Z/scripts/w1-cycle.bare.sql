-- W1-cycle, bare baseline: the same three writes as plain SQL on bare.leases (same row
-- shape and indexes as lease.leases): conditional upsert, single-row update, single-row
-- update. \gset of zero rows aborts the client, so every step must succeed.
INSERT INTO bare.leases AS l (key, owner, epoch, expires_at)
  VALUES ('w1-k01-' || :client_id::text, 'bench-' || :client_id::text, 1, clock_timestamp() + interval '5 minutes')
  ON CONFLICT (key) DO UPDATE
    SET owner = excluded.owner, epoch = l.epoch + 1, expires_at = excluded.expires_at
    WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp()
  RETURNING l.epoch \gset bare_
UPDATE bare.leases SET expires_at = clock_timestamp() + interval '5 minutes'
  WHERE key = 'w1-k01-' || :client_id::text AND owner = 'bench-' || :client_id::text
    AND epoch = :bare_epoch AND expires_at > clock_timestamp()
  RETURNING true AS ok \gset bare_
UPDATE bare.leases SET owner = NULL, expires_at = NULL, epoch = epoch + 1
  WHERE key = 'w1-k01-' || :client_id::text AND owner = 'bench-' || :client_id::text
    AND epoch = :bare_epoch AND expires_at > clock_timestamp()
  RETURNING true AS ok \gset bare_
