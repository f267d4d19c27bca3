-- W3 acquire and release, lease arm: alternates an acquire of the client's free key with
-- the release of that grant, one call per pgbench transaction. The runner splits the log
-- by position: even positions (0, 2, ...) are acquires of a FREE key, odd ones releases.
-- Needs -D phase=0.
\set lease_phase 1 - :lease_phase
\if :lease_phase = 1
SELECT acquired, epoch FROM lease.acquire('w3a-k00-' || :client_id::text, 'bench-' || :client_id::text, interval '5 minutes') \gset lease_
\if NOT :lease_acquired
\set lease_failed 1/0
\endif
\else
SELECT status = 'ok' AS ok FROM lease.release('w3a-k00-' || :client_id::text, 'bench-' || :client_id::text, :lease_epoch) \gset lease_
\if NOT :lease_ok
\set lease_failed 1/0
\endif
\endif
