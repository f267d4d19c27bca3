/**
 * A private database for one test file, with pg_lease installed.
 *
 * Under `npm test` it is a fresh database in the run's shared cluster (PG_LEASE_TEST_URL);
 * a test file run on its own starts a throwaway cluster instead.
 */
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { PgCluster } from 'pg-lease-testing';

export interface TestDatabase {
  /** Connection string of the database (superuser). */
  url: string;
  /** Connection string for another role of the same cluster. */
  urlAs(user: string): string;
  /** A pool on the database; ended by close(). */
  pool: pg.Pool;
  /** Another pool on the database (`max` 4 unless `config` says), also ended by close(). */
  newPool(config?: Omit<pg.PoolConfig, 'connectionString'>): pg.Pool;
  /**
   * Drops the database (or destroys the private cluster). Call it once every connection the
   * test made to the database has been ended: the drop first waits for their backends to exit.
   */
  close(): Promise<void>;
}

/**
 * `options.in`: a cluster of the caller's (which it destroys itself) instead of the run's shared
 * one or a throwaway one.
 */
export async function createTestDatabase(
  options: { extension?: boolean; in?: PgCluster } = {},
): Promise<TestDatabase> {
  const shared = process.env.PG_LEASE_TEST_URL;
  let cluster: PgCluster | undefined;
  let adminUrl: string;
  if (options.in) {
    adminUrl = options.in.url();
  } else if (shared) {
    adminUrl = shared;
  } else {
    cluster = await PgCluster.start();
    adminUrl = cluster.url();
  }
  const name = `t_${randomBytes(6).toString('hex')}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  try {
    await admin.query(`CREATE DATABASE ${name}`);
  } finally {
    await admin.end();
  }
  const url = withPath(adminUrl, name);
  if (options.extension ?? true) {
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    try {
      await client.query('CREATE EXTENSION pg_lease');
    } finally {
      await client.end();
    }
  }
  const pools: pg.Pool[] = [];
  const newPool = (config: Omit<pg.PoolConfig, 'connectionString'> = {}): pg.Pool => {
    const pool = new pg.Pool({ max: 4, ...config, connectionString: url });
    // Only a connection the test left open is terminated by close(); see dropDatabase.
    pool.on('error', () => undefined);
    pool.on('connect', (client) => client.on('error', () => undefined));
    pools.push(pool);
    return pool;
  };
  const pool = newPool({ max: 20 });
  return {
    url,
    urlAs: (user) => {
      const parsed = new URL(url);
      parsed.username = user;
      return parsed.toString();
    },
    pool,
    newPool,
    close: async () => {
      await Promise.all(pools.map((each) => each.end()));
      if (cluster) {
        await cluster.destroy();
        return;
      }
      await dropDatabase(adminUrl, name);
    },
  };
}

/** How long close() waits for the backends of ended connections to exit before forcing. */
const BACKENDS_EXIT_MS = 10_000;
const BACKENDS_POLL_MS = 10;

/**
 * Drops the database once its client backends have exited, WITH (FORCE) only for those still
 * there after {@link BACKENDS_EXIT_MS}: connections the test left open.
 *
 * Forcing at once races with connections the test did end. pg-pool's `end()` resolves as soon
 * as it has asked each connection to end (Terminate sent, socket half-closed), before any
 * backend has read that Terminate; on a loaded machine a backend is still there milliseconds
 * later, and the drop's SIGTERM makes it send FATAL 57P01 ("terminating connection due to
 * administrator command") to its ending client. The client emits that as 'error', the idle
 * listener pg-pool leaves on a removed client re-emits it on the pool, and a pool of the test's
 * own without an 'error' listener (its LeaseClient removes its listener at end()) turns it
 * into an uncaught exception that fails whichever test is running.
 */
async function dropDatabase(adminUrl: string, name: string): Promise<void> {
  const client = new pg.Client({
    connectionString: adminUrl,
    application_name: 'pg_lease_test:drop',
  });
  await client.connect();
  try {
    const deadline = Date.now() + BACKENDS_EXIT_MS;
    for (;;) {
      const { rows } = await client.query<{ pids: number[] }>(
        `SELECT coalesce(array_agg(pid), '{}') AS pids FROM pg_stat_activity
          WHERE datname = $1 AND backend_type = 'client backend'`,
        [name],
      );
      if (rows[0]!.pids.length === 0) break;
      if (Date.now() > deadline) {
        console.error(
          `pg_lease test: connections to ${name} left open (backends ${rows[0]!.pids.join(', ')}); ` +
            'the drop terminates them',
        );
        break;
      }
      await sleep(BACKENDS_POLL_MS);
    }
    await client.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
  } finally {
    await client.end();
  }
}

function withPath(url: string, database: string): string {
  const parsed = new URL(url);
  parsed.pathname = `/${database}`;
  return parsed.toString();
}
