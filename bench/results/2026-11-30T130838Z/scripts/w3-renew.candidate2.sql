-- W3 renew, lease arm: heartbeats of a lease the client holds. The client's first
-- transaction takes the lease (position 0, left out of the statistics); every later one is
-- a renew. Needs -D epoch=-1.
\if :candidate2_epoch < 0
SELECT acquired, epoch FROM lease_cand2.acquire('w3r-k06-' || :client_id::text, 'bench-' || :client_id::text, interval '5 minutes') \gset candidate2_
\if NOT :candidate2_acquired
\set candidate2_failed 1/0
\endif
\else
SELECT status = 'ok' AS ok FROM lease_cand2.renew('w3r-k06-' || :client_id::text, 'bench-' || :client_id::text, :candidate2_epoch, interval '5 minutes') \gset candidate2_
\if NOT :candidate2_ok
\set candidate2_failed 1/0
\endif
\endif
