/**
 * `npm run bench:citus -- [--seconds N] [--rounds N] [--workers N]`: pg_lease's SQL API through a
 * Citus coordinator with one worker and with two, against a single server of the same build.
 *
 * Each arm is 16 sessions (one pg.Pool) running acquire + renew + release on random keys of
 * their own (100 per session by default, so no two sessions meet on a key and most acquires
 * take a key granted before; --keys 10000 makes most of them first grants), each call an autocommit
 * transaction with the durable settings of `npm run bench`. The arms take turns in rounds of a
 * few seconds each, so that drift of a shared machine hits them alike, and the medians over the
 * rounds are reported: cycles per second, and p50 / p99 of each call.
 *
 * It needs the Citus build installed into the system PostgreSQL (`../shared/citus` for this
 * repository's CI; see test/citus); the single-server arm uses the same build without Citus.
 * On a machine with fewer cores than nodes this shows the cost of the hop from the coordinator
 * to a worker, not scale-out: every node shares the same cores.
 *
 * Writes summary.md to bench/results/<timestamp>-citus/.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { execFileSync } from 'node:child_process';
import pg from 'pg';
import {
  PACKAGE_ROOT,
  PgCluster,
  citusMissingReason,
  startCitusCluster,
  type CitusCluster,
} from 'pg-lease-testing';
import { BENCH_SETTINGS } from './setup.js';
import { median, summarise, type LatencySummary } from './stats.js';

const { values } = parseArgs({
  options: {
    seconds: { type: 'string', default: '5' },
    rounds: { type: 'string', default: '3' },
    workers: { type: 'string', default: '16' },
    keys: { type: 'string', default: '100' },
    help: { type: 'boolean', short: 'h' },
  },
});
if (values.help) {
  process.stdout.write(
    'Usage: npm run bench:citus -- [--seconds N (per arm and round, default 5)] [--rounds N (default 3)]\n' +
      '         [--workers N (sessions, default 16)] [--keys N (keys per session, default 100)]\n',
  );
  process.exit(0);
}
const SECONDS = Number(values.seconds);
const ROUNDS = Number(values.rounds);
const SESSIONS = Number(values.workers);
const KEYS_PER_SESSION = Number(values.keys);
for (const [name, value] of [
  ['--seconds', SECONDS],
  ['--rounds', ROUNDS],
  ['--workers', SESSIONS],
  ['--keys', KEYS_PER_SESSION],
] as const)
  if (!Number.isInteger(value) || value < 1) {
    process.stderr.write(`${name} must be a positive whole number\n`);
    process.exit(64);
  }

/** The settings of `npm run bench`; Citus needs more connections per node. */
const SETTINGS = { ...BENCH_SETTINGS, max_connections: 200 };

const OPS = ['acquire', 'renew', 'release'] as const;
type Op = (typeof OPS)[number];

interface Arm {
  label: string;
  url: string;
  close(): Promise<void>;
  cluster?: CitusCluster;
}

interface Round {
  cycles: number;
  seconds: number;
  latencies: Record<Op, LatencySummary>;
}

async function runRound(url: string): Promise<Round> {
  const pool = new pg.Pool({ connectionString: url, max: SESSIONS });
  pool.on('error', () => undefined);
  const latencies: Record<Op, number[]> = { acquire: [], renew: [], release: [] };
  let cycles = 0;
  const timed = async <T>(op: Op, run: () => Promise<T>): Promise<T> => {
    const started = performance.now();
    const result = await run();
    latencies[op].push((performance.now() - started) * 1000);
    return result;
  };
  // Connections first, so that the measured seconds hold calls only.
  await Promise.all(Array.from({ length: SESSIONS }, async () => (await pool.connect()).release()));
  const started = performance.now();
  const until = started + SECONDS * 1000;
  await Promise.all(
    Array.from({ length: SESSIONS }, async (_, session) => {
      const owner = `bench-${session}`;
      while (performance.now() < until) {
        const key = `bench:${session}:${Math.floor(Math.random() * KEYS_PER_SESSION)}`;
        const grant = await timed('acquire', () =>
          pool.query<{ acquired: boolean; epoch: string }>(
            `SELECT acquired, epoch FROM lease.acquire($1, $2, '30 seconds')`,
            [key, owner],
          ),
        );
        const { acquired, epoch } = grant.rows[0]!;
        if (!acquired) throw new Error(`${key}: not acquired, but no other session uses it`);
        await timed('renew', () =>
          pool.query(`SELECT status FROM lease.renew($1, $2, $3, '30 seconds')`, [
            key,
            owner,
            epoch,
          ]),
        );
        await timed('release', () =>
          pool.query(`SELECT status FROM lease.release($1, $2, $3)`, [key, owner, epoch]),
        );
        cycles++;
      }
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  await pool.end();
  return {
    cycles,
    seconds,
    latencies: {
      acquire: summarise(latencies.acquire),
      renew: summarise(latencies.renew),
      release: summarise(latencies.release),
    },
  };
}

async function citusArm(workers: number): Promise<Arm> {
  const citus: CitusCluster = await startCitusCluster({ workers, settings: SETTINGS });
  await citus.query('SELECT lease.distribute()');
  return {
    label: `Citus, coordinator + ${workers} worker${workers === 1 ? '' : 's'}`,
    url: citus.url(),
    close: () => citus.destroy(),
    cluster: citus,
  };
}

async function main(): Promise<void> {
  const missing = citusMissingReason();
  if (missing) {
    process.stderr.write(`bench:citus needs Citus: ${missing}\n`);
    process.exit(2);
  }
  const log = (line: string) =>
    process.stderr.write(`[citus ${new Date().toISOString().slice(11, 19)}] ${line}\n`);
  const arms: Arm[] = [];
  try {
    arms.push(await citusArm(1));
    arms.push(await citusArm(2));
    // The single server: the same build, without Citus.
    const citus = arms[0]!.cluster!;
    const plain = await PgCluster.start({
      installation: citus.coordinator.installation,
      settings: SETTINGS,
    });
    arms.unshift({
      label: `one server (no Citus)`,
      url: await plain.createDatabase(undefined, { extension: true }),
      close: () => plain.destroy(),
    });
    const { rows } = await citus.query<{ version: string }>(
      `SELECT extversion AS version FROM pg_extension WHERE extname = 'citus'`,
    );
    const build = `PostgreSQL ${citus.coordinator.installation.version} with Citus ${rows[0]!.version}`;
    const rounds = new Map<string, Round[]>(arms.map((arm) => [arm.label, []]));
    for (let r = 1; r <= ROUNDS; r++)
      for (const arm of r % 2 ? arms : [...arms].reverse()) {
        const round = await runRound(arm.url);
        rounds.get(arm.label)!.push(round);
        log(
          `round ${r}, ${arm.label}: ${Math.round(round.cycles / round.seconds)} cycles/s, ` +
            OPS.map((op) => `${op} p99 ${Math.round(round.latencies[op].p99Us)} us`).join(', '),
        );
      }
    const summary = report(rounds, build);
    const stamp = new Date()
      .toISOString()
      .replace(/[-:]/g, '')
      .replace(/\.\d+Z$/, 'Z');
    const dir = path.join(PACKAGE_ROOT, 'bench', 'results', `${stamp}-citus`);
    fs.mkdirSync(dir, { recursive: true });
    fs.writeFileSync(path.join(dir, 'summary.md'), summary);
    process.stdout.write(summary);
    log(`wrote ${path.relative(PACKAGE_ROOT, dir)}/summary.md`);
  } finally {
    for (const arm of arms) await arm.close().catch(() => undefined);
  }
}

function report(rounds: Map<string, Round[]>, build: string): string {
  const lines = [
    '# pg_lease through Citus: one worker, two workers, one server',
    '',
    `Command: \`npm run bench:citus -- --seconds ${SECONDS} --rounds ${ROUNDS} --workers ${SESSIONS} --keys ${KEYS_PER_SESSION}\`. ` +
      `${build}; ${SESSIONS} sessions, acquire + renew + release ` +
      `on random keys of their own (${KEYS_PER_SESSION} each), each call its own transaction; fsync and synchronous_commit on. ` +
      `${os.cpus().length} cores shared by every node and the client; load average at the end ` +
      `${os
        .loadavg()
        .map((l) => l.toFixed(1))
        .join(' ')}; commit ${gitCommit()}. Medians over ${ROUNDS} rounds ` +
      `of ${SECONDS} s per arm, the arms taking turns.`,
    '',
    '| arm | cycles/s | calls/s | acquire p50 / p99 µs | renew p50 / p99 µs | release p50 / p99 µs |',
    '|---|---:|---:|---:|---:|---:|',
  ];
  for (const [label, list] of rounds) {
    const rate = median(list.map((round) => round.cycles / round.seconds));
    const cells = OPS.map((op) => {
      const p50 = median(list.map((round) => round.latencies[op].p50Us));
      const p99 = median(list.map((round) => round.latencies[op].p99Us));
      return `${Math.round(p50)} / ${Math.round(p99)}`;
    });
    lines.push(
      `| ${label} | ${Math.round(rate)} | ${Math.round(rate * 3)} | ${cells.join(' | ')} |`,
    );
  }
  return `${lines.join('\n')}\n`;
}

function gitCommit(): string {
  try {
    return execFileSync('git', ['-C', PACKAGE_ROOT, 'rev-parse', '--short', 'HEAD'], {
      encoding: 'utf8',
    }).trim();
  } catch {
    return 'unknown';
  }
}

await main();
