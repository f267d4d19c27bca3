-- W3 renew, lease arm: heartbeats of a lease the client holds. The client's first
-- transaction takes the lease (position 0, left out of the statistics); every later one is
-- a renew. Needs -D epoch=-1.
\if :lease_plain_epoch < 0
SELECT acquired, epoch FROM lease_plain.acquire('w3r-k04-' || :client_id::text, 'bench-' || :client_id::text, interval '5 minutes') \gset lease_plain_
\if NOT :lease_plain_acquired
\set lease_plain_failed 1/0
\endif
\else
SELECT status = 'ok' AS ok FROM lease_plain.renew('w3r-k04-' || :client_id::text, 'bench-' || :client_id::text, :lease_plain_epoch, interval '5 minutes') \gset lease_plain_
\if NOT :lease_plain_ok
\set lease_plain_failed 1/0
\endif
\endif
