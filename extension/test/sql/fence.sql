--
-- fence: lease.fence and the lease.fence_row trigger (SEMANTICS.md §10
-- Fence).  Every refusal with its DETAIL, invalid input, the trigger's
-- checks, and a table owner that is no superuser and cannot read
-- lease.leases.  The races are in test/extension/fence.test.ts.
--
CREATE EXTENSION pg_lease;
\set SHOW_CONTEXT never
\set VERBOSITY default

SELECT acquired, epoch FROM lease.acquire('held', 'a', interval '1 hour');
SELECT acquired, epoch FROM lease.acquire('free', 'a', interval '1 hour');
SELECT status FROM lease.release('free', 'a', 1);
SELECT acquired, epoch FROM lease.acquire('lapsed', 'a', interval '1 millisecond');
SELECT pg_sleep(0.01);

-- the live grant passes, and holds the row until the transaction ends
BEGIN;
SELECT lease.fence('held', 1);
SELECT l.xmax = pg_catalog.xid(pg_current_xact_id()) AS locked_by_this_transaction
  FROM lease.leases AS l WHERE l.key = 'held';
COMMIT;

-- every other epoch is refused: PLF01 with what stands now
SELECT lease.fence('held', 2);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fence('held', 0);
SELECT lease.fence('held', -1);
SELECT lease.fence('free', 1);
SELECT lease.fence('free', 2);
SELECT lease.fence('free', 3);
SELECT lease.fence('lapsed', 1);
SELECT lease.fence('lapsed', 2);
SELECT lease.fence('never', 1);
SELECT lease.fence('say "hi"', 1);

-- invalid input: 22023, every violation named
SELECT lease.fence(NULL, 1);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fence('', 1);
SELECT lease.fence(repeat('k', 1001), 1);
SELECT lease.fence('held', NULL);
SELECT lease.fence(NULL, NULL);

-- a refused fence aborts the transaction; nothing changed
SELECT key, owner, epoch, expires_at > clock_timestamp() AS live FROM lease.leases ORDER BY key;

--
-- lease.fence_row, attached by a table owner that is no superuser
--
CREATE ROLE regress_fence_owner;
CREATE ROLE regress_fence_writer;
CREATE SCHEMA regress_fence AUTHORIZATION regress_fence_owner;
SET ROLE regress_fence_owner;
CREATE TABLE regress_fence.jobs (
    id          int PRIMARY KEY,
    lease_key   text,
    lease_epoch bigint,
    result      text);
CREATE TRIGGER jobs_fence BEFORE INSERT OR UPDATE ON regress_fence.jobs
    FOR EACH ROW EXECUTE FUNCTION lease.fence_row('lease_key', 'lease_epoch');
-- the owner cannot read the lease table, yet its rows are fenced
SELECT count(*) FROM lease.leases;
INSERT INTO regress_fence.jobs VALUES (1, 'held', 1, 'first');
INSERT INTO regress_fence.jobs VALUES (2, 'held', 2, 'stale');
\echo :LAST_ERROR_SQLSTATE
INSERT INTO regress_fence.jobs VALUES (3, 'free', 1, 'released');
INSERT INTO regress_fence.jobs VALUES (4, 'lapsed', 1, 'too late');
INSERT INTO regress_fence.jobs VALUES (5, 'never', 1, 'made up');
-- a NULL key or epoch is rejected
INSERT INTO regress_fence.jobs VALUES (6, NULL, 1, 'no key');
\echo :LAST_ERROR_SQLSTATE
INSERT INTO regress_fence.jobs VALUES (7, 'held', NULL, 'no epoch');
-- updates are fenced by the new row; several rows in one statement each
UPDATE regress_fence.jobs SET result = 'second' WHERE id = 1;
UPDATE regress_fence.jobs SET lease_epoch = 2 WHERE id = 1;
INSERT INTO regress_fence.jobs VALUES (8, 'held', 1, 'a'), (9, 'held', 1, 'b');
INSERT INTO regress_fence.jobs VALUES (10, 'held', 1, 'c'), (11, 'free', 2, 'd');
INSERT INTO regress_fence.jobs VALUES (12, 'held', 1, 'e')
    ON CONFLICT (id) DO UPDATE SET result = excluded.result;
INSERT INTO regress_fence.jobs VALUES (1, 'free', 2, 'f')
    ON CONFLICT (id) DO UPDATE SET result = excluded.result, lease_key = excluded.lease_key,
                                   lease_epoch = excluded.lease_epoch;
SELECT id, lease_key, lease_epoch, result FROM regress_fence.jobs ORDER BY id;
-- another role writing to the table is fenced the same way
GRANT USAGE ON SCHEMA regress_fence TO regress_fence_writer;
GRANT INSERT, UPDATE, SELECT ON regress_fence.jobs TO regress_fence_writer;
RESET ROLE;
SET ROLE regress_fence_writer;
INSERT INTO regress_fence.jobs VALUES (20, 'held', 1, 'writer');
INSERT INTO regress_fence.jobs VALUES (21, 'lapsed', 1, 'writer, too late');
RESET ROLE;

-- DELETE is refused when the trigger is attached for it
SET ROLE regress_fence_owner;
CREATE TRIGGER jobs_fence_delete BEFORE DELETE ON regress_fence.jobs
    FOR EACH ROW EXECUTE FUNCTION lease.fence_row('lease_key', 'lease_epoch');
DELETE FROM regress_fence.jobs WHERE id = 20;
\echo :LAST_ERROR_SQLSTATE
DROP TRIGGER jobs_fence_delete ON regress_fence.jobs;
-- so is a statement-level trigger
CREATE TRIGGER jobs_fence_statement BEFORE UPDATE ON regress_fence.jobs
    FOR EACH STATEMENT EXECUTE FUNCTION lease.fence_row('lease_key', 'lease_epoch');
UPDATE regress_fence.jobs SET result = 'x' WHERE false;
DROP TRIGGER jobs_fence_statement ON regress_fence.jobs;
-- an AFTER ROW trigger fences the final row
DROP TRIGGER jobs_fence ON regress_fence.jobs;
CREATE TRIGGER jobs_fence AFTER INSERT OR UPDATE ON regress_fence.jobs
    FOR EACH ROW EXECUTE FUNCTION lease.fence_row('lease_key', 'lease_epoch');
INSERT INTO regress_fence.jobs VALUES (30, 'held', 1, 'after');
INSERT INTO regress_fence.jobs VALUES (31, 'held', 2, 'after, stale');
DROP TRIGGER jobs_fence ON regress_fence.jobs;

-- bad arguments: a clear error at the first write
CREATE TABLE regress_fence.odd (id int, k text, e bigint, n int, v varchar, c uuid);
CREATE TRIGGER t BEFORE INSERT ON regress_fence.odd
    FOR EACH ROW EXECUTE FUNCTION lease.fence_row('k');
INSERT INTO regress_fence.odd (id) VALUES (1);
\echo :LAST_ERROR_SQLSTATE
DROP TRIGGER t ON regress_fence.odd;
CREATE TRIGGER t BEFORE INSERT ON regress_fence.odd
    FOR EACH ROW EXECUTE FUNCTION lease.fence_row();
INSERT INTO regress_fence.odd (id) VALUES (1);
DROP TRIGGER t ON regress_fence.odd;
CREATE TRIGGER t BEFORE INSERT ON regress_fence.odd
    FOR EACH ROW EXECUTE FUNCTION lease.fence_row('missing', 'e');
INSERT INTO regress_fence.odd (id) VALUES (1);
\echo :LAST_ERROR_SQLSTATE
DROP TRIGGER t ON regress_fence.odd;
CREATE TRIGGER t BEFORE INSERT ON regress_fence.odd
    FOR EACH ROW EXECUTE FUNCTION lease.fence_row('k', 'missing');
INSERT INTO regress_fence.odd (id) VALUES (1);
DROP TRIGGER t ON regress_fence.odd;
CREATE TRIGGER t BEFORE INSERT ON regress_fence.odd
    FOR EACH ROW EXECUTE FUNCTION lease.fence_row('k', 'n');
INSERT INTO regress_fence.odd (id) VALUES (1);
\echo :LAST_ERROR_SQLSTATE
DROP TRIGGER t ON regress_fence.odd;
CREATE TRIGGER t BEFORE INSERT ON regress_fence.odd
    FOR EACH ROW EXECUTE FUNCTION lease.fence_row('c', 'e');
INSERT INTO regress_fence.odd (id) VALUES (1);
DROP TRIGGER t ON regress_fence.odd;
ALTER TABLE regress_fence.odd DROP COLUMN n;
CREATE TRIGGER t BEFORE INSERT ON regress_fence.odd
    FOR EACH ROW EXECUTE FUNCTION lease.fence_row('k', '........pg.dropped.4........');
INSERT INTO regress_fence.odd (id) VALUES (1);
DROP TRIGGER t ON regress_fence.odd;
-- a varchar key column is fine
CREATE TRIGGER t BEFORE INSERT ON regress_fence.odd
    FOR EACH ROW EXECUTE FUNCTION lease.fence_row('v', 'e');
INSERT INTO regress_fence.odd (id, v, e) VALUES (1, 'held', 1);
INSERT INTO regress_fence.odd (id, v, e) VALUES (2, 'held', 2);
SELECT id, v, e FROM regress_fence.odd;
RESET ROLE;

SET client_min_messages = warning;
DROP SCHEMA regress_fence CASCADE;
RESET client_min_messages;
DROP ROLE regress_fence_owner;
DROP ROLE regress_fence_writer;
DROP EXTENSION pg_lease;
DROP SCHEMA lease;
