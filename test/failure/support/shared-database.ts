/**
 * The failure suite's database in the run's shared cluster (see test/support/database.ts).
 */
import { createTestDatabase, type TestDatabase } from '../../support/database.js';

/**
 * A test database whose pool tolerates being cut off. `pool.end()` resolves before its idle
 * connections have closed, and `close()` then drops the database WITH (FORCE), which can
 * terminate one of them: without a listener that surfaces as an uncaught 'error' after the
 * file's tests have passed.
 */
export async function openSharedDatabase(): Promise<TestDatabase> {
  const database = await createTestDatabase();
  database.pool.on('error', () => undefined);
  return database;
}
