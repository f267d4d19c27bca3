-- W3 acquire and release, lease arm: alternates an acquire of the client's free key with
-- the release of that grant, one call per pgbench transaction. The runner splits the log
-- by position: even positions (0, 2, ...) are acquires of a FREE key, odd ones releases.
-- Needs -D phase=0.
\set lease_noset_phase 1 - :lease_noset_phase
\if :lease_noset_phase = 1
SELECT acquired, epoch FROM lease_noset.acquire('w3a-k03-' || :client_id::text, 'bench-' || :client_id::text, interval '5 minutes') \gset lease_noset_
\if NOT :lease_noset_acquired
\set lease_noset_failed 1/0
\endif
\else
SELECT status = 'ok' AS ok FROM lease_noset.release('w3a-k03-' || :client_id::text, 'bench-' || :client_id::text, :lease_noset_epoch) \gset lease_noset_
\if NOT :lease_noset_ok
\set lease_noset_failed 1/0
\endif
\endif
