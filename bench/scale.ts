/**
 * `npm run bench:scale`: pg_lease at scale, measured from Node.js on a durable throwaway cluster
 * (the settings of `npm run bench`).
 *
 *   client    the TypeScript client's acquire + renew + release cycle against the same three
 *             SQL calls sent as prepared statements by node-postgres, and against the client
 *             with unnamed statements (preparedStatements: false); 1 and 16 workers in one
 *             process, each on a key of its own; the arms alternate in short slices so that
 *             drift on a shared machine hits them alike.
 *   batch     1000 keys renewed by one lease.renew_many call against 1000 single renews (each
 *             its own autocommit transaction, as a holder's renewals are), keys per second;
 *             the same for acquire_many / release_many.
 *   peers     16 workers doing acquire + renew + release, pg-lease client against node-redlock
 *             on Redis with appendfsync always, in the same run (skipped, and said so, when
 *             redis-server is not installed).
 *   capacity  N live leases of one owner kept alive by one client's shared keep-alive (ttl 30 s,
 *             renewed every 10 s; --ttl and --interval change them) for --window seconds:
 *             server CPU, client CPU, WAL bytes per second, the closest any lease came to its
 *             expiry, leases lost, client heap per lease, and the same over time as a chart;
 *             10k, 100k and 1M (10k in quick mode; --leases picks the sizes).
 *
 * Writes summary.md, summary.json and environment.md to bench/results/<timestamp>-scale/.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { LeaseClient, type Lease } from '../src/index.js';
import { PACKAGE_ROOT, PgCluster, findInstallation } from 'pg-lease-testing';
import { recordEnvironment, writeEnvironment } from './environment.js';
import { processCpuTicks, serverCpuTicks } from './measure.js';
import { findPgbench } from './pgbench.js';
import { BENCH_DATABASE, BENCH_SETTINGS } from './setup.js';
import { median, percentile } from './stats.js';
import { lineChart } from './svg.js';

const TICK_MS = 10; // USER_HZ 100

/** Mean cores busy over `seconds`, from CPU clock ticks. */
const coresOf = (ticks: number, seconds: number): number => (ticks * TICK_MS) / 1000 / seconds;

const { values } = parseArgs({
  options: {
    quick: { type: 'boolean' },
    leases: { type: 'string' },
    major: { type: 'string' },
    'pg-config': { type: 'string' },
    phases: { type: 'string' },
    ttl: { type: 'string' },
    interval: { type: 'string' },
    window: { type: 'string' },
    redraw: { type: 'string' },
    out: { type: 'string' },
    help: { type: 'boolean' },
  },
});
if (values.help) {
  console.log(`npm run bench:scale -- [--quick] [--major 14..18 | --pg-config PATH]
      [--phases client,batch,peers,capacity] [--out DIR]
      capacity: [--leases 10000,100000,1000000] [--ttl 30s] [--interval 10s] [--window SECONDS]
        --window  how long each size is kept alive after its grants (default 45, quick 25);
                  the run writes capacity-<leases>.svg: leases lost, CPU and heap over time
      --redraw DIR  only redraw the capacity charts of the run in DIR from its summary.json`);
  process.exit(0);
}
if (values.redraw) {
  // Redraws a run's capacity charts from its summary.json (after a change to the chart).
  const { capacity } = JSON.parse(
    fs.readFileSync(path.join(values.redraw, 'summary.json'), 'utf8'),
  ) as { capacity: Parameters<typeof writeCapacityChart>[1][] };
  for (const row of capacity) writeCapacityChart(values.redraw, row);
  process.exit(0);
}
const quick = values.quick ?? false;
const phases = new Set((values.phases ?? 'client,batch,peers,capacity').split(','));
const stamp = new Date()
  .toISOString()
  .replace(/[-:]/g, '')
  .replace(/\.\d+Z$/, 'Z');
const out =
  values.out ??
  path.join(
    PACKAGE_ROOT,
    'bench',
    'results',
    `${stamp}-${values.phases === 'peers' ? 'peers' : 'scale'}${quick ? '-quick' : ''}`,
  );
const log = (line: string) =>
  process.stderr.write(`[scale ${new Date().toISOString().slice(11, 19)}] ${line}\n`);

const summary: Record<string, unknown> = { quick, startedAt: new Date().toISOString() };
const md: string[] = [];

// ---------------------------------------------------------------------------------------------
// Workers

type Cycle = (worker: number, round: number) => Promise<void>;

/** Runs `workers` loops of `cycle` for `ms`; returns every cycle's latency in microseconds. */
async function runFor(workers: number, ms: number, cycle: Cycle): Promise<number[]> {
  const latencies: number[] = [];
  const end = performance.now() + ms;
  await Promise.all(
    Array.from({ length: workers }, async (_, worker) => {
      for (let round = 0; performance.now() < end; round++) {
        const start = performance.now();
        await cycle(worker, round);
        latencies.push((performance.now() - start) * 1000);
      }
    }),
  );
  return latencies;
}

interface ArmResult {
  p50Us: number;
  cyclesPerSecond: number;
  /** CPU time of this Node.js process per cycle (user + system), µs. */
  clientCpuUs: number;
  /** CPU time of the arm's server processes per cycle, µs (10 ms ticks summed over the slices). */
  serverCpuUs: number;
  /** Per-cycle deltas of the arm's counters (round trips, commits, fsyncs), when it has any. */
  perCycle?: Record<string, number>;
}

/** The cluster whose server CPU `interleaved` charges to each arm; set by main. */
let benchCluster: PgCluster | undefined;

/** What `interleaved` reads around each slice of an arm, besides the client's own CPU. */
interface Probes {
  /** CPU ticks of the arm's server (default: all of the bench cluster's processes). */
  serverTicks?: Record<string, () => number | undefined>;
  /** Counters read before and after each slice of the arm; reported per cycle. */
  counters?: Record<string, () => Promise<Record<string, number>>>;
  /** Pause after a slice before its counters are read (PostgreSQL's statistics lag ~1 s). */
  settleMs?: number;
}

/** Alternates the arms in slices (order reversed every slice); medians over slices. */
async function interleaved(
  arms: Record<string, Cycle>,
  workers: number,
  slices: number,
  sliceMs: number,
  probes: Probes = {},
): Promise<Record<string, ArmResult>> {
  const names = Object.keys(arms);
  const perArm = new Map<
    string,
    {
      p50: number[];
      rate: number[];
      cycles: number;
      clientUs: number;
      serverTicks: number;
      counted: Record<string, number>;
    }
  >(
    names.map((n) => [
      n,
      { p50: [], rate: [], cycles: 0, clientUs: 0, serverTicks: 0, counted: {} },
    ]),
  );
  const defaultTicks = () => (benchCluster ? serverCpuTicks(benchCluster) : undefined);
  for (let slice = 0; slice < slices; slice++) {
    const order = slice % 2 ? [...names].reverse() : names;
    for (const name of order) {
      const arm = perArm.get(name)!;
      const ticksOf = probes.serverTicks?.[name] ?? defaultTicks;
      const count = probes.counters?.[name];
      if (count && probes.settleMs) await sleep(probes.settleMs);
      const counts0 = count ? await count() : undefined;
      const cpu0 = process.cpuUsage();
      const ticks0 = ticksOf();
      const latencies = await runFor(workers, sliceMs, arms[name]!);
      const cpu = process.cpuUsage(cpu0);
      const ticks1 = ticksOf();
      if (count) {
        if (probes.settleMs) await sleep(probes.settleMs);
        const counts1 = await count();
        for (const [k, v] of Object.entries(counts1))
          arm.counted[k] = (arm.counted[k] ?? 0) + v - (counts0![k] ?? 0);
      }
      arm.cycles += latencies.length;
      arm.clientUs += cpu.user + cpu.system;
      if (ticks0 !== undefined && ticks1 !== undefined) arm.serverTicks += ticks1 - ticks0;
      latencies.sort((a, b) => a - b);
      arm.p50.push(percentile(latencies, 50));
      arm.rate.push(latencies.length / (sliceMs / 1000));
    }
  }
  return Object.fromEntries(
    names.map((n) => {
      const arm = perArm.get(n)!;
      const result: ArmResult = {
        p50Us: median(arm.p50),
        cyclesPerSecond: median(arm.rate),
        clientCpuUs: arm.clientUs / arm.cycles,
        serverCpuUs: (arm.serverTicks * TICK_MS * 1000) / arm.cycles,
      };
      if (probes.counters?.[n])
        result.perCycle = Object.fromEntries(
          Object.entries(arm.counted).map(([k, v]) => [k, v / arm.cycles]),
        );
      return [n, result];
    }),
  );
}

// ---------------------------------------------------------------------------------------------
// Phases

async function clientPhase(url: string): Promise<void> {
  log('client vs SQL');
  const pool = new pg.Pool({ connectionString: url, max: 16 });
  const named = new LeaseClient(pool);
  const unnamed = new LeaseClient(pool, { preparedStatements: false });
  const coalescing = new LeaseClient(pool, { coalesce: true, owner: `bench-${process.pid}` });
  const sql: Cycle = async (worker, round) => {
    const key = `sql-${worker}`;
    const owner = `sql-${worker}-${round}`;
    const a = await pool.query({
      name: 'b_acquire',
      text: 'SELECT acquired, epoch FROM lease.acquire($1, $2, $3::interval)',
      values: [key, owner, '30 seconds'],
    });
    const epoch = a.rows[0].epoch as string;
    await pool.query({
      name: 'b_renew',
      text: 'SELECT status FROM lease.renew($1, $2, $3, $4::interval)',
      values: [key, owner, epoch, '30 seconds'],
    });
    await pool.query({
      name: 'b_release',
      text: 'SELECT status FROM lease.release($1, $2, $3)',
      values: [key, owner, epoch],
    });
  };
  // The calls as a user writes them by hand: plain pool.query, unnamed, every column.
  const hand: Cycle = async (worker, round) => {
    const key = `hand-${worker}`;
    const owner = `hand-${worker}-${round}`;
    const a = await pool.query('SELECT * FROM lease.acquire($1, $2, $3::interval)', [
      key,
      owner,
      '30 seconds',
    ]);
    if (!a.rows[0].acquired) throw new Error(`${key} not acquired`);
    const epoch = a.rows[0].epoch as string;
    const r = await pool.query('SELECT * FROM lease.renew($1, $2, $3, $4::interval)', [
      key,
      owner,
      epoch,
      '30 seconds',
    ]);
    if (r.rows[0].status !== 'ok') throw new Error(`${key} not renewed`);
    await pool.query('SELECT * FROM lease.release($1, $2, $3)', [key, owner, epoch]);
  };
  const viaClient =
    (client: LeaseClient, tag: string): Cycle =>
    async (worker) => {
      const lease = await client.acquire(`${tag}-${worker}`, { ttl: '30s' });
      await lease!.renew();
      await lease!.release();
    };
  const arms = {
    client: viaClient(named, 'client'),
    'client-unnamed': viaClient(unnamed, 'unnamed'),
    'client-coalesce': viaClient(coalescing, 'coalesce'),
    'sql-prepared': sql,
    'sql-hand': hand,
  };
  const result: Record<string, unknown> = {};
  md.push('## Client vs SQL: acquire + renew + release', '');
  md.push(
    '| workers | client p50 µs | SQL by hand p50 µs | client / hand (p50) | client / hand (rate) | SQL prepared p50 µs | client / prepared (p50) | client / prepared (rate) | client unnamed p50 µs | client coalesce p50 µs | client cycles/s | hand cycles/s | prepared cycles/s | client coalesce cycles/s | target |',
    '|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|',
  );
  for (const workers of [1, 16]) {
    await runFor(workers, 1_000, arms.client); // warm-up: connections and statements
    await runFor(workers, 1_000, arms['sql-prepared']);
    await runFor(workers, 1_000, arms['client-unnamed']);
    await runFor(workers, 1_000, arms['client-coalesce']);
    await runFor(workers, 1_000, arms['sql-hand']);
    const r = await interleaved(arms, workers, quick ? 3 : 8, quick ? 1_000 : 2_000);
    result[workers] = r;
    const c = r.client!;
    const s = r['sql-prepared']!;
    const u = r['client-unnamed']!;
    const k = r['client-coalesce']!;
    const h = r['sql-hand']!;
    md.push(
      `| ${workers} | ${c.p50Us.toFixed(0)} | ${h.p50Us.toFixed(0)} | ${(c.p50Us / h.p50Us).toFixed(2)} | ${(h.cyclesPerSecond / c.cyclesPerSecond).toFixed(2)} | ${s.p50Us.toFixed(0)} | ${(c.p50Us / s.p50Us).toFixed(2)} | ${(s.cyclesPerSecond / c.cyclesPerSecond).toFixed(2)} | ${u.p50Us.toFixed(0)} | ${k.p50Us.toFixed(0)} | ${c.cyclesPerSecond.toFixed(0)} | ${h.cyclesPerSecond.toFixed(0)} | ${s.cyclesPerSecond.toFixed(0)} | ${k.cyclesPerSecond.toFixed(0)} | client ≤ 1.05x hand |`,
    );
  }
  md.push(
    '',
    'CPU per cycle (robust to a loaded machine: waiting for a core costs no CPU time), µs, client process / server:',
    '',
    '| workers | client | client unnamed | client coalesce | SQL prepared | SQL by hand |',
    '|---:|---:|---:|---:|---:|---:|',
  );
  for (const workers of [1, 16]) {
    const r = result[workers] as Record<string, ArmResult>;
    const cell = (a: ArmResult) => `${a.clientCpuUs.toFixed(0)} / ${a.serverCpuUs.toFixed(0)}`;
    md.push(
      `| ${workers} | ${cell(r.client!)} | ${cell(r['client-unnamed']!)} | ${cell(r['client-coalesce']!)} | ${cell(r['sql-prepared']!)} | ${cell(r['sql-hand']!)} |`,
    );
  }
  md.push(
    '',
    'Medians over alternating slices; each cycle is three autocommit calls on a key of the worker’s own. ' +
      "`SQL by hand` is the three calls as a user writes them: `pool.query('SELECT * FROM lease.acquire($1, $2, $3::interval)', [...])` and so on, unnamed, checking acquired and status; `SQL prepared` names them and selects only the columns read. " +
      'The rate ratios are time per cycle, client / SQL (the inverse of cycles per second), so above 1 means the client is slower. ' +
      '`client unnamed` is the client with `preparedStatements: false`: the difference to `client` is what named statements save per cycle. ' +
      '`client coalesce` is the client with `coalesce: true` and one owner for the process: calls made in the same tick share acquire_many / renew_many / release_many statements.',
    '',
  );
  summary.client = result;
  await pool.end();
}

/** Like the main runner before each run: no run inherits dead row versions or owes a checkpoint. */
async function tidy(db: pg.Client): Promise<void> {
  await db.query('VACUUM lease.leases');
  await db.query('CHECKPOINT');
}

async function batchPhase(url: string): Promise<void> {
  log('batch speed-up');
  const db = new pg.Client({ connectionString: url });
  await db.connect();
  const n = 1000;
  const keys = Array.from({ length: n }, (_, i) => `batch-${i}`);
  const owner = 'batch-owner';
  await db.query('SELECT count(*) FROM lease.acquire_many($1, $2, $3)', [keys, owner, '1 hour']);
  const { rows } = await db.query<{ epoch: string }>(
    'SELECT epoch::text AS epoch FROM lease.acquire_many($1, $2, $3)',
    [keys, owner, '1 hour'],
  );
  const epochs = rows.map((r) => r.epoch);
  const reps = quick ? 5 : 20;
  await tidy(db);
  const batchTimes: number[] = [];
  for (let i = 0; i < reps; i++) {
    const start = performance.now();
    const r = await db.query({
      name: 'renew_many',
      text: "SELECT count(*) FILTER (WHERE status = 'ok') AS ok FROM lease.renew_many($1, $2, $3, $4::interval)",
      values: [keys, owner, epochs, '1 hour'],
    });
    batchTimes.push(performance.now() - start);
    if (Number(r.rows[0].ok) !== n) throw new Error('renew_many did not renew every key');
  }
  const singleTimes: number[] = [];
  for (let i = 0; i < (quick ? 1 : 3); i++) {
    await tidy(db);
    const start = performance.now();
    for (let k = 0; k < n; k++) {
      const r = await db.query({
        name: 'renew',
        text: 'SELECT status FROM lease.renew($1, $2, $3, $4::interval)',
        values: [keys[k], owner, epochs[k], '1 hour'],
      });
      if (r.rows[0].status !== 'ok') throw new Error('renew failed');
    }
    singleTimes.push(performance.now() - start);
  }
  const releaseTimes: number[] = [];
  const acquireTimes: number[] = [];
  for (let i = 0; i < (quick ? 3 : 5); i++) {
    await tidy(db);
    const { rows: held } = await db.query<{ epoch: string }>(
      'SELECT epoch::text AS epoch FROM lease.acquire_many($1, $2, $3)',
      [keys, owner, '1 hour'],
    );
    let start = performance.now();
    await db.query('SELECT count(*) FROM lease.release_many($1, $2, $3)', [
      keys,
      owner,
      held.map((r) => r.epoch),
    ]);
    releaseTimes.push(performance.now() - start);
    start = performance.now();
    await db.query('SELECT count(*) FROM lease.acquire_many($1, $2, $3)', [keys, owner, '1 hour']);
    acquireTimes.push(performance.now() - start);
    const { rows: again } = await db.query<{ epoch: string }>(
      'SELECT epoch::text AS epoch FROM lease.acquire_many($1, $2, $3)',
      [keys, owner, '1 hour'],
    );
    await db.query('SELECT count(*) FROM lease.release_many($1, $2, $3)', [
      keys,
      owner,
      again.map((r) => r.epoch),
    ]);
  }
  const releaseMs = median(releaseTimes);
  const acquireMs = median(acquireTimes);
  await db.end();
  const batchMs = median(batchTimes);
  const singleMs = median(singleTimes);
  const speedUp = singleMs / batchMs;
  summary.batch = {
    keys: n,
    batchMs,
    singleMs,
    speedUp,
    acquireManyMs: acquireMs,
    releaseManyMs: releaseMs,
  };
  md.push(
    '## Batch speed-up: 1000 keys',
    '',
    '| | ms for 1000 keys | keys/s |',
    '|---|---:|---:|',
    `| one \`renew_many\` call (median of ${reps}) | ${batchMs.toFixed(1)} | ${((n / batchMs) * 1000).toFixed(0)} |`,
    `| 1000 single \`renew\` calls, each its own commit (median of ${singleTimes.length}) | ${singleMs.toFixed(0)} | ${((n / singleMs) * 1000).toFixed(0)} |`,
    `| one \`acquire_many\` of 1000 free keys (median) | ${acquireMs.toFixed(1)} | ${((n / acquireMs) * 1000).toFixed(0)} |`,
    `| one \`release_many\` of 1000 held keys (median) | ${releaseMs.toFixed(1)} | ${((n / releaseMs) * 1000).toFixed(0)} |`,
    '',
    `Speed-up of renew_many: **${speedUp.toFixed(1)}x** (target ≥ 20x). One connection, prepared statements, fsync on.`,
    '',
  );
}

function findRedisServer(): string | undefined {
  for (const candidate of [
    process.env.REDIS_SERVER,
    '/usr/bin/redis-server',
    '/usr/local/bin/redis-server',
  ])
    if (candidate && fs.existsSync(candidate)) return candidate;
  const which = spawnSync('sh', ['-c', 'command -v redis-server'], { encoding: 'utf8' });
  return which.status === 0 ? which.stdout.trim() : undefined;
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.listen(0, '127.0.0.1', () => {
      const port = (server.address() as net.AddressInfo).port;
      server.close(() => resolve(port));
    });
    server.on('error', reject);
  });
}

/** Waits until something accepts connections on the port (redis-server starting up). */
async function untilListening(port: number): Promise<void> {
  for (let i = 0; ; i++) {
    const ok = await new Promise<boolean>((resolve) => {
      const socket = net.connect(port, '127.0.0.1');
      socket.once('connect', () => {
        socket.end();
        resolve(true);
      });
      socket.once('error', () => resolve(false));
    });
    if (ok) return;
    if (i > 100) throw new Error(`nothing listens on port ${port}`);
    await sleep(100);
  }
}

/** Settings of the peers' servers, appended to environment.md by main. */
const peerSettings: string[] = [];

/** Stops a server this run started and waits for it to exit (at most 10 s, then SIGKILL). */
async function stopServer(child: ChildProcess | undefined): Promise<void> {
  if (!child || child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
  await exited;
  clearTimeout(timer);
}

function findBinary(name: string, env: string | undefined): string | undefined {
  for (const candidate of [env, `/usr/bin/${name}`, `/usr/local/bin/${name}`])
    if (candidate && fs.existsSync(candidate)) return candidate;
  const which = spawnSync('sh', ['-c', `command -v ${name}`], { encoding: 'utf8' });
  return which.status === 0 && which.stdout.trim() ? which.stdout.trim() : undefined;
}

/** Sums the samples of the named metrics in a Prometheus text page. */
function metricSums(text: string, names: string[]): Record<string, number> {
  const sums: Record<string, number> = Object.fromEntries(names.map((n) => [n, 0]));
  for (const line of text.split('\n')) {
    if (line.startsWith('#')) continue;
    const name = line.split(/[{ ]/, 1)[0]!;
    if (name in sums) sums[name] = sums[name]! + Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return sums;
}

async function peersPhase(url: string): Promise<void> {
  log('peers');
  md.push('## Peers: 16 workers, acquire + renew + release', '');
  const redisServer = findRedisServer();
  // Counts the statements the pg-lease arms send: one round trip each.
  let pgStatements = 0;
  const pool = new pg.Pool({
    connectionString: url,
    max: 16,
    Client: class extends pg.Client {
      override query(...args: unknown[]): never {
        pgStatements++;
        return (super.query as (...a: unknown[]) => never)(...args);
      }
    },
  });
  const stats = new pg.Client({ connectionString: url });
  await stats.connect();
  const pgMajor = Number(
    (await stats.query<{ v: string }>("SELECT current_setting('server_version_num') AS v")).rows[0]!
      .v,
  );
  // WAL flushes: pg_stat_io (object wal) from 18 on, pg_stat_wal.wal_sync in 14..17.
  const walSyncSql =
    pgMajor >= 180000
      ? "SELECT coalesce(sum(fsyncs), 0)::float8 AS n FROM pg_stat_io WHERE object = 'wal'"
      : pgMajor >= 140000
        ? 'SELECT wal_sync::float8 AS n FROM pg_stat_wal'
        : 'SELECT 0::float8 AS n';
  const pgCounters = async (): Promise<Record<string, number>> => {
    const statements = pgStatements;
    const { rows } = await stats.query<{ commits: number; syncs: number }>(
      `SELECT (SELECT xact_commit::float8 FROM pg_stat_database WHERE datname = current_database()) AS commits,
              (${walSyncSql}) AS syncs`,
    );
    return { roundTrips: statements, commits: rows[0]!.commits, fsyncs: rows[0]!.syncs };
  };
  const client = new LeaseClient(pool);
  const coalescing = new LeaseClient(pool, { coalesce: true, owner: `peers-${process.pid}` });
  const arms: Record<string, Cycle> = {
    'pg-lease client': async (worker) => {
      const lease = await client.acquire(`peer-${worker}`, { ttl: '30s' });
      await lease!.renew();
      await lease!.release();
    },
    'pg-lease client, coalesce: true': async (worker) => {
      const lease = await coalescing.acquire(`peer-co-${worker}`, { ttl: '30s' });
      await lease!.renew();
      await lease!.release();
    },
  };
  const serverTicks: Record<string, () => number | undefined> = {};
  const counters: Record<string, () => Promise<Record<string, number>>> = {
    'pg-lease client': pgCounters,
    'pg-lease client, coalesce: true': pgCounters,
  };
  const serverName: Record<string, string> = {
    'pg-lease client': 'PostgreSQL',
    'pg-lease client, coalesce: true': 'PostgreSQL',
  };
  const notes: string[] = [];
  const cleanups: (() => Promise<void>)[] = [];
  let redisVersion: string | undefined;
  let etcdVersion: string | undefined;
  try {
    // ---- node-redlock on Redis
    const redlockModules = await loadRedlock();
    if (!redisServer) {
      notes.push(
        'node-redlock arm SKIPPED: redis-server is not installed (Debian: `apt-get install redis-server`).',
      );
    } else if (!redlockModules) {
      notes.push(
        'node-redlock arm SKIPPED: the redlock and ioredis packages are not installed (`npm ci`).',
      );
    } else {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-lease-redis-'));
      const port = await freePort();
      redisVersion = spawnSync(redisServer, ['--version'], { encoding: 'utf8' }).stdout.trim();
      const redisArgs = [
        '--port',
        String(port),
        '--bind',
        '127.0.0.1',
        '--dir',
        dir,
        '--appendonly',
        'yes',
        '--appendfsync',
        'always',
        '--save',
        '',
        '--daemonize',
        'no',
      ];
      const redis = spawn(redisServer, redisArgs, { stdio: 'ignore' });
      cleanups.push(async () => {
        await stopServer(redis);
        fs.rmSync(dir, { recursive: true, force: true });
      });
      const { Redis, Redlock } = redlockModules;
      const connection = new Redis({ port, host: '127.0.0.1', lazyConnect: true });
      await untilListening(port);
      await connection.connect();
      cleanups.unshift(async () => connection.disconnect());
      // A second connection reads the command counter, so that it is not queued behind the arm.
      const admin = new Redis({ port, host: '127.0.0.1', lazyConnect: true });
      await admin.connect();
      cleanups.unshift(async () => admin.disconnect());
      const redlock = new Redlock([connection], { retryCount: 0 });
      const name = 'node-redlock (Redis, appendfsync always)';
      arms[name] = async (worker) => {
        const lock = await redlock.lock(`peer-${worker}`, 30_000);
        const extended = await lock.extend(30_000);
        await extended.unlock();
      };
      serverTicks[name] = () => (redis.pid ? processCpuTicks(redis.pid) : undefined);
      serverName[name] = 'Redis';
      counters[name] = async () => {
        const info = String(await admin.info('stats'));
        const n = Number(/total_commands_processed:(\d+)/.exec(info)?.[1] ?? NaN);
        return { roundTrips: n };
      };
      notes.push(
        `Redis: ${redisVersion}, one instance, \`${['redis-server', ...redisArgs.map((a) => (a === '' ? "''" : a))].join(' ')}\` (data dir a fresh temp dir, removed afterwards): every write is in the append-only file and fsynced before its reply, one fsync per event-loop turn that wrote; node-redlock 4 over ioredis, one connection for all 16 workers, as redlock is used. Round trips for Redis are the commands it processed (total_commands_processed; the counter's own INFO adds one a slice), 16 workers pipelined on one connection; its fsyncs are not counted.`,
      );
      peerSettings.push(
        `Redis: ${redisVersion}; \`appendonly yes\`, \`appendfsync always\` (fsync before replying, per event-loop turn), \`save ''\` (no RDB snapshots); one instance on 127.0.0.1, data dir a fresh temp dir.`,
      );
    }

    // ---- etcd: lease grant + put with the lease (guarded by a transaction) + keepalive + revoke
    const etcdBinary = findBinary('etcd', process.env.ETCD);
    const etcdModule = await loadEtcd();
    if (!etcdBinary) {
      notes.push(
        'etcd arm SKIPPED: etcd is not installed (Debian: `apt-get install etcd-server`, or set ETCD to the binary).',
      );
    } else if (!etcdModule) {
      notes.push('etcd arm SKIPPED: the etcd3 package is not installed (`npm ci`).');
    } else {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-lease-etcd-'));
      const clientPort = await freePort();
      const peerPort = await freePort();
      etcdVersion = spawnSync(etcdBinary, ['--version'], { encoding: 'utf8' })
        .stdout.split('\n')[0]!
        .trim();
      const clientUrl = `http://127.0.0.1:${clientPort}`;
      const peerUrl = `http://127.0.0.1:${peerPort}`;
      const etcdArgs = [
        '--name',
        'bench',
        '--data-dir',
        path.join(dir, 'data'),
        '--listen-client-urls',
        clientUrl,
        '--advertise-client-urls',
        clientUrl,
        '--listen-peer-urls',
        peerUrl,
        '--initial-advertise-peer-urls',
        peerUrl,
        '--initial-cluster',
        `bench=${peerUrl}`,
      ];
      const etcd = spawn(etcdBinary, etcdArgs, {
        stdio: ['ignore', 'ignore', fs.openSync(path.join(dir, 'etcd.log'), 'w')],
      });
      cleanups.push(async () => {
        await stopServer(etcd);
        fs.rmSync(dir, { recursive: true, force: true });
      });
      await untilListening(clientPort);
      const etcdClient = new etcdModule.Etcd3({ hosts: clientUrl });
      cleanups.unshift(async () => etcdClient.close());
      // Ready when a write goes through (the member has elected itself leader).
      for (let i = 0; ; i++) {
        try {
          await etcdClient.put('ready').value('1');
          break;
        } catch (error) {
          if (i > 100) throw error;
          await sleep(100);
        }
      }
      const name = 'etcd (etcd3 client, defaults: fsync on)';
      arms[name] = async (worker, round) => {
        const key = `peer-${worker}`;
        const lease = etcdClient.lease(30, { autoKeepAlive: false });
        const id = await lease.grant();
        const put = await etcdClient
          .if(key, 'Create', '==', 0)
          .then(etcdClient.put(key).value(`${worker}-${round}`).lease(id))
          .commit();
        if (!put.succeeded) throw new Error(`etcd: ${key} held`);
        await lease.keepaliveOnce();
        await lease.revoke();
      };
      serverTicks[name] = () => (etcd.pid ? processCpuTicks(etcd.pid) : undefined);
      serverName[name] = 'etcd';
      const metrics = [
        'grpc_server_handled_total',
        'etcd_disk_wal_fsync_duration_seconds_count',
        'etcd_disk_backend_commit_duration_seconds_count',
      ];
      counters[name] = async () => {
        const text = await (await fetch(`${clientUrl}/metrics`)).text();
        const m = metricSums(text, metrics);
        return {
          roundTrips: m.grpc_server_handled_total!,
          commits: m.etcd_disk_backend_commit_duration_seconds_count!,
          fsyncs: m.etcd_disk_wal_fsync_duration_seconds_count!,
        };
      };
      notes.push(
        `etcd: ${etcdVersion}, one member, \`${['etcd', ...etcdArgs].join(' ')}\` in a fresh temp dir (removed afterwards), every other setting its default: the WAL is fsynced before a write is acknowledged (one fsync per raft batch), the backend (bbolt) commits every 100 ms or 10000 writes. ` +
          'A cycle is a user’s lock on etcd with the `etcd3` client (gRPC, one HTTP/2 connection for all 16 workers): lease grant, a transaction that puts the key with the lease if the key does not exist (create revision 0), one keepalive (keepaliveOnce), lease revoke (which deletes the key). ' +
          'Round trips are gRPC calls handled (grpc_server_handled_total; the keepalive is a stream), fsyncs etcd_disk_wal_fsync_duration_seconds_count, commits etcd_disk_backend_commit_duration_seconds_count (bbolt), from its /metrics.',
      );
      peerSettings.push(
        `etcd: ${etcdVersion}; defaults (WAL fsync on every raft batch before acknowledging, no \`--unsafe-no-fsync\`; backend batch interval 100 ms / 10000 ops; snapshot count default); one member on 127.0.0.1, data dir a fresh temp dir; client: etcd3 ${etcdModule.version}.`,
      );
    }

    peerSettings.push(
      'PostgreSQL: fsync on, synchronous_commit on (Server settings above), the bench cluster of the other phases.',
    );
    for (const cycle of Object.values(arms)) await runFor(16, 1_000, cycle);
    const r = await interleaved(arms, 16, quick ? 3 : 6, quick ? 1_000 : 2_000, {
      serverTicks,
      counters,
      settleMs: 1_200,
    });
    md.push(
      '| arm | cycles/s | p50 µs | client CPU µs/cycle | server CPU µs/cycle | round trips/cycle | commits/cycle | fsyncs/cycle |',
      '|---|---:|---:|---:|---:|---:|---:|---:|',
    );
    const num = (v: number | undefined, digits = 2) =>
      v === undefined || Number.isNaN(v) ? 'n/a' : v.toFixed(digits);
    for (const [name, v] of Object.entries(r))
      md.push(
        `| ${name} | ${v.cyclesPerSecond.toFixed(0)} | ${v.p50Us.toFixed(0)} | ${v.clientCpuUs.toFixed(0)} | ${v.serverCpuUs.toFixed(0)} (${serverName[name]}) | ${num(v.perCycle?.roundTrips)} | ${num(v.perCycle?.commits)} | ${num(v.perCycle?.fsyncs)} |`,
      );
    md.push(
      '',
      'Medians over alternating slices of 16 workers, each on a key of its own. ' +
        'Server CPU is the arm’s own server’s (all PostgreSQL processes; the redis-server process; the etcd process, all threads), /proc ticks of 10 ms summed over the arm’s slices. ' +
        'PostgreSQL round trips are the statements the client sent (the arm’s pool counts them), commits `xact_commit` of the database, fsyncs the WAL fsyncs of every process (pg_stat_io from 18 on, pg_stat_wal before); counters are read 1.2 s after a slice so that the backends have flushed their statistics.',
      '',
      ...notes.flatMap((n) => [n, '']),
    );
    summary.peers = { arms: r, notes, redisVersion, etcdVersion, settings: peerSettings };
  } finally {
    for (const cleanup of cleanups) await cleanup().catch(() => undefined);
    await stats.end();
    await pool.end();
  }
}

interface EtcdModule {
  version: string;
  Etcd3: new (options: { hosts: string }) => EtcdClient;
}

interface EtcdClient {
  close(): void;
  lease(
    ttl: number,
    options: { autoKeepAlive: boolean },
  ): {
    grant(): Promise<string>;
    keepaliveOnce(): Promise<unknown>;
    revoke(): Promise<void>;
  };
  put(key: string): {
    value(v: string): Promise<unknown> & { lease(id: string): unknown };
  };
  if(
    key: string,
    column: string,
    cmp: string,
    value: number,
  ): { then(...ops: unknown[]): { commit(): Promise<{ succeeded: boolean }> } };
}

async function loadEtcd(): Promise<EtcdModule | undefined> {
  try {
    const etcd3 = (await import('etcd3' as string)) as { Etcd3: EtcdModule['Etcd3'] };
    const pkg = JSON.parse(
      fs.readFileSync(path.join(PACKAGE_ROOT, 'node_modules', 'etcd3', 'package.json'), 'utf8'),
    ) as { version: string };
    return { Etcd3: etcd3.Etcd3, version: pkg.version };
  } catch {
    return undefined;
  }
}

interface RedlockModules {
  Redis: new (options: Record<string, unknown>) => {
    connect(): Promise<void>;
    disconnect(): void;
    info(section: string): Promise<string>;
  };
  Redlock: new (
    clients: unknown[],
    options: Record<string, unknown>,
  ) => {
    lock(
      resource: string,
      ttl: number,
    ): Promise<{
      extend(ttl: number): Promise<{ unlock(): Promise<unknown> }>;
      unlock(): Promise<unknown>;
    }>;
  };
}

async function loadRedlock(): Promise<RedlockModules | undefined> {
  try {
    const ioredis = (await import('ioredis' as string)) as { default: RedlockModules['Redis'] };
    const redlock = (await import('redlock' as string)) as { default: RedlockModules['Redlock'] };
    return { Redis: ioredis.default, Redlock: redlock.default };
  } catch {
    return undefined;
  }
}

interface CapacitySample {
  /** Seconds since the window began. */
  t: number;
  lost: number;
  /** Cores busy since the previous sample: all server processes but the sampler's backend. */
  serverCores: number;
  clientCores: number;
  /** heapUsed (not collected first), MB. */
  heapMB: number;
  /** Least time left on any of the run's leases, s (from the sampler's query). */
  closest: number | null;
}

/** capacity-<leases>.svg: lost leases, CPU, heap and the closest expiry over the window. */
function writeCapacityChart(
  dir: string,
  row: { leases: number; ttl: string; interval: string; series: CapacitySample[] },
): void {
  const chart = `capacity-${row.leases}.svg`;
  const { ttl, interval } = row;
  fs.writeFileSync(
    path.join(dir, chart),
    lineChart({
      title: `${row.leases.toLocaleString('en')} leases kept alive by one client`,
      subtitle: `ttl ${ttl}, renewed every ${interval}; each point the 10 s before it`,
      xLabel: 'seconds since the grants',
      panels: [
        {
          yLabel: 'leases lost',
          lines: [{ series: 'lost', points: row.series.map((p) => ({ x: p.t, y: p.lost })) }],
        },
        {
          yLabel: 'CPU (cores)',
          lines: [
            { series: 'server', points: row.series.map((p) => ({ x: p.t, y: p.serverCores })) },
            { series: 'client', points: row.series.map((p) => ({ x: p.t, y: p.clientCores })) },
          ],
          references: [{ value: 1, label: 'goal: 1 core each' }],
        },
        {
          yLabel: 'client heap (MB)',
          lines: [{ series: 'heapUsed', points: row.series.map((p) => ({ x: p.t, y: p.heapMB })) }],
          references: [{ value: (row.leases * 1000) / 2 ** 20, label: 'goal: 1 kB a lease' }],
        },
        {
          yLabel: 'closest to expiry (s)',
          lines: [
            {
              series: 'least left',
              points: row.series.map((p) => ({ x: p.t, y: p.closest ?? NaN })),
            },
          ],
        },
      ],
    }),
  );
}

async function capacityPhase(cluster: PgCluster, url: string): Promise<void> {
  const sizes = values.leases
    ? values.leases.split(',').map(Number)
    : quick
      ? [10_000]
      : [10_000, 100_000, 1_000_000];
  const ttl = values.ttl ?? '30s';
  const interval = values.interval ?? '10s';
  const runs = sizes.map((leases) => ({ leases }));
  const windowMs = values.window ? Number(values.window) * 1000 : quick ? 25_000 : 45_000;
  md.push(
    `## Capacity: live leases kept alive by one client (ttl ${ttl}, renewed every ${interval}, ${windowMs / 1000} s)`,
    '',
    '| leases | grants took | server CPU (cores, mean) | without the sampler | client CPU (cores) | WAL bytes/s | closest to expiry (s left, min) | lost | renew statements/s | client heap per lease, after the grants | at the end |',
    '|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
  );
  const results: unknown[] = [];
  const gc = (globalThis as { gc?: () => void }).gc;
  for (const run of runs) {
    log(`capacity: ${run.leases} leases`);
    const sampler = new pg.Client({ connectionString: url });
    await sampler.connect();
    sampler.on('error', (error) =>
      log(`capacity: the sampler's connection failed: ${error.message}`),
    );
    const samplerPid = (await sampler.query<{ pid: number }>('SELECT pg_backend_pid() AS pid'))
      .rows[0]!.pid;
    const prefix = `cap-${run.leases}-`;
    let keys: string[] | undefined = Array.from({ length: run.leases }, (_, i) => `${prefix}${i}`);
    let renewStatements = 0;
    const counting = new pg.Pool({
      connectionString: url,
      max: 10,
      Client: class extends pg.Client {
        override query(...args: unknown[]): never {
          const first = args[0] as string | { text?: string };
          const text = typeof first === 'string' ? first : (first.text ?? '');
          if (text.includes('lease.renew')) renewStatements++;
          return (super.query as (...a: unknown[]) => never)(...args);
        }
      },
    });
    counting.on('error', () => undefined);
    // coalesce only batches the releases at the end here (the keep-alive batches by itself).
    const client = new LeaseClient(counting, { coalesce: true });
    gc?.();
    const heapBefore = process.memoryUsage().heapUsed;
    const grantStart = performance.now();
    const leases = (await client.acquireMany(keys, {
      ttl,
      owner: 'capacity',
      keepAlive: { interval },
    })) as (Lease | null)[];
    const grantSeconds = (performance.now() - grantStart) / 1000;
    keys = undefined; // the handles hold their keys; the list is the bench's, not the client's
    gc?.();
    const heapPerLease = (process.memoryUsage().heapUsed - heapBefore) / run.leases;
    if (leases.some((l) => l === null)) throw new Error('capacity: a key was not granted');
    log(
      `capacity: ${run.leases} granted in ${grantSeconds.toFixed(0)} s, ${heapPerLease.toFixed(0)} B of heap each`,
    );
    renewStatements = 0;
    const cpu0 = serverCpuTicks(cluster);
    const samplerCpu0 = processCpuTicks(samplerPid);
    const clientCpu0 = process.cpuUsage();
    const wal0 = await sampler.query<{ lsn: string }>('SELECT pg_current_wal_lsn()::text AS lsn');
    const t0 = performance.now();
    let closest = Infinity;
    const series: CapacitySample[] = [];
    let last = { t: t0, server: cpu0, sampler: samplerCpu0, client: process.cpuUsage() };
    let sinceSample: number | null = null;
    const lostNow = () => {
      let n = 0;
      for (const l of leases) if (l!.lost !== undefined) n++;
      return n;
    };
    while (performance.now() - t0 < windowMs) {
      await sleep(2_000);
      const { rows } = await sampler.query<{ left: number | null }>(
        `SELECT extract(epoch FROM min(expires_at) - clock_timestamp())::float8 AS left
           FROM lease.leases WHERE key LIKE $1 AND owner = 'capacity'`,
        [`${prefix}%`],
      );
      const left = rows[0]?.left ?? null;
      if (left !== null) {
        closest = Math.min(closest, left);
        sinceSample = sinceSample === null ? left : Math.min(sinceSample, left);
      }
      const now = performance.now();
      if (now - last.t >= 10_000 || now - t0 >= windowMs) {
        const server = serverCpuTicks(cluster);
        const samplerTicks = processCpuTicks(samplerPid);
        const clientCpu = process.cpuUsage();
        const seconds = (now - last.t) / 1000;
        series.push({
          t: (now - t0) / 1000,
          lost: lostNow(),
          serverCores:
            server !== undefined && last.server !== undefined
              ? coresOf(server - last.server - ((samplerTicks ?? 0) - (last.sampler ?? 0)), seconds)
              : NaN,
          clientCores:
            (clientCpu.user + clientCpu.system - last.client.user - last.client.system) /
            1e6 /
            seconds,
          heapMB: process.memoryUsage().heapUsed / 2 ** 20,
          closest: sinceSample,
        });
        const at = series[series.length - 1]!;
        log(
          `capacity: ${at.t.toFixed(0)} s: lost ${at.lost}, server ${at.serverCores.toFixed(2)} cores, client ${at.clientCores.toFixed(2)}, heap ${at.heapMB.toFixed(0)} MB, closest ${sinceSample?.toFixed(1) ?? '-'} s left`,
        );
        last = { t: now, server, sampler: samplerTicks, client: clientCpu };
        sinceSample = null;
      }
    }
    const seconds = (performance.now() - t0) / 1000;
    const cpu1 = serverCpuTicks(cluster);
    const samplerCpu1 = processCpuTicks(samplerPid);
    const clientCpu = process.cpuUsage(clientCpu0);
    const wal1 = await sampler.query<{ bytes: string }>(
      'SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1)::text AS bytes',
      [wal0.rows[0]!.lsn],
    );
    const cores = cpu0 !== undefined && cpu1 !== undefined ? coresOf(cpu1 - cpu0, seconds) : NaN;
    const samplerCores =
      samplerCpu0 !== undefined && samplerCpu1 !== undefined
        ? coresOf(samplerCpu1 - samplerCpu0, seconds)
        : NaN;
    const walPerSecond = Number(wal1.rows[0]!.bytes) / seconds;
    const lost = lostNow();
    gc?.();
    const heapPerLeaseAtEnd = (process.memoryUsage().heapUsed - heapBefore) / run.leases;
    const row = {
      leases: run.leases,
      ttl,
      interval,
      windowSeconds: seconds,
      grantSeconds,
      keepAlive: 'one schedule (renew_many)',
      serverCores: cores,
      serverCoresWithoutSampler: cores - samplerCores,
      walBytesPerSecond: walPerSecond,
      closestToExpirySeconds: closest,
      lost,
      renewStatementsPerSecond: renewStatements / seconds,
      clientHeapBytesPerLease: heapPerLease,
      clientHeapBytesPerLeaseAtEnd: heapPerLeaseAtEnd,
      clientCores: (clientCpu.user + clientCpu.system) / 1e6 / seconds,
      series,
    };
    results.push(row);
    const bytes = (b: number) => (b > 0 ? `${b.toFixed(0)} B` : 'n/a');
    md.push(
      `| ${run.leases} | ${grantSeconds.toFixed(0)} s | ${cores.toFixed(3)} | ${row.serverCoresWithoutSampler.toFixed(3)} | ${row.clientCores.toFixed(3)} | ${walPerSecond.toFixed(0)} | ${closest.toFixed(1)} | ${lost} | ${row.renewStatementsPerSecond.toFixed(1)} | ${bytes(heapPerLease)} | ${bytes(heapPerLeaseAtEnd)} |`,
    );
    writeCapacityChart(out, row);
    // The handles release themselves: with coalesce, one release_many per 10000 keys. A lost
    // handle's release answers how it was lost.
    await Promise.all(leases.map((l) => l!.release().catch(() => undefined)));
    await sampler.end();
    await counting.end();
  }
  md.push(
    '',
    `Window ${windowMs / 1000} s after the grants. Server CPU: all server processes (/proc), including the sampler's ` +
      'query every 2 s (min(expires_at) over the run’s keys, a scan of the table), which is also where "closest to expiry" comes from (2 s resolution); ' +
      '"without the sampler" takes its backend’s own CPU out (so do the charts, capacity-<leases>.svg). ' +
      'Client heap: heapUsed growth since before the grants divided by the leases, after a full collection (run with --expose-gc, as `npm run bench:scale` does), once after the grants and once at the end of the window. ' +
      'Goals of issue 34: no lease lost, server CPU ≤ 1 core, client CPU ≤ 1 core, client heap ≤ 1 kB per lease.',
    '',
  );
  summary.capacity = results;
}

// ---------------------------------------------------------------------------------------------

async function main(): Promise<void> {
  const installation = findInstallation(
    values['pg-config']
      ? { pgConfig: values['pg-config'] }
      : values.major
        ? { major: Number(values.major) }
        : {},
  );
  fs.mkdirSync(out, { recursive: true });
  log(`PostgreSQL ${installation.version}; results in ${out}`);
  const cluster = await PgCluster.start({ installation, settings: BENCH_SETTINGS });
  benchCluster = cluster;
  try {
    await cluster.createDatabase(BENCH_DATABASE);
    const url = cluster.url(BENCH_DATABASE);
    const env = await recordEnvironment({
      cluster,
      pgbench: findPgbench(),
      packageRoot: PACKAGE_ROOT,
      command: `npm run bench:scale -- ${process.argv.slice(2).join(' ')}`.trim(),
      candidates: [],
      fsyncTest: false,
    });
    writeEnvironment(out, env);
    md.unshift(
      `# pg_lease at scale (${quick ? 'quick' : 'full'} run)`,
      '',
      `PostgreSQL ${installation.version} (${installation.source}), fsync and synchronous_commit on; ` +
        `node ${process.version}; ${os.cpus().length} cores. Command: \`${env.command}\`. Environment: environment.md.`,
      '',
    );
    // The machine is shared: each phase says how loaded it was when it began.
    const load = () =>
      `Load average (1/5/15 min) at the start: ${os
        .loadavg()
        .map((l) => l.toFixed(1))
        .join(' / ')}.`;
    const phase = async (name: string, run: () => Promise<void>) => {
      if (!phases.has(name)) return;
      const note = load();
      const at = md.length;
      await run();
      md.splice(at + 2, 0, note, '');
    };
    await phase('client', () => clientPhase(url));
    await phase('batch', () => batchPhase(url));
    await phase('peers', () => peersPhase(url));
    await phase('capacity', () => capacityPhase(cluster, url));
  } finally {
    await cluster.destroy();
  }
  if (peerSettings.length)
    fs.appendFileSync(
      path.join(out, 'environment.md'),
      ['', '## Peers’ settings (phase peers)', '', ...peerSettings.map((l) => `- ${l}`), ''].join(
        '\n',
      ),
    );
  fs.writeFileSync(path.join(out, 'summary.md'), md.join('\n') + '\n');
  fs.writeFileSync(path.join(out, 'summary.json'), JSON.stringify(summary, null, 2) + '\n');
  log(`done: ${path.join(out, 'summary.md')}`);
  console.log(md.join('\n'));
}

await main();
