/**
 * The PgBouncer suite's setup: a private cluster with one leases database, PgBouncer in
 * transaction mode in front of it with a pool far smaller than the number of clients, and a
 * direct admin connection that sees what the server itself holds.
 *
 * Without pgbouncer installed the suite is skipped with a loud message, except under
 * `CI=true`, where .ci/run installs it and its absence fails the run.
 */
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { PgCluster, findPgBouncer, startPgBouncer, type PgBouncer } from 'pg-lease-testing';

export const DATABASE = 'leases';
/** Server connections PgBouncer may open for the leases database. */
export const POOL_SIZE = 4;

/** `false` when pgbouncer is installed, else the reason to skip (throws under CI=true). */
export function skipWithoutPgBouncer(): string | false {
  if (findPgBouncer()) return false;
  const reason =
    'pgbouncer is not installed (apt-get install pgbouncer, or set PG_LEASE_PGBOUNCER)';
  if (process.env.CI === 'true' || process.env.PG_LEASE_NO_SKIP === '1')
    throw new Error(
      `${reason}, and CI=true or PG_LEASE_NO_SKIP=1 forbids skipping: .ci/run installs it`,
    );
  const banner = '!'.repeat(78);
  console.log(`${banner}\n!!! SKIPPING the PgBouncer suite: ${reason}\n${banner}`);
  return reason;
}

export interface Bounced {
  cluster: PgCluster;
  bouncer: PgBouncer;
  /** The leases database through PgBouncer. */
  url: string;
  /** The leases database directly (for checks of what the server holds). */
  directUrl: string;
  /** A direct connection to the cluster's `postgres` database. */
  admin: pg.Pool;
  close(): Promise<void>;
}

export async function startBounced(
  poolMode: 'session' | 'transaction' | 'statement' = 'transaction',
  poolSize = POOL_SIZE,
): Promise<Bounced> {
  const cluster = await PgCluster.start();
  try {
    const directUrl = await cluster.createDatabase(DATABASE);
    const bouncer = await startPgBouncer(cluster, { poolMode, poolSize });
    const admin = new pg.Pool({ connectionString: cluster.url(), max: 2 });
    admin.on('error', () => undefined);
    return {
      cluster,
      bouncer,
      url: bouncer.url(DATABASE),
      directUrl,
      admin,
      close: async () => {
        await admin.end();
        await bouncer.stop();
        await cluster.destroy();
      },
    };
  } catch (error) {
    await cluster.destroy();
    throw error;
  }
}

/**
 * A node-postgres pool through PgBouncer whose broken connections never throw. Idle
 * connections stay open (no idle timeout), so that whatever a call leaves on its server
 * connection stays there for the checks to find, instead of being cleaned up when the
 * client disconnects.
 */
export function bouncedPool(url: string, max: number): pg.Pool {
  const pool = new pg.Pool({ connectionString: url, max, idleTimeoutMillis: 0 });
  pool.on('error', () => undefined);
  pool.on('connect', (client) => client.on('error', () => undefined));
  return pool;
}

/** Backends the server has for the leases database: every one of them is PgBouncer's. */
export async function serverBackends(admin: pg.Pool): Promise<number> {
  const { rows } = await admin.query<{ n: number }>(
    `SELECT count(*)::int AS n FROM pg_stat_activity
      WHERE datname = $1 AND backend_type = 'client backend'`,
    [DATABASE],
  );
  return rows[0]!.n;
}

/**
 * Samples, while `work` runs, how many server backends the leases database has and how many
 * clients PgBouncer serves, and returns the maxima with work's result.
 */
export async function sampled<T>(
  bounced: Bounced,
  work: Promise<T>,
): Promise<{ result: T; maxServer: number; maxClients: number }> {
  let done = false;
  let maxServer = 0;
  let maxClients = 0;
  const sampler = (async () => {
    while (!done) {
      maxServer = Math.max(maxServer, await serverBackends(bounced.admin));
      // PgBouncer makes a database's pool on its first client.
      const pool = (await bounced.bouncer.admin('SHOW POOLS')).find((r) => r.database === DATABASE);
      if (pool) maxClients = Math.max(maxClients, Number(pool.cl_active) + Number(pool.cl_waiting));
      await sleep(50);
    }
  })();
  try {
    return { result: await work, maxServer, maxClients };
  } finally {
    done = true;
    await sampler;
  }
}

/**
 * Waits until no server backend of the leases database is in a transaction, runs a
 * statement, or holds or waits for any lock; fails with what is left after `timeoutMs`.
 */
export async function assertNothingLeftOnServer(admin: pg.Pool, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const { rows } = await admin.query(
      `SELECT a.pid, a.state, a.xact_start IS NOT NULL AS in_transaction, a.query,
              (SELECT count(*)::int FROM pg_locks l WHERE l.pid = a.pid) AS locks
         FROM pg_stat_activity a
        WHERE a.datname = $1 AND a.backend_type = 'client backend'
          AND (a.state <> 'idle' OR a.xact_start IS NOT NULL
               OR EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid))`,
      [DATABASE],
    );
    if (rows.length === 0) return;
    if (Date.now() > deadline)
      assert.fail(`server backends left behind: ${JSON.stringify(rows, null, 1)}`);
    await sleep(50);
  }
}

/**
 * Waits until `n` server backends run a blocking lease.acquire, each for at least 100 ms (so
 * that a quick acquire that is just finishing is not taken for a wait).
 */
export async function waitForServerWaiters(admin: pg.Pool, n: number): Promise<number[]> {
  const deadline = Date.now() + 20_000;
  for (;;) {
    const { rows } = await admin.query<{ pid: number }>(
      `SELECT pid FROM pg_stat_activity
        WHERE datname = $1 AND state = 'active' AND query LIKE '%lease.acquire%'
          AND clock_timestamp() - query_start > interval '100 milliseconds'`,
      [DATABASE],
    );
    if (rows.length >= n) return rows.map((r) => r.pid);
    if (Date.now() > deadline) assert.fail(`only ${rows.length} of ${n} waits reached the server`);
    await sleep(25);
  }
}
