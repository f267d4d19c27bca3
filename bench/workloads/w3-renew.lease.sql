-- W3 renew, lease arm: heartbeats of a lease the client holds. The client's first
-- transaction takes the lease (position 0, left out of the statistics); every later one is
-- a renew. Needs -D epoch=-1.
\if :epoch < 0
SELECT acquired, epoch FROM lease.acquire('w3r-' || :client_id::text, 'bench-' || :client_id::text, interval '5 minutes') \gset
\if NOT :acquired
\set failed 1/0
\endif
\else
SELECT status = 'ok' AS ok FROM lease.renew('w3r-' || :client_id::text, 'bench-' || :client_id::text, :epoch, interval '5 minutes') \gset
\if NOT :ok
\set failed 1/0
\endif
\endif
