-- W1-cycle, in-memory ceiling: a session advisory lock taken and given back (two round
-- trips, no table, no WAL, no commit flush). Advisory locks have no renew step.
SELECT pg_try_advisory_lock(1, :client_id) AS acquired \gset advisory_
\if NOT :advisory_acquired
\set advisory_failed 1/0
\endif
SELECT pg_advisory_unlock(1, :client_id) AS ok \gset advisory_
\if NOT :advisory_ok
\set advisory_failed 1/0
\endif
