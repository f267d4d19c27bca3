-- W3 inspect, bare baseline: the primary-key SELECT of the same row shape.
SELECT owner, epoch, expires_at FROM bare.leases WHERE key = 'w3i-k01-' || :client_id::text \gset bare_
