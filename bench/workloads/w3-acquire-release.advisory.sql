-- W3 acquire and release, in-memory ceiling: session advisory lock, then unlock,
-- alternating. Needs -D phase=0.
\set phase 1 - :phase
\if :phase = 1
SELECT pg_try_advisory_lock(3, :client_id) AS acquired \gset
\if NOT :acquired
\set failed 1/0
\endif
\else
SELECT pg_advisory_unlock(3, :client_id) AS ok \gset
\if NOT :ok
\set failed 1/0
\endif
\endif
