-- W3 renew, lease arm: heartbeats of a lease the client holds. The client's first
-- transaction takes the lease (position 0, left out of the statistics); every later one is
-- a renew. Needs -D epoch=-1.
\if :lease_epoch < 0
SELECT acquired, epoch FROM lease.acquire('w3r-k00-' || :client_id::text, 'bench-' || :client_id::text, interval '5 minutes') \gset lease_
\if NOT :lease_acquired
\set lease_failed 1/0
\endif
\else
SELECT status = 'ok' AS ok FROM lease.renew('w3r-k00-' || :client_id::text, 'bench-' || :client_id::text, :lease_epoch, interval '5 minutes') \gset lease_
\if NOT :lease_ok
\set lease_failed 1/0
\endif
\endif
