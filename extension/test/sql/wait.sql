--
-- pg_lease: blocking acquire within one session (SEMANTICS.md §4, wait > 0)
--
-- Timing is checked as booleans with generous slack for slow machines; the
-- contract's bound is wait + one poll interval (50 ms) + one attempt, and
-- the tests allow 500 ms on top of wait + 50 ms.  Races with other sessions
-- are in test/extension/concurrency.test.ts (waiting acquires).
--
CREATE EXTENSION pg_lease;
\pset null '(null)'
\set SHOW_CONTEXT never
\set VERBOSITY default

-- Runs one acquire and reports its result or its error, and how long it took.
CREATE FUNCTION pg_temp.timed_acquire(p_key text, p_owner text, p_ttl interval, p_wait interval)
    RETURNS TABLE (acquired boolean, epoch bigint, state text, message text, detail text,
                   elapsed interval)
    LANGUAGE plpgsql AS $$
DECLARE
    v_start timestamptz := clock_timestamp();
BEGIN
    BEGIN
        SELECT a.acquired, a.epoch INTO acquired, epoch
          FROM lease.acquire(p_key, p_owner, p_ttl, p_wait) AS a;
    EXCEPTION WHEN query_canceled THEN
        GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE,
                                message = MESSAGE_TEXT,
                                detail = PG_EXCEPTION_DETAIL;
    END;
    elapsed := clock_timestamp() - v_start;
    RETURN NEXT;
END $$;

CREATE TEMP VIEW fingerprint AS
    SELECT md5(string_agg(format('%s|%s|%s|%s|%s', key, owner, epoch, expires_at, ctid),
                          ',' ORDER BY key)) AS f
      FROM lease.leases;

SELECT acquired, epoch FROM lease.acquire('job-1', 'worker-a', interval '1 hour');
SELECT f AS fp0 FROM fingerprint \gset

--
-- Still held when the wait runs out: 57014, after at least wait and within
-- the bound, with nothing changed
--
SELECT acquired, epoch, state, message, detail,
       elapsed >= interval '300 milliseconds' AS waited_the_wait,
       elapsed < interval '300 milliseconds' + interval '50 milliseconds'
                 + interval '500 milliseconds' AS within_bound
  FROM pg_temp.timed_acquire('job-1', 'worker-b', interval '1 hour', interval '300 milliseconds');
SELECT f = :'fp0' AS unchanged FROM fingerprint;

-- as the client sees it
SELECT * FROM lease.acquire('job-1', 'worker-b', interval '1 hour', interval '100 milliseconds');
\echo :LAST_ERROR_SQLSTATE

-- the key in DETAIL is quoted, embedded double quotes doubled
SELECT acquired, epoch FROM lease.acquire('say "hi"', 'worker-a', interval '1 hour');
SELECT state, detail
  FROM pg_temp.timed_acquire('say "hi"', 'worker-b', interval '1 hour', interval '60 milliseconds');

-- a timed-out wait took no lock and wrote nothing: no transaction id was needed
BEGIN;
SELECT state FROM pg_temp.timed_acquire('job-1', 'worker-b', interval '1 hour', interval '120 milliseconds');
SELECT pg_current_xact_id_if_assigned() IS NULL AS wrote_nothing;
COMMIT;

--
-- wait = 0 never sleeps: twenty denied calls take far less than one poll
-- interval each
--
DO $$
DECLARE
    v_start timestamptz := clock_timestamp();
    v_denied integer := 0;
BEGIN
    FOR i IN 1..20 LOOP
        IF NOT (SELECT a.acquired FROM lease.acquire('job-1', 'worker-b', interval '1 hour') AS a) THEN
            v_denied := v_denied + 1;
        END IF;
    END LOOP;
    -- one sleep per call would take 20 * 50 ms = 1 s
    RAISE NOTICE 'denied % of 20, all within 500 ms: %', v_denied,
        clock_timestamp() - v_start < interval '500 milliseconds';
END $$;

--
-- A lapse during the wait: the waiter takes over with the next epoch as
-- soon as the grant it waits for has lapsed
--
SELECT acquired, epoch FROM lease.acquire('job-2', 'worker-a', interval '300 milliseconds');
SELECT acquired, epoch, state,
       elapsed < interval '300 milliseconds' + interval '50 milliseconds'
                 + interval '500 milliseconds' AS soon_after_lapse
  FROM pg_temp.timed_acquire('job-2', 'worker-b', interval '1 hour', interval '10 seconds');
SELECT held, owner, epoch FROM lease.inspect('job-2');

--
-- A key that is free, never granted, or held by the caller: the first
-- attempt answers, no sleep
--
SELECT status FROM lease.release('job-2', 'worker-b', 2);
SELECT acquired, epoch, state, elapsed < interval '1 second' AS prompt
  FROM pg_temp.timed_acquire('job-2', 'worker-c', interval '1 hour', interval '10 seconds');
SELECT acquired, epoch, state, elapsed < interval '1 second' AS prompt
  FROM pg_temp.timed_acquire('job-3', 'worker-c', interval '1 hour', interval '10 seconds');
SELECT acquired, epoch, state, elapsed < interval '1 second' AS prompt
  FROM pg_temp.timed_acquire('job-3', 'worker-c', interval '1 hour', interval '10 seconds');

--
-- A blocking acquire bounds its lock waits with lock_timeout internally;
-- the caller's own setting is untouched afterwards, in and out of a
-- transaction block
--
SHOW lock_timeout;
SELECT acquired FROM lease.acquire('job-4', 'worker-a', interval '1 hour', interval '1 second');
SHOW lock_timeout;
BEGIN;
SET LOCAL lock_timeout = '7s';
SELECT acquired FROM lease.acquire('job-5', 'worker-a', interval '1 hour', interval '1 second');
SELECT state FROM pg_temp.timed_acquire('job-1', 'worker-b', interval '1 hour', interval '60 milliseconds');
SHOW lock_timeout;
COMMIT;
SHOW lock_timeout;

DROP VIEW fingerprint;
DROP EXTENSION pg_lease;
-- CREATE EXTENSION made the schema; it is not a member, so drop it too
DROP SCHEMA lease;
