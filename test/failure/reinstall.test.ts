/**
 * Failure model, the edges of the lease namespace: DROP EXTENSION deletes every lease and
 * every epoch counter, so a re-install starts keys at epoch 1 again (documented, not a bug:
 * fencing tokens issued before the drop are no longer ordered against new ones); and each
 * database is its own namespace, with no exclusion across databases (a non-goal).
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import {
  acquireTimed as acquire,
  inspect,
  releaseTimed as release,
} from '../support/lease-calls.js';
import { rejectsSomehow } from './support/sessions.js';

describe('reinstall and databases', () => {
  let database: TestDatabase;
  let other: TestDatabase;
  before(async () => {
    database = await createTestDatabase();
    other = await createTestDatabase();
  });
  after(async () => {
    await database?.close();
    await other?.close();
  });

  /** Tables, sequences and views left in schema lease (whether the schema itself stays or not). */
  async function relationsInLeaseSchema(): Promise<string[]> {
    const { rows } = await database.pool.query<{ name: string }>(
      `SELECT c.relname AS name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'lease' ORDER BY 1`,
    );
    return rows.map((row) => row.name);
  }

  test('a rolled-back DROP EXTENSION keeps every lease', async () => {
    const { pool } = database;
    const grant = await acquire(pool, 'reinstall/kept', 'worker-a', '60 seconds');
    const before = await inspect(pool, 'reinstall/kept');
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      await client.query('DROP EXTENSION pg_lease');
      await client.query('ROLLBACK');
    } finally {
      client.release();
    }
    assert.deepEqual(await inspect(pool, 'reinstall/kept'), before);
    await release(pool, 'reinstall/kept', 'worker-a', grant.epoch!);
  });

  test('DROP EXTENSION removes every lease and epoch; CREATE EXTENSION starts every key at epoch 1', async () => {
    const { pool } = database;
    for (let round = 0; round < 3; round++) {
      const grant = await acquire(pool, 'reinstall/cycled', `worker-${round}`, '60 seconds');
      await release(pool, 'reinstall/cycled', `worker-${round}`, grant.epoch!);
    }
    await acquire(pool, 'reinstall/held', 'worker-a', '60 seconds');
    assert.equal((await inspect(pool, 'reinstall/cycled'))?.epoch, 6n);

    assert.notDeepEqual(await relationsInLeaseSchema(), []);
    await pool.query('DROP EXTENSION pg_lease');
    assert.deepEqual(await relationsInLeaseSchema(), []);
    const gone = await rejectsSomehow(pool.query("SELECT * FROM lease.inspect('reinstall/held')"));
    // undefined_function, or invalid_schema_name when the schema went with the extension
    assert.ok(['42883', '3F000'].includes((gone as { code?: string }).code ?? ''), gone.message);

    await pool.query('CREATE EXTENSION pg_lease');
    assert.equal(await inspect(pool, 'reinstall/cycled'), undefined);
    assert.equal(await inspect(pool, 'reinstall/held'), undefined);
    const fresh = await acquire(pool, 'reinstall/cycled', 'worker-b', '60 seconds');
    assert.deepEqual([fresh.acquired, fresh.epoch], [true, 1n]);
    const taken = await acquire(pool, 'reinstall/held', 'worker-b', '60 seconds');
    assert.deepEqual([taken.acquired, taken.epoch], [true, 1n]);
  });

  test('each database is its own lease namespace: the same key can be held in two databases at once', async () => {
    const here = await acquire(database.pool, 'reinstall/shared-name', 'worker-a', '60 seconds');
    const there = await acquire(other.pool, 'reinstall/shared-name', 'worker-b', '60 seconds');
    assert.equal(here.acquired, true);
    assert.equal(there.acquired, true);
    assert.equal(there.epoch, 1n);
  });
});
