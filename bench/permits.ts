/**
 * `npm run bench:permits -- [options]`: a counted key (§13) under contention, against an
 * exclusive key and against the semaphore a user writes by hand on a plain table (issue 35).
 *
 * Three arms, each 16 sessions (their own connections, named prepared statements) on ONE key,
 * every session looping: acquire attempt; when granted, release at once; when denied, try
 * again at once (denied attempts are counted). Each call is its own autocommit transaction,
 * with the durable settings of `npm run bench` (fsync, synchronous_commit on).
 *
 * - `counted`: `lease.acquire` / `lease.release` on a key made counted by `lease.set_limit(key, 4)`;
 * - `exclusive`: the same calls on an exclusive key (one holder at a time);
 * - `semaphore`: a table `sem (key, holders, max_holders)`; acquire = `BEGIN`, `SELECT holders,
 *   max_holders ... FOR UPDATE`, `UPDATE ... SET holders = holders + 1` when below 4, `COMMIT`;
 *   release = `UPDATE ... SET holders = holders - 1` (autocommit).
 *
 * The arms take turns in rounds (order reversed every round, `VACUUM` + `CHECKPOINT` before
 * every slice), so drift of a shared machine hits them alike; medians over the rounds. After
 * every slice the key must be free again (no permit, no holder, count 0), or the run fails.
 *
 * Then, unless --no-instructions, `bench:instructions` on the exclusive and counted
 * operations (callgrind; skipped with a note when valgrind is missing).
 *
 * Writes summary.md, summary.json, environment.md/.json to bench/results/<timestamp>-permits/.
 */
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { PACKAGE_ROOT, PgCluster, findInstallation } from 'pg-lease-testing';
import { recordEnvironment, writeEnvironment } from './environment.js';
import { findPgbench } from './pgbench.js';
import { BENCH_DATABASE, BENCH_SETTINGS } from './setup.js';
import { median, summarise, type LatencySummary } from './stats.js';

const { values } = parseArgs({
  options: {
    seconds: { type: 'string', default: '4' },
    rounds: { type: 'string', default: '5' },
    workers: { type: 'string', default: '16' },
    limit: { type: 'string', default: '4' },
    calls: { type: 'string', default: '100' },
    major: { type: 'string' },
    'pg-config': { type: 'string' },
    'no-instructions': { type: 'boolean' },
    out: { type: 'string' },
    help: { type: 'boolean', short: 'h' },
  },
});
if (values.help) {
  process.stdout.write(
    'Usage: npm run bench:permits -- [--seconds N (per arm and round, default 4)] [--rounds N (default 5)]\n' +
      '         [--workers N (sessions per arm, default 16)] [--limit N (permits, default 4)]\n' +
      '         [--major 14..18 | --pg-config PATH] [--calls N (instructions loop, default 100)]\n' +
      '         [--no-instructions] [--out DIR]\n',
  );
  process.exit(0);
}
const SECONDS = Number(values.seconds);
const ROUNDS = Number(values.rounds);
const SESSIONS = Number(values.workers);
const LIMIT = Number(values.limit);
for (const [name, value] of [
  ['--seconds', SECONDS],
  ['--rounds', ROUNDS],
  ['--workers', SESSIONS],
  ['--limit', LIMIT],
] as const)
  if (!Number.isInteger(value) || value < 1) {
    process.stderr.write(`${name} must be a positive whole number\n`);
    process.exit(64);
  }

const stamp = new Date()
  .toISOString()
  .replace(/[-:]/g, '')
  .replace(/\.\d+Z$/, 'Z');
const out = values.out ?? path.join(PACKAGE_ROOT, 'bench', 'results', `${stamp}-permits`);
const log = (line: string) =>
  process.stderr.write(`[permits ${new Date().toISOString().slice(11, 19)}] ${line}\n`);
const loadavg = () =>
  os
    .loadavg()
    .map((l) => l.toFixed(1))
    .join(' / ');

const COUNTED_KEY = 'permits:counted';
const EXCLUSIVE_KEY = 'permits:exclusive';
const SEM_KEY = 'permits:sem';

/** One session's calls: `attempt` resolves to the grant's token, or null when denied. */
interface Session {
  attempt(): Promise<string | null>;
  release(token: string): Promise<void>;
}

interface ArmSpec {
  id: 'counted' | 'exclusive' | 'semaphore';
  label: string;
  session(client: pg.Client, owner: string): Session;
}

const leaseSession =
  (key: string) =>
  (client: pg.Client, owner: string): Session => ({
    async attempt() {
      const { rows } = await client.query<{ acquired: boolean; epoch: string | null }>({
        name: 'acquire',
        text: `SELECT acquired, epoch FROM lease.acquire($1, $2, interval '30 seconds')`,
        values: [key, owner],
      });
      return rows[0]!.acquired ? rows[0]!.epoch : null;
    },
    async release(epoch) {
      const { rows } = await client.query<{ status: string }>({
        name: 'release',
        text: `SELECT status FROM lease.release($1, $2, $3)`,
        values: [key, owner, epoch],
      });
      if (rows[0]!.status !== 'ok')
        throw new Error(`${key}: release by ${owner}: ${rows[0]!.status}`);
    },
  });

const ARMS: ArmSpec[] = [
  {
    id: 'counted',
    label: `pg_lease counted key, limit ${LIMIT}`,
    session: leaseSession(COUNTED_KEY),
  },
  { id: 'exclusive', label: 'pg_lease exclusive key', session: leaseSession(EXCLUSIVE_KEY) },
  {
    id: 'semaphore',
    label: `hand-written semaphore, limit ${LIMIT}`,
    session: (client) => ({
      async attempt() {
        await client.query('BEGIN');
        try {
          const { rows } = await client.query<{ free: boolean }>({
            name: 'sem-lock',
            text: 'SELECT holders < max_holders AS free FROM sem WHERE key = $1 FOR UPDATE',
            values: [SEM_KEY],
          });
          if (rows[0]!.free)
            await client.query({
              name: 'sem-take',
              text: 'UPDATE sem SET holders = holders + 1 WHERE key = $1',
              values: [SEM_KEY],
            });
          await client.query('COMMIT');
          return rows[0]!.free ? 'held' : null;
        } catch (error) {
          await client.query('ROLLBACK').catch(() => undefined);
          throw error;
        }
      },
      async release() {
        const { rowCount } = await client.query({
          name: 'sem-give',
          text: 'UPDATE sem SET holders = holders - 1 WHERE key = $1 AND holders > 0',
          values: [SEM_KEY],
        });
        if (rowCount !== 1) throw new Error('semaphore: release found no holder');
      },
    }),
  },
];

interface Round {
  round: number;
  arm: string;
  seconds: number;
  cycles: number;
  attempts: number;
  loadBefore: number;
  /** Every acquire attempt, granted or denied. */
  attempt: LatencySummary;
  granted: LatencySummary;
  denied: LatencySummary;
  release: LatencySummary;
  /** From a session's first attempt after its last release to the grant: the wait with retries. */
  toGrant: LatencySummary;
}

async function runSlice(arm: ArmSpec, sessions: Session[], round: number): Promise<Round> {
  const lat = { attempt: [] as number[], granted: [] as number[], denied: [] as number[] };
  const release: number[] = [];
  const toGrant: number[] = [];
  let cycles = 0;
  let attempts = 0;
  const loadBefore = os.loadavg()[0]!;
  const started = performance.now();
  const until = started + SECONDS * 1000;
  await Promise.all(
    sessions.map(async (session) => {
      let waitStart = performance.now();
      while (performance.now() < until) {
        const t0 = performance.now();
        const token = await session.attempt();
        const t1 = performance.now();
        attempts++;
        const us = (t1 - t0) * 1000;
        lat.attempt.push(us);
        if (token === null) {
          lat.denied.push(us);
          continue;
        }
        lat.granted.push(us);
        toGrant.push((t1 - waitStart) * 1000);
        const t2 = performance.now();
        await session.release(token);
        const t3 = performance.now();
        release.push((t3 - t2) * 1000);
        cycles++;
        waitStart = t3;
      }
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  return {
    round,
    arm: arm.id,
    seconds,
    cycles,
    attempts,
    loadBefore,
    attempt: summarise(lat.attempt),
    granted: summarise(lat.granted),
    denied: summarise(lat.denied),
    release: summarise(release),
    toGrant: summarise(toGrant),
  };
}

function instructions(pgConfigArgs: string[]): string {
  const probe = spawnSync('valgrind', ['--version'], { encoding: 'utf8' });
  if (probe.status !== 0) return 'valgrind is not installed: no instruction counts in this run.\n';
  const file = path.join(out, 'instructions.md');
  const run = spawnSync(
    process.execPath,
    [
      path.join(PACKAGE_ROOT, 'dist', 'bench', 'instructions.js'),
      ...pgConfigArgs,
      '--operations',
      'acquire,denied,release,permit,permit-denied,permit-release',
      '--calls',
      String(values.calls),
      '--out',
      file,
    ],
    { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] },
  );
  if (run.status !== 0) throw new Error(`bench:instructions failed (exit ${run.status})`);
  return fs.readFileSync(file, 'utf8');
}

async function main(): Promise<void> {
  const pgConfigArgs = values['pg-config']
    ? ['--pg-config', values['pg-config']]
    : values.major
      ? ['--major', values.major]
      : [];
  const installation = findInstallation(
    values['pg-config']
      ? { pgConfig: values['pg-config'] }
      : values.major
        ? { major: Number(values.major) }
        : {},
  );
  fs.mkdirSync(out, { recursive: true });
  const loadAtStart = loadavg();
  log(`PostgreSQL ${installation.version}; load ${loadAtStart}; results in ${out}`);
  const cluster = await PgCluster.start({ installation, settings: BENCH_SETTINGS });
  const clients: pg.Client[] = [];
  const rounds: Round[] = [];
  let command = '';
  try {
    const url = await cluster.createDatabase(BENCH_DATABASE);
    const env = await recordEnvironment({
      cluster,
      pgbench: findPgbench(),
      packageRoot: PACKAGE_ROOT,
      command: `npm run bench:permits -- ${process.argv.slice(2).join(' ')}`.trim(),
      candidates: [],
      fsyncTest: false,
    });
    writeEnvironment(out, env);
    command = env.command;
    await cluster.query(
      `SELECT lease.set_limit('${COUNTED_KEY}', ${LIMIT});
       CREATE TABLE sem (key text PRIMARY KEY, holders integer NOT NULL, max_holders integer NOT NULL);
       INSERT INTO sem VALUES ('${SEM_KEY}', 0, ${LIMIT});`,
      [],
      BENCH_DATABASE,
    );
    // Each arm its own sessions, connected once, kept for every round.
    const sessions = new Map<string, Session[]>();
    for (const arm of ARMS) {
      const list: Session[] = [];
      for (let i = 0; i < SESSIONS; i++) {
        const client = new pg.Client({ connectionString: url });
        await client.connect();
        clients.push(client);
        list.push(arm.session(client, `worker-${i}`));
      }
      sessions.set(arm.id, list);
    }
    for (let r = 1; r <= ROUNDS; r++)
      for (const arm of r % 2 ? ARMS : [...ARMS].reverse()) {
        await cluster.query('VACUUM lease.leases, lease.permits, sem', [], BENCH_DATABASE);
        await cluster.query('CHECKPOINT');
        const round = await runSlice(arm, sessions.get(arm.id)!, r);
        rounds.push(round);
        const { rows } = await cluster.query<{ left: string }>(
          `SELECT (SELECT count(*) FROM lease.holders('${COUNTED_KEY}'))
                + (SELECT count(*) FROM lease.holders('${EXCLUSIVE_KEY}'))
                + (SELECT holders FROM sem) AS left`,
          [],
          BENCH_DATABASE,
        );
        if (Number(rows[0]!.left) !== 0)
          throw new Error(`after round ${r} of ${arm.id}: ${rows[0]!.left} grants left`);
        log(
          `round ${r}, ${arm.id}: ${Math.round(round.cycles / round.seconds)} cycles/s, ` +
            `${Math.round(round.attempts / round.seconds)} attempts/s, attempt p99 ` +
            `${Math.round(round.attempt.p99Us)} us, release p99 ${Math.round(round.release.p99Us)} us, ` +
            `load ${round.loadBefore.toFixed(1)}`,
        );
      }
  } finally {
    for (const client of clients) await client.end().catch(() => undefined);
    await cluster.destroy();
  }
  const loadAfterTimed = loadavg();
  log('instruction counts (callgrind)');
  const counts = values['no-instructions']
    ? 'Not measured (--no-instructions).\n'
    : instructions(pgConfigArgs);
  const summary = report(
    rounds,
    installation.version,
    command,
    loadAtStart,
    loadAfterTimed,
    counts,
  );
  fs.writeFileSync(path.join(out, 'summary.md'), summary);
  fs.writeFileSync(
    path.join(out, 'summary.json'),
    JSON.stringify({ loadAtStart, loadAfterTimed, rounds }, null, 2) + '\n',
  );
  process.stdout.write(summary);
  log(`wrote ${path.relative(PACKAGE_ROOT, out)}/summary.md`);
}

function report(
  rounds: Round[],
  version: string,
  command: string,
  loadAtStart: string,
  loadAfter: string,
  counts: string,
): string {
  const f = (v: number) => (Number.isFinite(v) ? String(Math.round(v)) : '-');
  const byArm = (id: string) => rounds.filter((round) => round.arm === id);
  const med = (id: string, pick: (round: Round) => number) => median(byArm(id).map(pick));
  const ratio = (id: string, pick: (round: Round) => number) =>
    median(
      [...new Set(rounds.map((round) => round.round))].map((r) => {
        const of = (arm: string) => pick(rounds.find((x) => x.round === r && x.arm === arm)!);
        return of(id) / of('counted');
      }),
    );
  const lines = [
    `# Counted keys under contention: ${SESSIONS} workers on one key (issue 35)`,
    '',
    `Command: \`${command}\`. PostgreSQL ${version}, fsync, synchronous_commit and ` +
      `full_page_writes on (bench/setup.ts BENCH_SETTINGS); node ${process.version}; ` +
      `${os.cpus().length} shared cores, server and client on the same cores. Environment: environment.md ` +
      `(commit ${gitCommit()}). Load average (1/5/15 min) at the start ${loadAtStart}, ` +
      `after the timed rounds ${loadAfter}.`,
    '',
    `Each arm: ${SESSIONS} sessions (own connections, named prepared statements) on one key, ` +
      `each looping acquire attempt, and when granted an immediate release; a denied attempt is ` +
      `retried at once. ${ROUNDS} rounds of ${SECONDS} s per arm, arms taking turns (order reversed ` +
      `every round, VACUUM + CHECKPOINT before every slice); medians over the rounds. A cycle ` +
      `is a granted acquire and its release. Latencies are per call, from this Node.js process, in µs.`,
    '',
    '| arm | cycles/s | attempts/s | granted share | attempt p50 / p99 | granted acquire p99 | denied p99 | release p50 / p99 | attempt-to-grant p50 / p99 |',
    '|---|---:|---:|---:|---:|---:|---:|---:|---:|',
  ];
  for (const arm of ARMS) {
    const cycles = med(arm.id, (r) => r.cycles / r.seconds);
    const attempts = med(arm.id, (r) => r.attempts / r.seconds);
    lines.push(
      `| ${arm.label} | ${f(cycles)} | ${f(attempts)} | ` +
        `${(med(arm.id, (r) => r.cycles / r.attempts) * 100).toFixed(0)}% | ` +
        `${f(med(arm.id, (r) => r.attempt.p50Us))} / ${f(med(arm.id, (r) => r.attempt.p99Us))} | ` +
        `${f(med(arm.id, (r) => r.granted.p99Us))} | ${f(med(arm.id, (r) => r.denied.p99Us))} | ` +
        `${f(med(arm.id, (r) => r.release.p50Us))} / ${f(med(arm.id, (r) => r.release.p99Us))} | ` +
        `${f(med(arm.id, (r) => r.toGrant.p50Us))} / ${f(med(arm.id, (r) => r.toGrant.p99Us))} |`,
    );
  }
  lines.push(
    '',
    'Ratios to the counted key, median over rounds of the ratio within a round:',
    '',
    '| arm | cycles/s ÷ counted | attempts/s ÷ counted | attempt p99 ÷ counted |',
    '|---|---:|---:|---:|',
  );
  for (const arm of ARMS.slice(1))
    lines.push(
      `| ${arm.label} | ${ratio(arm.id, (r) => r.cycles / r.seconds).toFixed(2)} | ` +
        `${ratio(arm.id, (r) => r.attempts / r.seconds).toFixed(2)} | ` +
        `${ratio(arm.id, (r) => r.attempt.p99Us).toFixed(2)} |`,
    );
  lines.push('', 'Every slice (load: 1-minute average just before it):', '');
  lines.push('| round | arm | cycles/s | attempts/s | attempt p99 | release p99 | load |');
  lines.push('|---:|---|---:|---:|---:|---:|---:|');
  for (const r of rounds)
    lines.push(
      `| ${r.round} | ${r.arm} | ${f(r.cycles / r.seconds)} | ${f(r.attempts / r.seconds)} | ` +
        `${f(r.attempt.p99Us)} | ${f(r.release.p99Us)} | ${r.loadBefore.toFixed(1)} |`,
    );
  lines.push('', '## Instructions per call (callgrind, single-user PostgreSQL)', '', counts.trim());
  return `${lines.join('\n')}\n`;
}

function gitCommit(): string {
  const run = spawnSync('git', ['-C', PACKAGE_ROOT, 'rev-parse', '--short', 'HEAD'], {
    encoding: 'utf8',
  });
  return run.status === 0 ? run.stdout.trim() : 'unknown';
}

await main();
