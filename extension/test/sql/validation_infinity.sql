--
-- pg_lease: non-finite intervals are invalid input (SEMANTICS.md §3)
--
-- 'infinity' and '-infinity' are interval values from PostgreSQL 17 on.
-- There every call below raises 22023 (expected/validation_infinity.out);
-- before 17 the literal itself is rejected by the interval input function
-- (expected/validation_infinity_1.out), so no such value can reach pg_lease.
--
CREATE EXTENSION pg_lease;
\set SHOW_CONTEXT never
\set VERBOSITY default

SELECT acquired, epoch FROM lease.acquire('held', 'worker-a', interval '1 hour');

SELECT * FROM lease.acquire('held', 'worker-b', 'infinity'::interval);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('held', 'worker-b', '-infinity'::interval);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('held', 'worker-b', interval '1 hour', 'infinity'::interval);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('held', 'worker-b', interval '1 hour', '-infinity'::interval);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('', 'worker-b', 'infinity'::interval, 'infinity'::interval);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew('held', 'worker-a', 1, 'infinity'::interval);
\echo :LAST_ERROR_SQLSTATE

-- the live grant was not extended or otherwise touched
SELECT held, owner, epoch, expires_at < clock_timestamp() + interval '1 hour 1 minute' AS not_extended
  FROM lease.inspect('held');

DROP EXTENSION pg_lease;
-- CREATE EXTENSION made the schema; it is not a member, so drop it too
DROP SCHEMA lease;
