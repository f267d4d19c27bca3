/**
 * Instructions per call: `npm run bench:instructions -- [options]`. See bench/README.md.
 *
 * Timings on a shared machine move by tens of percent; the number of instructions a call
 * executes does not. This runs each operation in a loop inside a single-user PostgreSQL (one
 * process: no client, no network, no other backend) under valgrind's callgrind, which counts
 * the user-space instructions executed. Each loop runs twice, with two lengths, on fresh copies
 * of one data directory; the difference divided by the difference in length is the cost of
 * one call, its own transaction and commit included, with start-up and set-up cancelled out.
 *
 * Instructions are not time (cache misses, the commit flush and lock waits cost time without
 * instructions), so this measures the CPU work a call adds, which is what the function layer
 * changes; the pgbench runs measure what that is worth in latency and throughput.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { parseArgs } from 'node:util';
import { PgCluster, findInstallation, type InstallationRequest } from 'pg-lease-testing';
import {
  BENCH_DATABASE,
  UsageError,
  buildArms,
  candidateScript,
  setupBenchDatabase,
} from './setup.js';
import type { Arm } from './workloads.js';

const USAGE = `Usage: npm run bench:instructions -- [options]

  --major N           embedded PostgreSQL N (14-18; default 18)
  --pg-config PATH    a system build, by its pg_config
  --calls N           calls per measured loop (default 200)
  --operations LIST   only these, comma-separated (default all: acquire, first, renew,
                      release, inspect, denied, permit, permit-release, permit-denied)
  --variants          also the diagnostic copies without SET search_path / SECURITY DEFINER
  --candidate FILE    also a proposed install script (.sql, or a .patch against extension/sql)
  --out FILE          also write the table (markdown) to FILE
  -h, --help          this text
`;

/** Rows the set-up creates, whatever the loop length, so that set-up cost cancels out. */
const SHORT_LOOP = 50;

interface Operation {
  id: string;
  title: string;
  /**
   * State of the keys before the loop: free (never held again), held by `bench`, held by
   * `other`, or never granted (the set-up then inserts as many rows under other keys).
   */
  keys: 'free' | 'held' | 'held by another' | 'never';
  /** One call and its check, for a lease-shaped arm in `schema`; the key is `'ic-' || i`. */
  lease(schema: string): string;
  /** The same on bare.leases (or, for the counted-key operations, on bare.sem). */
  bare: string;
  /**
   * The set-up of `rows` keys when `keys` does not describe it (counted keys): statements run
   * before the loop, which may set `e` (bigint) for the loop to use.
   */
  setup?(arm: Arm, rows: number): string;
}

const KEY = `'ic-' || i`;

/** A call that stores its outcome in `ok`, then fails the loop when `failed` holds. */
const checked = (call: string, failed: string) =>
  `${call} IF ${failed} THEN RAISE EXCEPTION 'call % did not succeed', i; END IF;`;

const leaseAcquire = (s: string) =>
  `SELECT a.acquired INTO ok FROM ${s}.acquire(${KEY}, 'bench', interval '5 minutes') AS a;`;

/** The bench's bare acquire: the conditional upsert; on a key held by another it returns no row. */
const BARE_UPSERT = `INSERT INTO bare.leases AS l (key, owner, epoch, expires_at) VALUES (${KEY}, 'bench', 1, clock_timestamp() + interval '5 minutes') ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, epoch = l.epoch + 1, expires_at = excluded.expires_at WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp() RETURNING true INTO ok;`;

/**
 * The hand-written semaphore of `npm run bench:permits`: a row per key with its holder count,
 * locked FOR UPDATE, incremented when below the limit (the commit after it is the loop's).
 */
const SEM_ACQUIRE = `SELECT s.holders < s.max_holders INTO ok FROM bare.sem AS s WHERE s.key = ${KEY} FOR UPDATE; IF ok THEN UPDATE bare.sem SET holders = holders + 1 WHERE key = ${KEY}; END IF;`;

/**
 * Counted keys 'ic-1'..'ic-rows' with limit 4 and `live` permits each (by 'bench' when one,
 * by 'other-1'.. otherwise); `e` is the epoch of the first key's first permit, which is every
 * key's (each key's row starts at the same epoch floor). The bare arm: bare.sem with the same
 * counts.
 */
function countedSetup(arm: Arm, rows: number, live: number): string {
  const keys = `FROM generate_series(1, ${rows}) AS g`;
  if (arm.script === 'bare')
    return (
      `CREATE TABLE bare.sem (key text PRIMARY KEY, holders integer NOT NULL, max_holders integer NOT NULL); ` +
      `INSERT INTO bare.sem SELECT 'ic-' || g, ${live}, 4 ${keys};`
    );
  const s = arm.schema ?? 'lease';
  const owner = live === 1 ? `'bench'` : `'other-' || o`;
  return (
    `PERFORM ${s}.set_limit('ic-' || g, 4) ${keys}; ` +
    (live > 0
      ? `PERFORM ${s}.acquire('ic-' || g, ${owner}, interval '1 day') ${keys}, generate_series(1, ${live}) AS o; ` +
        `SELECT min(h.epoch) INTO e FROM ${s}.holders('ic-1') AS h;`
      : '')
  );
}

const OPERATIONS: Operation[] = [
  {
    id: 'acquire',
    title: 'acquire of a free key',
    keys: 'free',
    lease: (s) => checked(leaseAcquire(s), 'ok IS NOT TRUE'),
    bare: checked(BARE_UPSERT, 'ok IS NOT TRUE'),
  },
  {
    id: 'first',
    title: 'acquire of a key never granted',
    keys: 'never',
    lease: (s) => checked(leaseAcquire(s), 'ok IS NOT TRUE'),
    bare: checked(BARE_UPSERT, 'ok IS NOT TRUE'),
  },
  {
    id: 'renew',
    title: 'renew of a held key',
    keys: 'held',
    lease: (s) =>
      checked(
        `SELECT r.status = 'ok' INTO ok FROM ${s}.renew(${KEY}, 'bench', 1, interval '5 minutes') AS r;`,
        'ok IS NOT TRUE',
      ),
    bare: checked(
      `UPDATE bare.leases SET expires_at = clock_timestamp() + interval '5 minutes' WHERE key = ${KEY} AND owner = 'bench' AND epoch = 1 AND expires_at > clock_timestamp() RETURNING true INTO ok;`,
      'ok IS NOT TRUE',
    ),
  },
  {
    id: 'release',
    title: 'release of a held key',
    keys: 'held',
    lease: (s) =>
      checked(
        `SELECT r.status = 'ok' INTO ok FROM ${s}.release(${KEY}, 'bench', 1) AS r;`,
        'ok IS NOT TRUE',
      ),
    bare: checked(
      `UPDATE bare.leases SET owner = NULL, expires_at = NULL, epoch = epoch + 1 WHERE key = ${KEY} AND owner = 'bench' AND epoch = 1 AND expires_at > clock_timestamp() RETURNING true INTO ok;`,
      'ok IS NOT TRUE',
    ),
  },
  {
    id: 'inspect',
    title: 'inspect of a held key',
    keys: 'held',
    lease: (s) =>
      checked(`SELECT n.held INTO ok FROM ${s}.inspect(${KEY}) AS n;`, 'ok IS NOT TRUE'),
    bare: checked(
      `SELECT l.owner IS NOT NULL INTO ok FROM bare.leases AS l WHERE l.key = ${KEY};`,
      'ok IS NOT TRUE',
    ),
  },
  {
    id: 'denied',
    title: 'acquire of a key held by another owner',
    keys: 'held by another',
    lease: (s) => checked(leaseAcquire(s), 'ok IS NOT FALSE'),
    bare: checked(BARE_UPSERT, 'ok IS NOT NULL'),
  },
  {
    id: 'permit',
    title: 'acquire of a permit (counted key, limit 4, none live)',
    keys: 'free',
    setup: (arm, rows) => countedSetup(arm, rows, 0),
    lease: (s) => checked(leaseAcquire(s), 'ok IS NOT TRUE'),
    bare: checked(SEM_ACQUIRE, 'ok IS NOT TRUE'),
  },
  {
    id: 'permit-release',
    title: 'release of a permit (counted key, limit 4, 1 live)',
    keys: 'held',
    setup: (arm, rows) => countedSetup(arm, rows, 1),
    lease: (s) =>
      checked(
        `SELECT r.status = 'ok' INTO ok FROM ${s}.release(${KEY}, 'bench', e) AS r;`,
        'ok IS NOT TRUE',
      ),
    bare: checked(
      `UPDATE bare.sem SET holders = holders - 1 WHERE key = ${KEY} AND holders > 0 RETURNING true INTO ok;`,
      'ok IS NOT TRUE',
    ),
  },
  {
    id: 'permit-denied',
    title: 'acquire of a permit of a full key (limit 4, 4 live)',
    keys: 'held by another',
    setup: (arm, rows) => countedSetup(arm, rows, 4),
    lease: (s) => checked(leaseAcquire(s), 'ok IS NOT FALSE'),
    bare: checked(SEM_ACQUIRE, 'ok IS NOT FALSE'),
  },
];

/** The single-line DO block that prepares `rows` keys and calls the operation `calls` times. */
function loopStatement(operation: Operation, arm: Arm, rows: number, calls: number): string {
  const table = arm.table!;
  const [owner, expires] =
    operation.keys === 'free' || operation.keys === 'never'
      ? ['NULL', 'NULL']
      : [operation.keys === 'held' ? `'bench'` : `'other'`, `clock_timestamp() + interval '1 day'`];
  const setup = operation.setup
    ? operation.setup(arm, rows)
    : `INSERT INTO ${table} (key, owner, epoch, expires_at) SELECT '${operation.keys === 'never' ? 'other' : 'ic'}-' || g, ${owner}, 1, ${expires} FROM generate_series(1, ${rows}) AS g;`;
  const call = arm.script === 'bare' ? operation.bare : operation.lease(arm.schema ?? 'lease');
  return `DO $$ DECLARE ok boolean; e bigint; BEGIN ${setup} COMMIT; FOR i IN 1..${calls} LOOP ${call} COMMIT; END LOOP; END $$;\n`;
}

interface Options {
  installation: InstallationRequest;
  calls: number;
  operations: Operation[];
  variants: boolean;
  candidates: string[];
  out?: string;
}

function parseOptions(argv: string[]): Options | undefined {
  const { values } = parseArgs({
    args: argv,
    options: {
      major: { type: 'string' },
      'pg-config': { type: 'string' },
      calls: { type: 'string' },
      operations: { type: 'string' },
      variants: { type: 'boolean' },
      candidate: { type: 'string', multiple: true },
      out: { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
  });
  if (values.help) return undefined;
  const calls = Number(values.calls ?? 200);
  if (!Number.isInteger(calls) || calls < 10)
    throw new UsageError(`--calls must be an integer of at least 10, got "${values.calls}"`);
  const installation: InstallationRequest = values['pg-config']
    ? { pgConfig: values['pg-config'] }
    : values.major
      ? { major: Number(values.major) }
      : {};
  const ids = values.operations?.split(',') ?? OPERATIONS.map((op) => op.id);
  for (const id of ids)
    if (!OPERATIONS.some((op) => op.id === id))
      throw new UsageError(`--operations: no operation "${id}"`);
  for (const file of values.candidate ?? [])
    if (!fs.existsSync(file)) throw new UsageError(`--candidate ${file}: no such file`);
  return {
    installation,
    calls,
    operations: OPERATIONS.filter((op) => ids.includes(op.id)),
    variants: values.variants ?? false,
    candidates: values.candidate ?? [],
    ...(values.out ? { out: path.resolve(values.out) } : {}),
  };
}

function requireValgrind(): string {
  const probe = spawnSync('valgrind', ['--version'], { encoding: 'utf8' });
  if (probe.status !== 0)
    throw new UsageError(
      'valgrind is not installed (Debian/Ubuntu: apt-get install valgrind); it counts the instructions',
    );
  return probe.stdout.trim();
}

async function main(): Promise<number> {
  const options = parseOptions(process.argv.slice(2));
  if (!options) {
    process.stdout.write(USAGE);
    return 0;
  }
  const valgrind = requireValgrind();
  const installation = findInstallation(options.installation);
  const candidateScripts = options.candidates.map(candidateScript);
  const arms = buildArms(options.variants, options.candidates).filter((arm) => arm.table);
  const log = (line: string) => process.stderr.write(`[instructions] ${line}\n`);
  log(`PostgreSQL ${installation.version} (${installation.source}); ${valgrind}`);

  const cluster = await PgCluster.start({ installation, settings: { autovacuum: 'off' } });
  try {
    await setupBenchDatabase(cluster, arms, candidateScripts, 1);
    await cluster.stop('fast');
    const account = cluster.serverAccount;
    const postgres = path.join(cluster.installation.bindir, 'postgres');
    const scratch = path.join(cluster.baseDir, 'single-user');

    const count = (statement: string): number => {
      fs.rmSync(scratch, { recursive: true, force: true });
      execFileSync('cp', ['-a', cluster.dataDir, scratch]);
      const run = spawnSync(
        'valgrind',
        [
          '--tool=callgrind',
          '--callgrind-out-file=/dev/null',
          postgres,
          '--single',
          '-D',
          scratch,
        ].concat(['-F', '-c', 'synchronous_commit=on', '-c', 'jit=off', BENCH_DATABASE]),
        { input: statement, encoding: 'utf8', ...account, maxBuffer: 64 * 1024 * 1024 },
      );
      const output = `${run.stdout}\n${run.stderr}`;
      if (/\bERROR:/.test(output) || run.status !== 0)
        throw new Error(`single-user run failed:\n${statement}\n${output.slice(-3000)}`);
      const collected = /Collected : (\d+)/.exec(output);
      if (!collected) throw new Error(`no instruction count in valgrind's output:\n${output}`);
      return Number(collected[1]);
    };

    const rows = SHORT_LOOP + options.calls;
    const perCall = new Map<string, number>();
    for (const operation of options.operations)
      for (const arm of arms) {
        const short = count(loopStatement(operation, arm, rows, SHORT_LOOP));
        const long = count(loopStatement(operation, arm, rows, rows));
        perCall.set(`${operation.id}|${arm.id}`, (long - short) / options.calls);
        log(`${operation.id} ${arm.id}: ${Math.round((long - short) / options.calls)}`);
      }

    const others = arms.filter((arm) => arm.id !== 'bare');
    const k = (value: number) => `${(value / 1000).toFixed(1)}k`;
    const lines = [
      `Instructions per call (thousands), each call its own transaction with its commit; ` +
        `PostgreSQL ${installation.version}, ${options.calls} calls, callgrind.`,
      '',
      `| operation | bare SQL | ${others.map((a) => `${a.id} | ${a.id} - bare | ${a.id} / bare`).join(' | ')} |`,
      `|---|---:|${others.map(() => '---:|---:|---:').join('|')}|`,
    ];
    for (const operation of options.operations) {
      const bare = perCall.get(`${operation.id}|bare`)!;
      const cells = others.map((arm) => {
        const value = perCall.get(`${operation.id}|${arm.id}`)!;
        return `${k(value)} | ${value >= bare ? '+' : ''}${k(value - bare)} | ${(value / bare).toFixed(2)}`;
      });
      lines.push(`| ${operation.title} | ${k(bare)} | ${cells.join(' | ')} |`);
    }
    lines.push('', ...others.map((arm) => `- \`${arm.id}\`: ${arm.label}`));
    if (options.operations.some((op) => op.setup))
      lines.push(
        '- bare SQL of the permit rows: the hand-written semaphore of `npm run bench:permits`, ' +
          'a row per key with a holder count (`bare.sem`): `SELECT ... FOR UPDATE`, then ' +
          '`UPDATE ... SET holders = holders + 1` when below the limit; release `holders - 1`.',
      );
    const table = `${lines.join('\n')}\n`;
    process.stdout.write(table);
    if (options.out) fs.writeFileSync(options.out, table);
  } finally {
    await cluster.destroy();
  }
  return 0;
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    if (error instanceof UsageError) {
      process.stderr.write(`bench:instructions: ${error.message}\n${USAGE}`);
      process.exit(2);
    }
    process.stderr.write(
      `bench:instructions: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`,
    );
    process.exit(1);
  },
);
