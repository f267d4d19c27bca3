/**
 * What the update and build suites share: the released install scripts kept as fixtures, the
 * catalog query that compares an updated database with a fresh install, and running the
 * extension's Makefile on a copy of its source.
 */
import { spawnSync, type SpawnSyncReturns } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { PACKAGE_ROOT, findSystemPgConfig } from 'pg-lease-testing';

const FIXTURES = path.join(PACKAGE_ROOT, 'extension', 'test', 'fixtures');

/** The released 0.1.0 install script (no longer shipped: it had a privilege escalation). */
export const FIXTURE_0_1_0 = path.join(FIXTURES, 'pg_lease--0.1.0.sql');

/** The released 0.2.0 install script (no longer shipped: 0.2.0 databases update to 0.2.1). */
export const FIXTURE_0_2_0 = path.join(FIXTURES, 'pg_lease--0.2.0.sql');

/** The released 0.2.1 install script (no longer shipped: 0.2.1 databases update to 0.2.2). */
export const FIXTURE_0_2_1 = path.join(FIXTURES, 'pg_lease--0.2.1.sql');

/**
 * The version CREATE EXTENSION pg_lease installs: default_version in extension/pg_lease.control.
 * The tests that name the current version take it from here.
 */
export const CURRENT_VERSION = '0.2.2';

/** Every released version a database may be on before it updates, with its install script. */
export const EARLIER_VERSIONS = [
  { version: '0.1.0', fixture: FIXTURE_0_1_0 },
  { version: '0.2.0', fixture: FIXTURE_0_2_0 },
  { version: '0.2.1', fixture: FIXTURE_0_2_1 },
] as const;

/** Every catalog fact about pg_lease's objects that an update must reproduce. */
export const CATALOG_QUERY = `
  WITH members AS (
    SELECT d.classid, d.objid
      FROM pg_depend d
     WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
       AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_lease'))
  SELECT 'member' AS kind, pg_describe_object(m.classid, m.objid, 0) AS name, NULL AS detail
    FROM members m
  UNION ALL
  SELECT 'function', p.oid::regprocedure::text,
         concat_ws(' | ', pg_get_functiondef(p.oid), p.proacl::text, p.proowner::regrole::text,
                   obj_description(p.oid, 'pg_proc'))
    FROM pg_proc p WHERE p.pronamespace = 'lease'::regnamespace
  UNION ALL
  SELECT 'relation', c.oid::regclass::text,
         concat_ws(' | ', c.relkind, c.relacl::text, c.reloptions::text, c.relowner::regrole::text,
                   obj_description(c.oid, 'pg_class'))
    FROM pg_class c WHERE c.relnamespace = 'lease'::regnamespace
  UNION ALL
  SELECT 'column', a.attrelid::regclass::text || '.' || a.attname,
         concat_ws(' | ', format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attnum,
                   a.attcollation::regcollation::text, pg_get_expr(ad.adbin, ad.adrelid))
    FROM pg_attribute a
    JOIN pg_class c ON c.oid = a.attrelid
    LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
   WHERE c.relnamespace = 'lease'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
  UNION ALL
  SELECT 'constraint',
         coalesce(nullif(conrelid, 0)::regclass::text, contypid::regtype::text) || '.' || conname,
         pg_get_constraintdef(oid)
    FROM pg_constraint WHERE connamespace = 'lease'::regnamespace
  UNION ALL
  SELECT 'type', t.oid::regtype::text,
         concat_ws(' | ', t.typtype, format_type(t.typbasetype, t.typtypmod), t.typnotnull,
                   t.typcollation::regcollation::text, t.typacl::text, t.typowner::regrole::text)
    FROM pg_type t WHERE t.typnamespace = 'lease'::regnamespace AND t.typtype = 'd'
  UNION ALL
  SELECT 'index', indexrelid::regclass::text, pg_get_indexdef(indexrelid)
    FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
   WHERE c.relnamespace = 'lease'::regnamespace
  UNION ALL
  SELECT 'trigger', t.tgrelid::regclass::text || '.' || t.tgname,
         pg_get_triggerdef(t.oid) || ' | ' || t.tgenabled::text
    FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
   WHERE c.relnamespace = 'lease'::regnamespace
  UNION ALL
  SELECT 'schema', nspname, concat_ws(' | ', nspowner::regrole::text, nspacl::text)
    FROM pg_namespace WHERE nspname = 'lease'
  UNION ALL
  SELECT 'extension', extname,
         concat_ws(' | ', extversion, extnamespace::regnamespace::text, extrelocatable,
                   extconfig::text, extowner::regrole::text)
    FROM pg_extension WHERE extname = 'pg_lease'
  ORDER BY 1, 2`;

/**
 * The pg_config that make should build with (PG_LEASE_PG_CONFIG, else the one on PATH), or
 * undefined when make or pg_config is missing.
 */
export function pgConfigForMake(): string | undefined {
  if (spawnSync('make', ['--version']).status !== 0) return undefined;
  const pgConfig = process.env.PG_LEASE_PG_CONFIG ?? findSystemPgConfig();
  if (!pgConfig || spawnSync(pgConfig, ['--pgxs']).status !== 0) return undefined;
  return pgConfig;
}

/**
 * The `skip` option of a test that runs make: the reason when make or pg_config is missing,
 * unless CI=true or PG_LEASE_NO_SKIP=1 (set by .ci/run), where the test runs and fails instead.
 */
export function skipWithoutMake(): string | false {
  if (pgConfigForMake()) return false;
  if (process.env.CI === 'true' || process.env.PG_LEASE_NO_SKIP === '1') return false;
  return 'needs make and pg_config (PostgreSQL server development files)';
}

/**
 * A copy of what the extension's Makefile builds from (the Makefile, the control file and
 * src/) in a new temp dir, without extension/sql. `rm` removes it.
 */
export function copyExtensionSource(): { dir: string; rm(): void } {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-lease-extension-'));
  const dir = path.join(root, 'extension');
  const from = path.join(PACKAGE_ROOT, 'extension');
  fs.mkdirSync(dir);
  for (const entry of ['Makefile', 'pg_lease.control', 'src'])
    fs.cpSync(path.join(from, entry), path.join(dir, entry), { recursive: true });
  return { dir, rm: () => fs.rmSync(root, { recursive: true, force: true }) };
}

/** Runs make in `dir` with the pg_config of {@link pgConfigForMake}. */
export function make(dir: string, ...args: string[]): SpawnSyncReturns<string> {
  const pgConfig = pgConfigForMake();
  if (!pgConfig)
    throw new Error(
      'make or pg_config is missing, and CI=true or PG_LEASE_NO_SKIP=1 forbids skipping',
    );
  return spawnSync('make', ['-s', '-C', dir, `PG_CONFIG=${pgConfig}`, ...args], {
    encoding: 'utf8',
  });
}

/** The pg_lease scripts in `dir`/sql: file name -> bytes. */
export function builtScripts(dir: string): Map<string, Buffer> {
  const sqlDir = path.join(dir, 'sql');
  if (!fs.existsSync(sqlDir)) return new Map();
  return new Map(
    fs
      .readdirSync(sqlDir)
      .filter((name) => /^pg_lease--.*\.sql$/.test(name))
      .sort()
      .map((name) => [name, fs.readFileSync(path.join(sqlDir, name))]),
  );
}
