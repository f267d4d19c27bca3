/**
 * `npm run bench:fence-wait`: how long the holder's renew waits behind an open fenced
 * transaction, the cost that `lease.fence` documents (SEMANTICS.md §5).
 *
 * For each fenced-transaction length L, on a durable throwaway cluster: session A runs
 * `BEGIN; SELECT lease.fence(key, epoch)`, then stays open for L (client-side sleep, like
 * application work), then `COMMIT`. Session B sends the holder's `lease.renew` as soon as A's
 * fence has returned. The renew's latency, measured by B's client from send to answer, is the
 * wait plus the renew's own cost; the baseline is the same renew with no fenced transaction
 * open, measured in the same run. Reported per L: median and p95 of the renew's latency and of
 * its excess over L (which is the commit of A plus the renew itself).
 *
 * Usage: node dist/bench/fence-wait.js [--major N | --pg-config PATH] [--lengths 0,10,50,...]
 *        [--repeat N]
 */
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { PgCluster, findInstallation, type InstallationRequest } from 'pg-lease-testing';
import { percentile } from './stats.js';

const SETTINGS = {
  fsync: 'on',
  synchronous_commit: 'on',
  full_page_writes: 'on',
  shared_buffers: '128MB',
  jit: 'off',
};

function parse(): { installation: InstallationRequest; lengths: number[]; repeat: number } {
  const { values } = parseArgs({
    options: {
      major: { type: 'string' },
      'pg-config': { type: 'string' },
      lengths: { type: 'string', default: '0,1,10,50,100,500' },
      repeat: { type: 'string', default: '20' },
    },
    strict: true,
  });
  const installation: InstallationRequest = {};
  if (values['pg-config']) installation.pgConfig = values['pg-config'];
  if (values.major) installation.major = Number(values.major);
  return {
    installation,
    lengths: values.lengths!.split(',').map(Number),
    repeat: Number(values.repeat),
  };
}

async function main(): Promise<void> {
  const options = parse();
  const installation = findInstallation(options.installation);
  const cluster = await PgCluster.start({ installation, settings: SETTINGS });
  const url = await cluster.createDatabase('fence_wait');
  const fencer = new pg.Client({ connectionString: url });
  const holder = new pg.Client({ connectionString: url });
  await fencer.connect();
  await holder.connect();
  try {
    const { rows } = await holder.query<{ epoch: string }>(
      "SELECT epoch::text FROM lease.acquire('fence-wait', 'holder', interval '1 hour')",
    );
    const epoch = rows[0]!.epoch;
    const renew = async (): Promise<number> => {
      const sent = performance.now();
      const result = await holder.query<{ status: string }>(
        "SELECT status FROM lease.renew('fence-wait', 'holder', $1, interval '1 hour')",
        [epoch],
      );
      if (result.rows[0]!.status !== 'ok') throw new Error(`renew: ${result.rows[0]!.status}`);
      return performance.now() - sent;
    };
    for (let i = 0; i < 5; i++) await renew(); // warm caches and plans

    process.stdout.write(
      `PostgreSQL ${cluster.installation.version}, fsync on, ${options.repeat} samples per length\n\n` +
        '| fenced transaction open for | renew latency p50 | p95 | excess over the length p50 | p95 |\n' +
        '|---:|---:|---:|---:|---:|\n',
    );
    const baseline: number[] = [];
    for (let i = 0; i < options.repeat; i++) baseline.push(await renew());
    row('no fenced transaction', baseline, 0);
    for (const length of options.lengths) {
      const latencies: number[] = [];
      for (let i = 0; i < options.repeat; i++) {
        await fencer.query('BEGIN');
        await fencer.query("SELECT lease.fence('fence-wait', $1)", [epoch]);
        const opened = performance.now();
        const renewal = renew();
        await sleep(Math.max(0, length - (performance.now() - opened)));
        await fencer.query('COMMIT');
        latencies.push(await renewal);
      }
      row(`${length} ms`, latencies, length);
    }
  } finally {
    await fencer.end();
    await holder.end();
    await cluster.destroy();
  }
}

function row(label: string, latencies: number[], length: number): void {
  const sorted = [...latencies].sort((a, b) => a - b);
  const excess = sorted.map((l) => l - length);
  const ms = (v: number) => `${v.toFixed(2)} ms`;
  process.stdout.write(
    `| ${label} | ${ms(percentile(sorted, 50))} | ${ms(percentile(sorted, 95))} | ` +
      `${ms(percentile(excess, 50))} | ${ms(percentile(excess, 95))} |\n`,
  );
}

main().catch((error: unknown) => {
  process.stderr.write(`fence-wait: ${error instanceof Error ? error.stack : String(error)}\n`);
  process.exit(1);
});
