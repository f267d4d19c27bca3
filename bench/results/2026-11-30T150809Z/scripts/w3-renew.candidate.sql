-- W3 renew, lease arm: heartbeats of a lease the client holds. The client's first
-- transaction takes the lease (position 0, left out of the statistics); every later one is
-- a renew. Needs -D epoch=-1.
\if :candidate_epoch < 0
SELECT acquired, epoch FROM lease_cand1.acquire('w3r-k05-' || :client_id::text, 'bench-' || :client_id::text, interval '5 minutes') \gset candidate_
\if NOT :candidate_acquired
\set candidate_failed 1/0
\endif
\else
SELECT status = 'ok' AS ok FROM lease_cand1.renew('w3r-k05-' || :client_id::text, 'bench-' || :client_id::text, :candidate_epoch, interval '5 minutes') \gset candidate_
\if NOT :candidate_ok
\set candidate_failed 1/0
\endif
\endif
