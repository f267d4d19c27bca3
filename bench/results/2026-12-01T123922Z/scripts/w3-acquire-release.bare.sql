-- W3 acquire and release, bare baseline: the conditional upsert, then the single-row
-- update that frees the row, alternating as in the lease arm. Needs -D phase=0.
\set bare_phase 1 - :bare_phase
\if :bare_phase = 1
INSERT INTO bare.leases AS l (key, owner, epoch, expires_at)
  VALUES ('w3a-k01-' || :client_id::text, 'bench-' || :client_id::text, 1, clock_timestamp() + interval '5 minutes')
  ON CONFLICT (key) DO UPDATE
    SET owner = excluded.owner, epoch = l.epoch + 1, expires_at = excluded.expires_at
    WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp()
  RETURNING l.epoch \gset bare_
\else
UPDATE bare.leases SET owner = NULL, expires_at = NULL, epoch = epoch + 1
  WHERE key = 'w3a-k01-' || :client_id::text AND owner = 'bench-' || :client_id::text
    AND epoch = :bare_epoch AND expires_at > clock_timestamp()
  RETURNING true AS ok \gset bare_
\endif
