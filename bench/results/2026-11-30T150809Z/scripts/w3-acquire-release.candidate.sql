-- W3 acquire and release, lease arm: alternates an acquire of the client's free key with
-- the release of that grant, one call per pgbench transaction. The runner splits the log
-- by position: even positions (0, 2, ...) are acquires of a FREE key, odd ones releases.
-- Needs -D phase=0.
\set candidate_phase 1 - :candidate_phase
\if :candidate_phase = 1
SELECT acquired, epoch FROM lease_cand1.acquire('w3a-k05-' || :client_id::text, 'bench-' || :client_id::text, interval '5 minutes') \gset candidate_
\if NOT :candidate_acquired
\set candidate_failed 1/0
\endif
\else
SELECT status = 'ok' AS ok FROM lease_cand1.release('w3a-k05-' || :client_id::text, 'bench-' || :client_id::text, :candidate_epoch) \gset candidate_
\if NOT :candidate_ok
\set candidate_failed 1/0
\endif
\endif
