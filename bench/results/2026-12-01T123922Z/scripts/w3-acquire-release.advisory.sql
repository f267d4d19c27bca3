-- W3 acquire and release, in-memory ceiling: session advisory lock, then unlock,
-- alternating. Needs -D phase=0.
\set advisory_phase 1 - :advisory_phase
\if :advisory_phase = 1
SELECT pg_try_advisory_lock(3, :client_id) AS acquired \gset advisory_
\if NOT :advisory_acquired
\set advisory_failed 1/0
\endif
\else
SELECT pg_advisory_unlock(3, :client_id) AS ok \gset advisory_
\if NOT :advisory_ok
\set advisory_failed 1/0
\endif
\endif
