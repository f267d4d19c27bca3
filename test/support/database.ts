/**
 * A private database for one test file, with pg_lease installed.
 *
 * Under `npm test` it is a fresh database in the run's shared cluster (PG_LEASE_TEST_URL);
 * a test file run on its own starts a throwaway cluster instead.
 */
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { PgCluster } from 'pg-lease-testing';

export interface TestDatabase {
  /** Connection string of the database (superuser). */
  url: string;
  /** Connection string for another role of the same cluster. */
  urlAs(user: string): string;
  /** A pool on the database; ended by close(). */
  pool: pg.Pool;
  /** Drops the database (or destroys the private cluster). */
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
  const pool = new pg.Pool({ connectionString: url, max: 20 });
  // close() ends the pool and then drops the database WITH (FORCE); pg-pool resolves end()
  // before every socket has closed, so a connection may still be terminated by the drop. That
  // error is expected and must not surface as an uncaught exception of the test file.
  pool.on('error', () => undefined);
  pool.on('connect', (client) => client.on('error', () => undefined));
  return {
    url,
    urlAs: (user) => {
      const parsed = new URL(url);
      parsed.username = user;
      return parsed.toString();
    },
    pool,
    close: async () => {
      await pool.end();
      if (cluster) {
        await cluster.destroy();
        return;
      }
      const client = new pg.Client({ connectionString: adminUrl });
      await client.connect();
      try {
        await client.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      } finally {
        await client.end();
      }
    },
  };
}

function withPath(url: string, database: string): string {
  const parsed = new URL(url);
  parsed.pathname = `/${database}`;
  return parsed.toString();
}
