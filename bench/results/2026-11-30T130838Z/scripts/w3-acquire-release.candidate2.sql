-- W3 acquire and release, lease arm: alternates an acquire of the client's free key with
-- the release of that grant, one call per pgbench transaction. The runner splits the log
-- by position: even positions (0, 2, ...) are acquires of a FREE key, odd ones releases.
-- Needs -D phase=0.
\set candidate2_phase 1 - :candidate2_phase
\if :candidate2_phase = 1
SELECT acquired, epoch FROM lease_cand2.acquire('w3a-k06-' || :client_id::text, 'bench-' || :client_id::text, interval '5 minutes') \gset candidate2_
\if NOT :candidate2_acquired
\set candidate2_failed 1/0
\endif
\else
SELECT status = 'ok' AS ok FROM lease_cand2.release('w3a-k06-' || :client_id::text, 'bench-' || :client_id::text, :candidate2_epoch) \gset candidate2_
\if NOT :candidate2_ok
\set candidate2_failed 1/0
\endif
\endif
