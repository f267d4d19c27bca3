--
-- pg_lease: installation, privileges and search_path safety (SEMANTICS.md §1)
--
-- The extension is trusted: a role with CREATE on the database installs it,
-- and the install script runs as the bootstrap superuser (OID 10), which
-- owns the schema, the table and the functions.  The API functions are
-- SECURITY DEFINER and so run as that superuser: nothing a caller places on
-- its search_path or in pg_temp, and nothing the installer places in or
-- around schema lease, may run in their place.
--
\set SHOW_CONTEXT never
\set VERBOSITY default
SELECT current_database() AS dbname \gset

CREATE ROLE regress_lease_installer;
CREATE ROLE regress_lease_app;
CREATE ROLE regress_lease_intruder;
GRANT CREATE ON DATABASE :"dbname" TO regress_lease_installer;

--
-- a non-superuser with CREATE on the database installs it
--
SET ROLE regress_lease_installer;
CREATE EXTENSION pg_lease;
RESET ROLE;

SELECT e.extname, e.extversion, e.extowner::regrole AS extension_owner,
       n.nspname AS schema, n.nspowner = 10 AS schema_owned_by_bootstrap_superuser,
       e.extrelocatable
  FROM pg_extension AS e
  JOIN pg_namespace AS n ON n.oid = e.extnamespace
 WHERE e.extname = 'pg_lease';

-- one table, indexed by its primary key only
SELECT c.oid::regclass AS relation, c.relowner = 10 AS owned_by_bootstrap_superuser,
       c.reloptions,
       (SELECT array_agg(i.indexrelid::regclass) FROM pg_index AS i
         WHERE i.indrelid = c.oid) AS indexes,
       obj_description(c.oid, 'pg_class') IS NOT NULL AS documented
  FROM pg_class AS c
 WHERE c.relnamespace = 'lease'::regnamespace AND c.relkind = 'r';

-- the API is SECURITY DEFINER, executable by anyone and documented; the
-- helpers are neither; every PL/pgSQL function pins search_path (the SQL
-- helpers have SQL-standard bodies, bound when they were created)
SELECT p.oid::regprocedure AS function,
       p.proowner = 10 AS owned_by_bootstrap_superuser,
       p.prosecdef AS security_definer,
       p.provolatile AS volatility,
       p.proconfig,
       has_function_privilege('regress_lease_app', p.oid, 'EXECUTE') AS app_may_execute,
       obj_description(p.oid, 'pg_proc') IS NOT NULL AS documented
  FROM pg_proc AS p
 WHERE p.pronamespace = 'lease'::regnamespace
 ORDER BY p.proname, p.pronargs;

--
-- Neither PUBLIC nor the installer may touch the table or the helpers;
-- PUBLIC may call the API
--
SELECT priv,
       has_table_privilege('regress_lease_app', 'lease.leases', priv) AS app,
       has_table_privilege('regress_lease_installer', 'lease.leases', priv) AS installer
  FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE',
                    'REFERENCES', 'TRIGGER']) AS priv;

SET ROLE regress_lease_app;
SELECT acquired, epoch FROM lease.acquire('job-1', 'app', interval '1 hour');
SELECT status FROM lease.renew('job-1', 'app', 1, interval '1 hour');
SELECT held, owner, epoch FROM lease.inspect('job-1');
SELECT * FROM lease.leases;
INSERT INTO lease.leases VALUES ('job-2', 'app', 1, now() + interval '1 hour');
UPDATE lease.leases SET epoch = 1;
DELETE FROM lease.leases;
TRUNCATE lease.leases;
SELECT lease._validate('acquire', ARRAY['k'], 'o', NULL, interval '1 hour', interval '0');
SELECT * FROM lease._acquire_wait('job-1', 'app', interval '1 hour', interval '1 second', false);
SELECT lease._is_plain_text('k');
SELECT lease._is_plain_ttl(interval '1 hour');
SELECT lease._is_plain_zero(interval '0');
SELECT lease._is_plain_session();
SELECT lease._refusal_of('app', 1, now(), 'app', 1, now());
SELECT lease._has_negative_field(interval '1 day');
SELECT lease._begin_write('acquire');
CREATE FUNCTION lease.sneaky() RETURNS int LANGUAGE sql AS 'SELECT 1';
RESET ROLE;

SET ROLE regress_lease_installer;
SELECT * FROM lease.leases;
UPDATE lease.leases SET epoch = 1;
SELECT lease._validate('acquire', ARRAY['k'], 'o', NULL, interval '1 hour', interval '0');
-- the installer no longer owns the schema: it can neither add objects to
-- it nor move it aside to plant look-alikes under its name
CREATE FUNCTION lease.sneaky() RETURNS int LANGUAGE sql AS 'SELECT 1';
ALTER SCHEMA lease RENAME TO lease_moved;
RESET ROLE;

--
-- A hostile search_path: look-alikes of the catalog functions the API uses
-- placed before pg_catalog and in pg_temp, an "=" for text that calls
-- everything equal and a "<" for timestamptz that calls everything
-- earlier, and tables named leases.  Had any of them run inside the API,
-- it would have printed a NOTICE, handed the intruder the lease table and
-- made it superuser, or granted it job-1.  A new session makes sure
-- no plan cached by the calls above is reused.
--
CREATE SCHEMA regress_hostile AUTHORIZATION regress_lease_intruder;
\connect -
SET ROLE regress_lease_intruder;

CREATE FUNCTION regress_hostile.escalate(what text) RETURNS void
    LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'hostile % ran as %', what, current_user;
    EXECUTE 'GRANT ALL ON TABLE lease.leases TO regress_lease_intruder';
    EXECUTE 'ALTER ROLE regress_lease_intruder SUPERUSER';
END $$;
CREATE FUNCTION regress_hostile.always_equal(text, text) RETURNS boolean
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM regress_hostile.escalate('=');
    RETURN true;
END $$;
CREATE OPERATOR regress_hostile.= (LEFTARG = text, RIGHTARG = text,
                                  FUNCTION = regress_hostile.always_equal);
CREATE FUNCTION regress_hostile.always_less(timestamptz, timestamptz) RETURNS boolean
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM regress_hostile.escalate('<');
    RETURN true;
END $$;
CREATE OPERATOR regress_hostile.< (LEFTARG = timestamptz, RIGHTARG = timestamptz,
                                  FUNCTION = regress_hostile.always_less);
CREATE FUNCTION regress_hostile.clock_timestamp() RETURNS timestamptz
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM regress_hostile.escalate('clock_timestamp');
    RETURN timestamptz '2999-01-01';
END $$;
CREATE FUNCTION regress_hostile.octet_length(text) RETURNS integer
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM regress_hostile.escalate('octet_length');
    RETURN 1;
END $$;
CREATE FUNCTION regress_hostile.isfinite(interval) RETURNS boolean
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM regress_hostile.escalate('isfinite');
    RETURN true;
END $$;
CREATE FUNCTION regress_hostile.pg_sleep(double precision) RETURNS void
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM regress_hostile.escalate('pg_sleep');
END $$;
CREATE FUNCTION regress_hostile.replace(text, text, text) RETURNS text
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM regress_hostile.escalate('replace');
    RETURN 'hostile';
END $$;
CREATE TABLE regress_hostile.leases (key text, owner text, epoch bigint, expires_at timestamptz);
INSERT INTO regress_hostile.leases VALUES ('job-1', NULL, 1, NULL);
CREATE FUNCTION pg_temp.clock_timestamp() RETURNS timestamptz
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM regress_hostile.escalate('pg_temp.clock_timestamp');
    RETURN timestamptz '2999-01-01';
END $$;
CREATE TEMP TABLE leases (key text, owner text, epoch bigint, expires_at timestamptz);

SET search_path = regress_hostile, pg_catalog, pg_temp;

-- job-1 is held by app: denied, not_owner, still held by app
SELECT acquired, epoch FROM lease.acquire('job-1', 'intruder', interval '1 hour');
SELECT status FROM lease.renew('job-1', 'intruder', 1, interval '1 hour');
SELECT * FROM lease.release('job-1', 'intruder', 1);
SELECT held, owner, epoch FROM lease.inspect('job-1');
-- a blocking acquire sleeps with the real pg_sleep and times out
SELECT acquired FROM lease.acquire('job-1', 'intruder', interval '1 hour', interval '120 milliseconds');
-- validation uses the real octet_length and isfinite
SELECT acquired FROM lease.acquire('', 'intruder', interval '1 hour');
-- the intruder's own key works normally
SELECT acquired, epoch FROM lease.acquire('job-h', 'intruder', interval '1 hour');
SELECT status FROM lease.renew('job-h', 'intruder', 1, interval '1 hour');
SELECT * FROM lease.release('job-h', 'intruder', 1);

RESET search_path;
RESET ROLE;
-- end the intruder's session, and with it its temporary objects
\connect -
SELECT has_table_privilege('regress_lease_intruder', 'lease.leases', 'SELECT') AS intruder_reads_table,
       has_table_privilege('regress_lease_intruder', 'lease.leases', 'UPDATE') AS intruder_writes_table,
       (SELECT rolsuper FROM pg_roles WHERE rolname = 'regress_lease_intruder') AS intruder_is_superuser;
SELECT key, owner, epoch FROM lease.leases ORDER BY key;

--
-- Identity is byte equality whatever collation the arguments carry: with
-- a case-insensitive nondeterministic collation 'worker' still is not
-- 'Worker', and 'JOB-CI' is another key than 'job-ci'.
--
CREATE COLLATION regress_lease_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
SELECT acquired, epoch FROM lease.acquire('job-ci', 'Worker', interval '1 hour');
SELECT acquired FROM lease.acquire('job-ci', 'worker' COLLATE regress_lease_ci, interval '1 hour');
SELECT status FROM lease.renew('job-ci', 'WORKER' COLLATE regress_lease_ci, 1, interval '1 hour');
SELECT * FROM lease.release('job-ci' COLLATE regress_lease_ci, 'worker', 1);
SELECT acquired, epoch FROM lease.acquire('JOB-CI' COLLATE regress_lease_ci, 'other', interval '1 hour');
SELECT * FROM lease.inspect('Job-Ci' COLLATE regress_lease_ci);
SELECT key, owner, epoch FROM lease.leases WHERE key ILIKE 'job-ci' ORDER BY key;
DROP COLLATION regress_lease_ci;

--
-- DROP EXTENSION removes all lease state; a re-install starts at epoch 1.
-- The schema was created by CREATE EXTENSION and is not a member, so it
-- stays behind, empty; the installer can install into it again.
--
SELECT held, owner, epoch FROM lease.inspect('job-1');
SET ROLE regress_lease_installer;
DROP EXTENSION pg_lease;
SELECT count(*) AS relations_left, (SELECT count(*) FROM pg_proc
                                     WHERE pronamespace = 'lease'::regnamespace) AS functions_left
  FROM pg_class WHERE relnamespace = 'lease'::regnamespace;
CREATE EXTENSION pg_lease;
RESET ROLE;
SELECT * FROM lease.inspect('job-1');
SELECT acquired, epoch FROM lease.acquire('job-1', 'app', interval '1 hour');

--
-- A schema lease prepared beforehand is refused: nothing planted there can
-- end up next to the extension's own objects
--
SET ROLE regress_lease_installer;
DROP EXTENSION pg_lease;
RESET ROLE;
DROP SCHEMA lease;
SET ROLE regress_lease_installer;
CREATE SCHEMA lease;
CREATE FUNCTION lease._validate(text, text, text, text, interval, interval) RETURNS void
    LANGUAGE sql AS 'SELECT';
CREATE EXTENSION pg_lease;
DROP SCHEMA lease CASCADE;
-- Made in the installing transaction itself, the schema is accepted only
-- without foreign objects.
BEGIN;
CREATE SCHEMA lease;
CREATE FUNCTION lease._validate(text, text, text, text, interval, interval) RETURNS void
    LANGUAGE sql AS 'SELECT';
CREATE EXTENSION pg_lease;
ROLLBACK;
RESET ROLE;
SELECT count(*) AS pg_lease_installed FROM pg_extension WHERE extname = 'pg_lease';

SET client_min_messages = warning;
DROP SCHEMA regress_hostile CASCADE;
RESET client_min_messages;
REVOKE CREATE ON DATABASE :"dbname" FROM regress_lease_installer;
DROP ROLE regress_lease_installer;
DROP ROLE regress_lease_app;
DROP ROLE regress_lease_intruder;
