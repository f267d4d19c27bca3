/**
 * Purge at scale: `npm run bench:purge -- [--rows N] [--batch N] [--major N]`. See bench/README.md.
 *
 * Fills a throwaway cluster (durable settings, as the main bench) with N dead keys (free, released
 * eight days ago) beside 64 live ones, then runs `lease.purge('7 days')` in one call, and again
 * with the same fill in batches (`lease.purge('7 days', batch)` until a call deletes fewer).
 * Meanwhile four clients renew the live keys in a loop. Prints for each run: the purge's time,
 * the WAL it wrote, and the renew latencies measured before and during the purge (p50, p99, max),
 * which show whether calls on live keys waited for it. Timings are of this machine; the ratios
 * between the before and during columns are the point.
 */
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { PgCluster } from 'pg-lease-testing';

const LIVE_KEYS = 64;
const RENEWERS = 4;

interface Run {
  label: string;
  purgeMs: number;
  purged: number;
  walBytes: number;
  before: number[];
  during: number[];
}

function quantile(sorted: number[], q: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!;
}

/** Fills the table; returns the epoch of each live key (the floor moves with every purge). */
async function fill(admin: pg.Client, rows: number): Promise<string[]> {
  await admin.query('TRUNCATE lease.leases');
  await admin.query(
    `INSERT INTO lease.leases (key, owner, epoch, expires_at, released_at)
     SELECT 'job-' || g, NULL, 2, NULL, clock_timestamp() - interval '8 days'
       FROM generate_series(1, $1) AS g`,
    [rows],
  );
  const epochs: string[] = [];
  for (let i = 0; i < LIVE_KEYS; i++) {
    const { rows: granted } = await admin.query(
      `SELECT epoch::text AS epoch FROM lease.acquire($1, 'live', interval '1 hour')`,
      [`live-${i}`],
    );
    epochs.push(granted[0].epoch as string);
  }
  await admin.query('VACUUM ANALYZE lease.leases');
  await admin.query('CHECKPOINT');
  return epochs;
}

async function runOnce(
  url: string,
  admin: pg.Client,
  label: string,
  epochs: string[],
  purgeCall: (client: pg.Client) => Promise<number>,
): Promise<Run> {
  const clients = await Promise.all(
    Array.from({ length: RENEWERS }, async () => {
      const client = new pg.Client({ connectionString: url });
      await client.connect();
      return client;
    }),
  );
  let phase: 'before' | 'during' | 'done' = 'before';
  const latencies = { before: [] as number[], during: [] as number[] };
  const renewers = clients.map(async (client, r) => {
    for (let i = 0; phase !== 'done'; i++) {
      const n = (r * LIVE_KEYS) / RENEWERS + (i % (LIVE_KEYS / RENEWERS));
      const key = `live-${n}`;
      const at = phase;
      const start = performance.now();
      const { rows } = await client.query(
        `SELECT status FROM lease.renew($1, 'live', $2::bigint, interval '1 hour')`,
        [key, epochs[n]],
      );
      if (rows[0].status !== 'ok') throw new Error(`renew of ${key}: ${rows[0].status}`);
      if ((phase as string) === at) latencies[at].push(performance.now() - start);
    }
  });
  await new Promise((resolve) => setTimeout(resolve, 2_000));
  const purger = new pg.Client({ connectionString: url });
  await purger.connect();
  const lsn = (await admin.query('SELECT pg_current_wal_lsn() AS lsn')).rows[0].lsn as string;
  phase = 'during';
  const start = performance.now();
  const purged = await purgeCall(purger);
  const purgeMs = performance.now() - start;
  phase = 'done';
  await Promise.all(renewers);
  const wal = await admin.query('SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1)::float8 AS b', [
    lsn,
  ]);
  await Promise.all([...clients, purger].map((client) => client.end()));
  return {
    label,
    purgeMs,
    purged,
    walBytes: wal.rows[0].b as number,
    before: latencies.before.sort((a, b) => a - b),
    during: latencies.during.sort((a, b) => a - b),
  };
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      rows: { type: 'string', default: '1000000' },
      batch: { type: 'string', default: '10000' },
      major: { type: 'string' },
    },
  });
  const rows = Number(values.rows);
  const batch = Number(values.batch);
  const cluster = await PgCluster.start({
    ...(values.major ? { installation: { major: Number(values.major) } } : {}),
    settings: {
      fsync: 'on',
      synchronous_commit: 'on',
      full_page_writes: 'on',
      shared_buffers: '128MB',
      autovacuum: 'off',
      max_wal_size: '4GB',
      checkpoint_timeout: '30min',
      jit: 'off',
    },
  });
  try {
    const url = await cluster.createDatabase('purge_bench');
    const admin = new pg.Client({ connectionString: url });
    await admin.connect();
    const runs: Run[] = [];
    let epochs = await fill(admin, rows);
    runs.push(
      await runOnce(url, admin, 'one call', epochs, async (client) =>
        Number((await client.query(`SELECT lease.purge('7 days') AS n`)).rows[0].n),
      ),
    );
    epochs = await fill(admin, rows);
    runs.push(
      await runOnce(url, admin, `batches of ${batch}`, epochs, async (client) => {
        let total = 0;
        for (;;) {
          const n = Number(
            (await client.query(`SELECT lease.purge('7 days', $1) AS n`, [batch])).rows[0].n,
          );
          total += n;
          if (n < batch) return total;
        }
      }),
    );
    await admin.end();
    const version = cluster.installation.version;
    console.log(
      `purge of ${rows} dead keys beside ${LIVE_KEYS} live ones, PostgreSQL ${version}, ` +
        `fsync on; ${RENEWERS} clients renewing live keys meanwhile (latency in ms)\n`,
    );
    console.log(
      '| purge | deleted | time | WAL | renew p50 before / during | p99 before / during | max before / during | renews during |',
    );
    console.log('|---|---:|---:|---:|---:|---:|---:|---:|');
    const f = (n: number) => n.toFixed(2);
    for (const run of runs)
      console.log(
        `| ${run.label} | ${run.purged} | ${(run.purgeMs / 1000).toFixed(1)} s | ` +
          `${(run.walBytes / 2 ** 20).toFixed(0)} MiB | ` +
          `${f(quantile(run.before, 0.5))} / ${f(quantile(run.during, 0.5))} | ` +
          `${f(quantile(run.before, 0.99))} / ${f(quantile(run.during, 0.99))} | ` +
          `${f(run.before.at(-1) ?? NaN)} / ${f(run.during.at(-1) ?? NaN)} | ${run.during.length} |`,
      );
  } finally {
    await cluster.destroy();
  }
}

await main();
