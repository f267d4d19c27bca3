/**
 * Throwaway login roles for privilege tests. Roles belong to the whole cluster, so each gets a
 * unique name and is dropped (with whatever it owns in the test database) when the test ends.
 */
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import type { TestDatabase } from './database.js';

export interface TestRole {
  name: string;
  /** A new connection to the test database as this role; ended by drop(). */
  connect(): Promise<pg.Client>;
  /** Ends its connections, drops what it owns in the test database, then drops the role. */
  drop(): Promise<void>;
}

/**
 * Creates a LOGIN role with no privileges beyond PUBLIC's, then runs `grants` (SQL with `%I`
 * standing for the role's quoted name) as the superuser.
 *
 * @example
 * const installer = await createRole(db, 'GRANT CREATE ON DATABASE %D TO %I');
 * const client = await installer.connect();
 */
export async function createRole(db: TestDatabase, grants = ''): Promise<TestRole> {
  const name = `pgl_${randomBytes(5).toString('hex')}`;
  const quoted = pg.escapeIdentifier(name);
  const database = pg.escapeIdentifier(decodeURIComponent(new URL(db.url).pathname.slice(1)));
  await db.pool.query(`CREATE ROLE ${quoted} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE`);
  if (grants) await db.pool.query(grants.replaceAll('%I', quoted).replaceAll('%D', database));
  const clients: pg.Client[] = [];
  return {
    name,
    async connect() {
      const client = new pg.Client({ connectionString: db.urlAs(name) });
      client.on('error', () => undefined);
      await client.connect();
      clients.push(client);
      return client;
    },
    async drop() {
      await Promise.all(clients.map((client) => client.end().catch(() => undefined)));
      await db.pool.query(`DROP OWNED BY ${quoted} CASCADE`);
      await db.pool.query(`DROP ROLE ${quoted}`);
    },
  };
}
