-- W3 renew, bare baseline: the single-row update that extends a held row, after a first
-- transaction that takes it (position 0, left out). Needs -D epoch=-1.
\if :bare_epoch < 0
INSERT INTO bare.leases AS l (key, owner, epoch, expires_at)
  VALUES ('w3r-k01-' || :client_id::text, 'bench-' || :client_id::text, 1, clock_timestamp() + interval '5 minutes')
  ON CONFLICT (key) DO UPDATE
    SET owner = excluded.owner, epoch = l.epoch + 1, expires_at = excluded.expires_at
    WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp()
  RETURNING l.epoch \gset bare_
\else
UPDATE bare.leases SET expires_at = clock_timestamp() + interval '5 minutes'
  WHERE key = 'w3r-k01-' || :client_id::text AND owner = 'bench-' || :client_id::text
    AND epoch = :bare_epoch AND expires_at > clock_timestamp()
  RETURNING true AS ok \gset bare_
\endif
