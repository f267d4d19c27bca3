-- W3 acquire and release, lease arm: alternates an acquire of the client's free key with
-- the release of that grant, one call per pgbench transaction. The runner splits the log
-- by position: even positions (0, 2, ...) are acquires of a FREE key, odd ones releases.
-- Needs -D phase=0.
\set phase 1 - :phase
\if :phase = 1
SELECT acquired, epoch FROM lease.acquire('w3a-' || :client_id::text, 'bench-' || :client_id::text, interval '5 minutes') \gset
\if NOT :acquired
\set failed 1/0
\endif
\else
SELECT status = 'ok' AS ok FROM lease.release('w3a-' || :client_id::text, 'bench-' || :client_id::text, :epoch) \gset
\if NOT :ok
\set failed 1/0
\endif
\endif
