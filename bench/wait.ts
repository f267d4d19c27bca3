/**
 * The wait phase of `npm run bench`: how soon a waiter gets a key, client wait (no transaction,
 * woken by notification) against the SQL wait (lease.acquire with wait, polling) of this build
 * and of 0.1.0, on the bench cluster.
 *
 * - wake after release: a waiter sleeps on a held key; the holder releases at a random moment;
 *   latency from the release call's return to the waiter's grant, both seen by this process's
 *   monotonic clock (release commit, notification and one attempt).
 * - takeover after lapse: the holder (ttl 300 ms) never renews; latency from its expiry to the
 *   waiter's grant, both by the server's clock (grant time = expires_at - ttl).
 * - 100 waiters on one key, spread over 4 clients (each with its own pool and listening
 *   connection): the holder renews once and releases; exactly one waiter may win each release
 *   (epochs advance by 2 per round); the holder's renew latency during the herd beside its
 *   latency with nobody waiting; wake latency as above.
 */
import * as os from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { performance } from 'node:perf_hooks';
import pg from 'pg';
import { LeaseClient, type Lease } from '../src/index.js';
import type { PgCluster } from 'pg-lease-testing';
import { BENCH_DATABASE, loadCandidate } from './setup.js';
import { percentile } from './stats.js';

/** Percentiles of one measurement, in milliseconds. */
export interface WaitFigure {
  n: number;
  p50Ms: number;
  p99Ms: number;
  maxMs: number;
}

export interface WaitResults {
  rounds: number;
  /** One acquire of a free key by the same client: the floor under every wake figure. */
  acquireFloor: WaitFigure;
  /** Load average when the phase started (the machine is shared). */
  loadAverage: number[];
  clientWake: WaitFigure;
  clientTakeover: WaitFigure;
  sqlWake: WaitFigure;
  sqlTakeover: WaitFigure;
  v010Wake: WaitFigure | undefined;
  v010Takeover: WaitFigure | undefined;
  herd: {
    waiters: number;
    clients: number;
    releases: number;
    /** Grants per release: must be exactly 1 each. */
    extraGrants: number;
    wake: WaitFigure;
    renewIdle: WaitFigure;
    renewHerd: WaitFigure;
  };
}

/** Targets of the issue, for the summary. */
export const WAIT_TARGETS = {
  wakeP50Ms: 2,
  wakeP99Ms: 5,
  takeoverP99Ms: 5,
  herdWakeP99Ms: 10,
};

const V010_SCHEMA = 'lease_v010';

function figure(samples: number[]): WaitFigure {
  const sorted = [...samples].sort((a, b) => a - b);
  return {
    n: sorted.length,
    p50Ms: percentile(sorted, 50),
    p99Ms: percentile(sorted, 99),
    maxMs: sorted.at(-1) ?? Number.NaN,
  };
}

export async function waitBench(
  cluster: PgCluster,
  options: { rounds: number; v010Script: string | undefined; log: (line: string) => void },
): Promise<WaitResults> {
  const url = cluster.url(BENCH_DATABASE);
  const { rounds, log } = options;
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  if (options.v010Script) {
    await admin.query(`DROP SCHEMA IF EXISTS ${V010_SCHEMA} CASCADE`);
    await loadCandidate(admin, V010_SCHEMA, options.v010Script);
  }
  const pools: pg.Pool[] = [];
  const makeClient = (max = 4) => {
    const pool = new pg.Pool({ connectionString: url, max });
    pool.on('error', () => undefined);
    pools.push(pool);
    return new LeaseClient(pool);
  };
  try {
    await ensureExpiryTable(admin);
    const holder = makeClient();
    const waiter = makeClient();

    const loadAverage = os.loadavg();
    // The floor: one attempt that grants (its commit included).
    const floor: number[] = [];
    for (let i = 0; i < rounds; i++) {
      const t = performance.now();
      const lease = (await waiter.acquire(`wait-floor-${i}`, { ttl: '1 min' }))!;
      floor.push(performance.now() - t);
      await lease.release();
    }
    log(`wait: one acquire of a free key ${describe(figure(floor))}`);

    // Client wait: wake after release.
    const clientWake: number[] = [];
    for (let i = 0; i < rounds; i++) {
      const key = `wait-wake-${i}`;
      const held = (await holder.acquire(key, { ttl: '1 min' }))!;
      const waiting = waiter.acquire(key, { ttl: '1 min', wait: '30s' });
      await sleep(30 + Math.random() * 70);
      await held.release();
      const releasedAt = performance.now();
      const lease = (await waiting)!;
      clientWake.push(performance.now() - releasedAt);
      await lease.release();
    }
    log(`wait: client wake after release ${describe(figure(clientWake))}`);

    // Client wait: takeover after lapse.
    const clientTakeover: number[] = [];
    for (let i = 0; i < rounds; i++) {
      const key = `wait-lapse-${i}`;
      await holder.acquire(key, { ttl: '300ms' });
      await admin.query(
        `INSERT INTO pg_temp.bench_expiry SELECT $1, i.expires_at FROM lease.inspect($1) AS i
         ON CONFLICT (key) DO UPDATE SET expired_at = excluded.expired_at`,
        [key],
      );
      const lease = (await waiter.acquire(key, { ttl: '1 min', wait: '30s' }))!;
      clientTakeover.push(await pastExpiryMs(admin, 'lease', key, lease.epoch, '1 min'));
      await lease.release();
    }
    log(`wait: client takeover after lapse ${describe(figure(clientTakeover))}`);

    // The SQL wait, of this build and of 0.1.0.
    const sqlWake = await sqlWakeRounds(url, 'lease', rounds);
    const sqlTakeover = await sqlTakeoverRounds(url, admin, 'lease', rounds);
    log(`wait: SQL wake ${describe(sqlWake)}; takeover ${describe(sqlTakeover)}`);
    let v010Wake;
    let v010Takeover;
    if (options.v010Script) {
      v010Wake = await sqlWakeRounds(url, V010_SCHEMA, rounds);
      v010Takeover = await sqlTakeoverRounds(url, admin, V010_SCHEMA, rounds);
      log(`wait: 0.1.0 SQL wake ${describe(v010Wake)}; takeover ${describe(v010Takeover)}`);
    }

    const herd = await herdRounds(makeClient, Math.max(20, Math.round(rounds / 2)));
    log(
      `wait: ${herd.waiters} waiters: wake ${describe(herd.wake)}, extra grants ${herd.extraGrants}, ` +
        `holder renew idle ${describe(herd.renewIdle)} / with waiters ${describe(herd.renewHerd)}`,
    );
    return {
      rounds,
      acquireFloor: figure(floor),
      loadAverage,
      clientWake: figure(clientWake),
      clientTakeover: figure(clientTakeover),
      sqlWake,
      sqlTakeover,
      v010Wake,
      v010Takeover,
      herd,
    };
  } finally {
    await Promise.all(pools.map((pool) => pool.end()));
    await admin.end();
  }
}

function describe(f: WaitFigure): string {
  return `p50 ${f.p50Ms.toFixed(2)} ms, p99 ${f.p99Ms.toFixed(2)} ms (n ${f.n})`;
}

/** Server time of the grant (expires_at - ttl) minus the previous grant's expiry, in ms. */
async function pastExpiryMs(
  admin: pg.Client,
  schema: string,
  key: string,
  epoch: bigint,
  ttl: string,
): Promise<number> {
  // The holder's expiry was written down in pg_temp.bench_expiry when it was granted.
  const { rows } = await admin.query<{ past_us: string }>(
    `SELECT ((extract(epoch FROM (l.expires_at - $3::interval)) - extract(epoch FROM e.expired_at)) * 1000000)::bigint AS past_us
       FROM ${schema}.leases AS l, pg_temp.bench_expiry AS e
      WHERE l.key = $1 AND e.key = $1 AND l.epoch = $2`,
    [key, epoch.toString(), ttl],
  );
  return Number(rows[0]!.past_us) / 1000;
}

async function sqlWakeRounds(url: string, schema: string, rounds: number): Promise<WaitFigure> {
  const holder = new pg.Client({ connectionString: url });
  const waiter = new pg.Client({ connectionString: url });
  await holder.connect();
  await waiter.connect();
  waiter.on('notice', () => undefined);
  const samples: number[] = [];
  try {
    for (let i = 0; i < rounds; i++) {
      const key = `sqlwait-wake-${schema}-${i}`;
      const { rows } = await holder.query<{ epoch: string }>(
        `SELECT a.epoch FROM ${schema}.acquire($1, 'holder', interval '1 min') AS a`,
        [key],
      );
      const waiting = waiter.query(
        `SELECT * FROM ${schema}.acquire($1, 'waiter', interval '1 min', interval '30 seconds')`,
        [key],
      );
      await sleep(30 + Math.random() * 70);
      await holder.query(`SELECT * FROM ${schema}.release($1, 'holder', $2)`, [
        key,
        rows[0]!.epoch,
      ]);
      const releasedAt = performance.now();
      await waiting;
      samples.push(performance.now() - releasedAt);
    }
  } finally {
    await holder.end();
    await waiter.end();
  }
  return figure(samples);
}

async function sqlTakeoverRounds(
  url: string,
  admin: pg.Client,
  schema: string,
  rounds: number,
): Promise<WaitFigure> {
  const waiter = new pg.Client({ connectionString: url });
  await waiter.connect();
  waiter.on('notice', () => undefined);
  const samples: number[] = [];
  try {
    for (let i = 0; i < rounds; i++) {
      const key = `sqlwait-lapse-${schema}-${i}`;
      await admin.query(
        `INSERT INTO pg_temp.bench_expiry
         SELECT $1, a.expires_at FROM ${schema}.acquire($1, 'holder', interval '300 ms') AS a
         ON CONFLICT (key) DO UPDATE SET expired_at = excluded.expired_at`,
        [key],
      );
      const { rows } = await waiter.query<{ epoch: string }>(
        `SELECT a.epoch FROM ${schema}.acquire($1, 'waiter', interval '1 min', interval '30 seconds') AS a`,
        [key],
      );
      samples.push(await pastExpiryMs(admin, schema, key, BigInt(rows[0]!.epoch), '1 min'));
    }
  } finally {
    await waiter.end();
  }
  return figure(samples);
}

async function ensureExpiryTable(admin: pg.Client): Promise<void> {
  await admin.query(
    'CREATE TEMP TABLE IF NOT EXISTS bench_expiry (key text PRIMARY KEY, expired_at timestamptz)',
  );
}

async function herdRounds(
  makeClient: (max?: number) => LeaseClient,
  releases: number,
): Promise<WaitResults['herd']> {
  const WAITERS = 100;
  const CLIENTS = 4;
  const key = `wait-herd-${Date.now()}`;
  const clients = Array.from({ length: CLIENTS }, () => makeClient(8));
  const holderClient = makeClient();

  // The holder's renew latency with nobody waiting, as the baseline.
  const renewIdle: number[] = [];
  const solo = (await holderClient.acquire(key, { ttl: '1 min' }))!;
  for (let i = 0; i < releases; i++) {
    const t = performance.now();
    await solo.renew();
    renewIdle.push(performance.now() - t);
    await sleep(5);
  }
  const firstEpoch = solo.epoch;

  const wake: number[] = [];
  const renewHerd: number[] = [];
  let releasedAt = 0;
  let done = 0;
  let stop = false;
  const stopped = new AbortController();
  let current: Lease | undefined = solo;
  const granted: bigint[] = [];
  const waiters = Array.from({ length: WAITERS }, async (_, n) => {
    const client = clients[n % CLIENTS]!;
    while (!stop) {
      let lease;
      try {
        lease = await client.acquire(key, { ttl: '1 min', wait: '60s', signal: stopped.signal });
      } catch {
        continue;
      }
      if (!lease) continue;
      if (releasedAt) wake.push(performance.now() - releasedAt);
      granted.push(lease.epoch);
      current = lease;
      if (stop) {
        await lease.release();
        return;
      }
      await sleep(20);
      const t = performance.now();
      await lease.renew();
      renewHerd.push(performance.now() - t);
      done++;
      if (done >= releases) {
        stop = true;
        stopped.abort();
      }
      releasedAt = 0;
      await lease.release();
      releasedAt = performance.now();
    }
  });
  // Let every waiter start waiting, then let the first holder go.
  await sleep(1_000);
  releasedAt = 0;
  await solo.release();
  releasedAt = performance.now();
  await Promise.race([Promise.all(waiters), sleep(120_000)]);
  stop = true;
  stopped.abort();
  if (current) await current.release().catch(() => undefined);
  // Every grant's epoch is the previous release's + 1: epochs advance by exactly 2 a round.
  const sorted = [...granted].sort((a, b) => (a < b ? -1 : 1));
  let extra = 0;
  for (let i = 0; i < sorted.length; i++)
    if (sorted[i] !== firstEpoch + 2n * BigInt(i + 1)) extra++;
  return {
    waiters: WAITERS,
    clients: CLIENTS,
    releases: granted.length,
    extraGrants: extra,
    wake: figure(wake),
    renewIdle: figure(renewIdle),
    renewHerd: figure(renewHerd),
  };
}

/** The wait section of summary.md. */
export function waitMarkdown(results: WaitResults, command: string): string {
  const row = (name: string, f: WaitFigure | undefined, target: string) =>
    f
      ? `| ${name} | ${f.n} | ${f.p50Ms.toFixed(2)} | ${f.p99Ms.toFixed(2)} | ${f.maxMs.toFixed(2)} | ${target} |`
      : `| ${name} | | | | | ${target} |`;
  const t = WAIT_TARGETS;
  const h = results.herd;
  return [
    '## Waiting (wait phase)',
    '',
    `Command: \`${command}\`. Milliseconds. Wake: from the release call's return to the waiter's grant (this process's monotonic clock); takeover: from the holder's expiry to the waiter's grant (server clock). Load average at the start: ${results.loadAverage.map((l) => l.toFixed(1)).join(', ')}.`,
    '',
    '| measure | n | p50 | p99 | max | target |',
    '|---|---:|---:|---:|---:|---|',
    row('one acquire of a free key (floor under every wake)', results.acquireFloor, ''),
    row(
      'client wait: wake after release',
      results.clientWake,
      `p50 <= ${t.wakeP50Ms}, p99 <= ${t.wakeP99Ms}`,
    ),
    row('client wait: takeover after lapse', results.clientTakeover, `p99 <= ${t.takeoverP99Ms}`),
    row(
      `${h.waiters} waiters (${h.clients} clients): wake after release`,
      h.wake,
      `p99 <= ${t.herdWakeP99Ms}`,
    ),
    row('holder renew, nobody waiting', h.renewIdle, ''),
    row(`holder renew, ${h.waiters} waiting`, h.renewHerd, 'not starved'),
    row('SQL wait (this build): wake after release', results.sqlWake, ''),
    row('SQL wait (this build): takeover after lapse', results.sqlTakeover, ''),
    row('SQL wait (0.1.0): wake after release', results.v010Wake, ''),
    row('SQL wait (0.1.0): takeover after lapse', results.v010Takeover, ''),
    '',
    `${h.releases} releases with ${h.waiters} waiting: ${h.extraGrants === 0 ? 'exactly one grant per release' : `${h.extraGrants} grants out of sequence`}.`,
    '',
  ].join('\n');
}
