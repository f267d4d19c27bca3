--
-- pg_lease: input validation (SEMANTICS.md §3, I9)
--
-- Every invalid call raises SQLSTATE 22023 with message
-- "pg_lease: invalid input" and a DETAIL naming every violated constraint,
-- and changes nothing.  Non-finite intervals exist only on PostgreSQL 17+
-- and are tested in validation_infinity.
--
CREATE EXTENSION pg_lease;
\set SHOW_CONTEXT never
\set VERBOSITY default

-- some state that invalid calls must leave alone
SELECT acquired, epoch FROM lease.acquire('held', 'worker-a', interval '1 hour');
SELECT acquired, epoch FROM lease.acquire('freed', 'worker-a', interval '1 hour');
SELECT status FROM lease.release('freed', 'worker-a', 1);
CREATE TEMP VIEW fingerprint AS
    SELECT md5(string_agg(format('%s|%s|%s|%s|%s', key, owner, epoch, expires_at, ctid),
                          ',' ORDER BY key)) AS f
      FROM lease.leases;
SELECT f AS fp0 FROM fingerprint \gset

--
-- key and owner: non-empty, at most 1000 bytes
--
SELECT * FROM lease.acquire(NULL, 'worker-a', interval '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('', 'worker-a', interval '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('held', NULL, interval '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('held', '', interval '1 hour');
\echo :LAST_ERROR_SQLSTATE
-- the limit counts bytes: 1001 ASCII bytes, and 501 two-byte characters
SELECT * FROM lease.acquire(repeat('k', 1001), 'worker-a', interval '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire(repeat(U&'\00e9', 501), 'worker-a', interval '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('held', repeat('o', 1001), interval '1 hour');
\echo :LAST_ERROR_SQLSTATE
-- keys far beyond the btree limit (2704 bytes) are still plain invalid input
SELECT * FROM lease.acquire(repeat('k', 3000), 'worker-a', interval '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew(repeat('k', 100000), 'worker-a', 1, interval '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.release(repeat('k', 100000), 'worker-a', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.inspect(repeat('k', 100000));
\echo :LAST_ERROR_SQLSTATE

--
-- ttl: positive, finite, no negative field, at most 1000 years
--
SELECT * FROM lease.acquire('held', 'worker-a', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('held', 'worker-a', interval '0');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('held', 'worker-a', interval '-1 second');
\echo :LAST_ERROR_SQLSTATE
-- compares equal to zero (a month counts as 30 days)
SELECT * FROM lease.acquire('held', 'worker-a', interval '1 month -30 days');
\echo :LAST_ERROR_SQLSTATE
-- compares greater than zero, but 2023-02-01 + it = 2023-01-31
SELECT * FROM lease.acquire('held', 'worker-a', interval '1 month -29 days');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('held', 'worker-a', interval '1 day -1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('held', 'worker-a', interval '1001 years');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew('held', 'worker-a', 1, interval '0');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew('held', 'worker-a', 1, NULL);
\echo :LAST_ERROR_SQLSTATE

--
-- wait: zero or more, finite, no negative field, at most 1000 years
--
SELECT * FROM lease.acquire('held', 'worker-a', interval '1 hour', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('held', 'worker-a', interval '1 hour', interval '-1 millisecond');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('held', 'worker-a', interval '1 hour', interval '1 day -1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('held', 'worker-a', interval '1 hour', interval '1001 years');
\echo :LAST_ERROR_SQLSTATE

--
-- epoch: not NULL (renew, release)
--
SELECT * FROM lease.renew('held', 'worker-a', NULL, interval '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.release('held', 'worker-a', NULL);
\echo :LAST_ERROR_SQLSTATE

--
-- one error names every violated constraint, in parameter order
--
SELECT * FROM lease.acquire(NULL, '', interval '0', interval '-1 second');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.acquire('', repeat('o', 1001), interval '1001 years', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.renew(NULL, NULL, NULL, NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.release('', '', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.inspect(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.inspect('');
\echo :LAST_ERROR_SQLSTATE

-- invalid renew and release of the live grant do not touch it either
SELECT * FROM lease.renew('held', 'worker-a', 1, interval '-1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM lease.release('held', '', 1);
\echo :LAST_ERROR_SQLSTATE

-- nothing above changed anything (I9)
SELECT f = :'fp0' AS unchanged FROM fingerprint;

--
-- the boundaries themselves are valid
--
SELECT acquired, epoch FROM lease.acquire(repeat('k', 1000), repeat('o', 1000), interval '1 microsecond');
SELECT acquired, epoch FROM lease.acquire(repeat(U&'\00e9', 500), 'worker-a', interval '1000 years');
SELECT acquired, epoch FROM lease.acquire('boundary', 'worker-a', interval '1 hour', interval '1000 years');
SELECT acquired, epoch FROM lease.acquire('boundary-0', 'worker-a', interval '1 hour', interval '0');
-- months are fine when no field is negative
SELECT acquired, epoch, expires_at > clock_timestamp() + interval '27 days' AS about_a_month
  FROM lease.acquire('month', 'worker-a', interval '1 month');
-- epoch values that no grant carries are not invalid, just mismatched
SELECT * FROM lease.renew('held', 'worker-a', -1, interval '1 hour');
SELECT * FROM lease.release('held', 'worker-a', 0);
SELECT * FROM lease.renew('held', 'worker-a', 9223372036854775807, interval '1 hour');

DROP VIEW fingerprint;
DROP EXTENSION pg_lease;
-- CREATE EXTENSION made the schema; it is not a member, so drop it too
DROP SCHEMA lease;
