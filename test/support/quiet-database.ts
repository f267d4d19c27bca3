/**
 * createTestDatabase() for the extension suite, with one addition: connections of the pool that
 * the server ends while the database is dropped (`DROP DATABASE ... WITH (FORCE)` in close() can
 * overtake pool.end()) report their termination to a listener instead of crashing the test file.
 */
import { createTestDatabase, type TestDatabase } from './database.js';

export async function createQuietTestDatabase(
  options: { extension?: boolean } = {},
): Promise<TestDatabase> {
  const db = await createTestDatabase(options);
  db.pool.on('error', () => undefined);
  db.pool.on('connect', (client) => client.on('error', () => undefined));
  return db;
}
