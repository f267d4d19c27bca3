-- W2-contend, bare baseline: the conditional upsert on the same 4 shared keys; it grants
-- a free or lapsed key and leaves a held one alone (locking it, as ON CONFLICT does).
\set bare_k random(1, 4)
INSERT INTO bare.leases AS l (key, owner, epoch, expires_at)
  VALUES ('w2-k01-' || :bare_k::text, 'bench-' || :client_id::text, 1, clock_timestamp() + interval '20 milliseconds')
  ON CONFLICT (key) DO UPDATE
    SET owner = excluded.owner, epoch = l.epoch + 1, expires_at = excluded.expires_at
    WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp();
