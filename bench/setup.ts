/**
 * Preparing the bench database: pg_lease as shipped, the bare baseline table, diagnostic
 * variants of the shipped functions and candidate SQL, all in one database so that one
 * pgbench run can interleave any of them.
 */
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import pg from 'pg';
import { type PgCluster, PACKAGE_ROOT } from 'pg-lease-testing';
import type { Arm } from './workloads.js';

/** A bad command line or option value: the runners print it with their usage and exit 2. */
export class UsageError extends Error {
  override name = 'UsageError';
}

/**
 * The install script a candidate stands for: the file itself, or, for a `.patch`/`.diff`
 * (as `git diff` writes it against extension/sql), the shipped script with the patch applied
 * in a scratch copy. A patch that no longer applies fails the run: the proposal is stale.
 */
export function candidateScript(file: string): string {
  if (!/\.(patch|diff)$/.test(file)) return file;
  const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-lease-bench-candidate-'));
  const sqlDir = path.join(scratch, 'extension', 'sql');
  fs.mkdirSync(sqlDir, { recursive: true });
  const shipped = path.join(PACKAGE_ROOT, 'extension', 'sql');
  for (const name of fs.readdirSync(shipped))
    if (name.endsWith('.sql')) fs.copyFileSync(path.join(shipped, name), path.join(sqlDir, name));
  try {
    // git runs in the scratch copy: a path relative to the caller's directory must be made absolute.
    execFileSync('git', ['apply', path.resolve(file)], {
      cwd: scratch,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
  } catch (error) {
    throw new UsageError(`--candidate ${file} does not apply to extension/sql: ${String(error)}`);
  }
  const installScripts = fs
    .readdirSync(sqlDir)
    .filter((name) => /^pg_lease--[^-]+\.sql$/.test(name));
  const newest = installScripts.sort().at(-1);
  if (!newest) throw new UsageError(`--candidate ${file}: no install script after applying it`);
  return path.join(sqlDir, newest);
}

/** The database everything runs in. */
/**
 * Server settings of the bench clusters (run, scale, citus). Durable (the harness's test defaults turn fsync off);
 * no autovacuum and rare checkpoints, because the runner vacuums and checkpoints before
 * every run itself.
 */
export const BENCH_SETTINGS = {
  fsync: 'on',
  synchronous_commit: 'on',
  full_page_writes: 'on',
  shared_buffers: '128MB',
  max_connections: 100,
  autovacuum: 'off',
  checkpoint_timeout: '30min',
  max_wal_size: '4GB',
  jit: 'off',
};

export const BENCH_DATABASE = 'bench';

/** Diagnostic copies of the shipped functions, generated from the installed definitions. */
export const VARIANTS = [
  {
    id: 'lease-noset',
    schema: 'lease_noset',
    label: 'shipped functions without SET search_path (SECURITY DEFINER kept)',
    dropSet: true,
    dropSecurityDefiner: false,
  },
  {
    id: 'lease-plain',
    schema: 'lease_plain',
    label: 'shipped functions without SET search_path and SECURITY DEFINER',
    dropSet: true,
    dropSecurityDefiner: true,
  },
] as const;

/** Runs statements on a short-lived superuser connection. */
export async function withClient<T>(
  cluster: PgCluster,
  database: string,
  action: (client: pg.Client) => Promise<T>,
): Promise<T> {
  const client = new pg.Client({ connectionString: cluster.url(database) });
  await client.connect();
  try {
    return await action(client);
  } finally {
    await client.end();
  }
}

/** The arms of a run: shipped, baselines, variants and candidates. */
export function buildArms(variants: boolean, candidates: string[]): Arm[] {
  const arms: Omit<Arm, 'keyTag'>[] = [
    {
      id: 'lease',
      label: 'pg_lease as shipped',
      script: 'lease',
      table: 'lease.leases',
      role: 'shipped',
    },
    {
      id: 'bare',
      label: 'bare SQL on bare.leases',
      script: 'bare',
      table: 'bare.leases',
      role: 'baseline',
    },
    {
      id: 'advisory',
      label: 'advisory locks (in-memory ceiling)',
      script: 'advisory',
      role: 'ceiling',
    },
  ];
  if (variants) {
    for (const variant of VARIANTS) {
      arms.push({
        id: variant.id,
        label: variant.label,
        script: 'lease',
        schema: variant.schema,
        table: `${variant.schema}.leases`,
        role: 'diagnostic',
      });
    }
  }
  candidates.forEach((file, index) => {
    const schema = candidateSchema(index);
    arms.push({
      id: `candidate${candidates.length > 1 ? index + 1 : ''}`,
      label: `candidate SQL ${file}`,
      script: 'lease',
      schema,
      table: `${schema}.leases`,
      role: 'candidate',
    });
  });
  return arms.map((arm, index) => ({ ...arm, keyTag: `k${String(index).padStart(2, '0')}` }));
}

function candidateSchema(index: number): string {
  return `lease_cand${index + 1}`;
}

/**
 * Creates the bench database: the shipped extension, `bare.leases`, the variants, the
 * candidates, and the keys W3-inspect reads (one per client and arm, held for a day).
 */
export async function setupBenchDatabase(
  cluster: PgCluster,
  arms: Arm[],
  candidates: string[],
  maxClients: number,
): Promise<void> {
  await cluster.createDatabase(BENCH_DATABASE);
  await withClient(cluster, BENCH_DATABASE, async (client) => {
    // The baseline is the table a user would write by hand: the same columns, collations,
    // NOT NULLs, primary key and fillfactor, and no CHECK constraints (issue 16): whatever
    // pg_lease chooses to check on every write is pg_lease's cost. EXCLUDING CONSTRAINTS drops
    // the CHECKs that INCLUDING ALL would copy; the primary key comes with the indexes.
    await client.query('CREATE SCHEMA bare');
    await client.query(
      'CREATE TABLE bare.leases (LIKE lease.leases INCLUDING ALL EXCLUDING CONSTRAINTS)',
    );
    await copyStorageParameters(client, 'bare.leases');

    for (const variant of VARIANTS)
      if (arms.some((arm) => arm.id === variant.id)) await createVariant(client, variant);
    for (const [index, file] of candidates.entries())
      await loadCandidate(client, candidateSchema(index), file);

    for (const arm of arms) {
      const prefix = `w3i-${arm.keyTag}-`;
      if (arm.script === 'bare') {
        await client.query(
          `INSERT INTO bare.leases (key, owner, epoch, expires_at)
           SELECT $2 || c, 'bench-' || c, 1, clock_timestamp() + interval '1 day'
           FROM generate_series(0, $1 - 1) c`,
          [maxClients, prefix],
        );
      } else if (arm.script === 'lease') {
        await client.query(
          `SELECT ${arm.schema ?? 'lease'}.acquire($2 || c, 'bench-' || c, interval '1 day')
           FROM generate_series(0, $1 - 1) c`,
          [maxClients, prefix],
        );
      }
    }
    // W4's business table: one row per client and arm, written under a lease or bare.
    await client.query('CREATE SCHEMA app');
    await client.query(
      `CREATE TABLE app.jobs (key text COLLATE "C" PRIMARY KEY, epoch bigint NOT NULL, n bigint NOT NULL)
         WITH (fillfactor = 70)`,
    );
    await client.query(
      'CREATE TABLE app.jobs_fenced (LIKE app.jobs INCLUDING ALL) WITH (fillfactor = 70)',
    );
    await client.query(
      `CREATE TRIGGER jobs_fenced_fence BEFORE INSERT OR UPDATE ON app.jobs_fenced
         FOR EACH ROW EXECUTE FUNCTION lease.fence_row('key', 'epoch')`,
    );
    if (cluster.installation.major >= 15)
      await client.query('CREATE EXTENSION IF NOT EXISTS pg_walinspect');
  });
}

/** LIKE does not copy storage parameters; fillfactor decides how many updates stay HOT. */
async function copyStorageParameters(client: pg.Client, table: string): Promise<void> {
  const { rows } = await client.query<{ options: string[] | null }>(
    `SELECT reloptions AS options FROM pg_class WHERE oid = 'lease.leases'::regclass`,
  );
  const options = rows[0]?.options ?? [];
  if (options.length) await client.query(`ALTER TABLE ${table} SET (${options.join(', ')})`);
}

/**
 * Copies every function of schema `lease` into `variant.schema`, minus the SET clause and
 * optionally SECURITY DEFINER, with calls between them redirected to the copies and the table to a copy
 * of its own (same definition). Generated from `pg_get_functiondef`, so a variant always measures
 * the SQL actually installed.
 */
async function createVariant(client: pg.Client, variant: (typeof VARIANTS)[number]): Promise<void> {
  const { rows } = await client.query<{ proname: string; def: string }>(
    `SELECT p.proname, pg_get_functiondef(p.oid) AS def
     FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
     WHERE n.nspname = 'lease' AND p.prokind = 'f'`,
  );
  const names = [...new Set(rows.map((row) => row.proname))];
  const calls = new RegExp(`\\blease\\.(${names.map(escapeRegExp).join('|')})\\s*\\(`, 'g');
  await client.query(`CREATE SCHEMA ${variant.schema}`);
  // Its own table of the same definition: rows of different arms never share a page, so every
  // arm's page fills, and gets pruned, alike (on-access pruning adds a WAL record per update
  // on a page at the fillfactor threshold).
  await client.query(`CREATE TABLE ${variant.schema}.leases (LIKE lease.leases INCLUDING ALL)`);
  await copyStorageParameters(client, `${variant.schema}.leases`);
  for (const { def } of rows) {
    // pg_get_functiondef prints the attributes (LANGUAGE, volatility, SECURITY DEFINER, SET
    // lines) before the body; edit only that header.
    const bodyStart = def.search(/^(AS |RETURN |BEGIN ATOMIC)/m);
    let header = def.slice(0, bodyStart);
    let body = def.slice(bodyStart);
    header = header.replace(
      /^CREATE OR REPLACE FUNCTION lease\./,
      `CREATE FUNCTION ${variant.schema}.`,
    );
    // Only the search_path setting goes; other SET clauses (lock_timeout) are behaviour.
    if (variant.dropSet) header = header.replace(/^ SET search_path TO .*\n/m, '');
    if (variant.dropSecurityDefiner) header = header.replace(/ SECURITY DEFINER\b/, '');
    body = body
      .replace(calls, `${variant.schema}.$1(`)
      .replace(/\blease\.leases\b/g, `${variant.schema}.leases`);
    const text = header + body;
    if (variant.dropSecurityDefiner && /SECURITY DEFINER/.test(header))
      throw new Error(`variant ${variant.id}: could not drop SECURITY DEFINER from\n${header}`);
    if (variant.dropSet && /SET search_path/.test(header))
      throw new Error(`variant ${variant.id}: could not drop SET search_path from\n${header}`);
    await client.query(text);
  }
}

function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

/**
 * Loads a candidate install script by hand into its own schema of the bench database: every
 * `lease.` reference (table and functions) becomes `<schema>.`, the `\echo` guard and the
 * extension-only pg_extension_config_dump call are dropped, `@extschema@` is resolved.
 */
export async function loadCandidate(
  client: pg.Client,
  schema: string,
  sqlFile: string,
): Promise<void> {
  const script = fs
    .readFileSync(sqlFile, 'utf8')
    .split('\n')
    .filter((line) => !/^\s*\\echo/.test(line) && !/pg_extension_config_dump/.test(line))
    .join('\n')
    .replaceAll('@extschema@', schema)
    .replace(/\blease\.(?=[A-Za-z_"])/g, `${schema}.`)
    .replace(/\bSCHEMA lease\b/g, `SCHEMA ${schema}`)
    .replace(/'lease'(?=::)/g, `'${schema}'`);
  await client.query(`CREATE SCHEMA ${schema}`);
  await client.query(script);
}

/** Tables a set of arms writes. */
export function tablesOf(arms: Arm[]): string[] {
  return [...new Set(arms.flatMap((arm) => (arm.table ? [arm.table] : [])))];
}

/**
 * Puts a workload's keys back to FREE before a run (epoch + 1, so the contract's monotone
 * epoch holds even here), then vacuums and checkpoints so every run starts from the same
 * table and WAL state: no dead versions, no pending full-page images.
 */
export async function resetForRun(
  cluster: PgCluster,
  tables: string[],
  keyPrefix: string,
): Promise<void> {
  await withClient(cluster, BENCH_DATABASE, async (client) => {
    for (const table of tables) {
      if (keyPrefix !== 'w3i-') {
        await client.query(
          `UPDATE ${table} SET owner = NULL, expires_at = NULL, epoch = epoch + 1
           WHERE key LIKE $1 AND owner IS NOT NULL`,
          [keyPrefix + '%'],
        );
      }
      await client.query(`VACUUM ${table}`);
    }
    await client.query('CHECKPOINT');
  });
}
