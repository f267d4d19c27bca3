import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import {
  fencedTransaction,
  LeaseClient,
  LeaseError,
  LeaseFencedError,
  LeaseInvalidInputError,
  SQLSTATE,
  STALE_EPOCH_MESSAGE,
} from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { uniqueKey, waitFor } from '../support/helpers.js';

let db: TestDatabase;
let client: LeaseClient;

before(async () => {
  db = await createTestDatabase();
  client = new LeaseClient(db.pool);
  await db.pool.query(
    `CREATE TABLE jobs (id int PRIMARY KEY, lease_key text NOT NULL, lease_epoch bigint NOT NULL, result text)`,
  );
  await db.pool.query(
    `CREATE TRIGGER jobs_fence BEFORE INSERT OR UPDATE ON jobs
       FOR EACH ROW EXECUTE FUNCTION lease.fence_row('lease_key', 'lease_epoch')`,
  );
  await db.pool.query('CREATE TABLE notes (key text, note text)');
});
after(() => db.close());

async function notes(key: string): Promise<string[]> {
  const { rows } = await db.pool.query<{ note: string }>(
    'SELECT note FROM notes WHERE key = $1 ORDER BY note',
    [key],
  );
  return rows.map((row) => row.note);
}

/** Connections the pool has checked out right now. */
const checkedOut = () => db.pool.totalCount - db.pool.idleCount;

describe('client.fenced', () => {
  test('commits the callback under a live grant and resolves with its result', async () => {
    const key = uniqueKey('fenced-ok');
    const lease = (await client.acquire(key, { ttl: '30s' }))!;
    const result = await client.fenced(lease, async (tx) => {
      await tx.query("INSERT INTO notes VALUES ($1, 'written')", [key]);
      const { rows } = await tx.query('SHOW transaction_isolation');
      return rows[0].transaction_isolation as string;
    });
    assert.equal(result, 'read committed');
    assert.deepEqual(await notes(key), ['written']);
    await lease.release();
  });

  test('holds the key while the callback runs: the holder renew waits until the commit', async () => {
    const key = uniqueKey('fenced-holds');
    const lease = (await client.acquire(key, { ttl: '30s' }))!;
    let renewed = false;
    let renewal: Promise<unknown> = Promise.resolve();
    await client.fenced(lease, async (tx) => {
      renewal = lease.renew().then(() => {
        renewed = true;
      });
      const { rows } = await tx.query('SELECT pg_backend_pid() AS pid');
      // The renew's backend waits for this transaction's lock on the key.
      await waitFor('the renew waits for the fenced transaction', async () => {
        const blocked = await db.pool.query(
          `SELECT 1 FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))`,
          [rows[0].pid],
        );
        return (blocked.rowCount ?? 0) > 0;
      });
      assert.equal(renewed, false);
    });
    await renewal;
    await waitFor('the renew goes through after the commit', () => renewed);
    await lease.release();
  });

  test('refuses a stale epoch at the fence with LeaseFencedError, never running the callback', async () => {
    const key = uniqueKey('fenced-stale');
    const lease = (await client.acquire(key, { ttl: '30s' }))!;
    assert.equal(await lease.release(), 'ok');
    let ran = false;
    const before = checkedOut();
    const error = await client
      .fenced(lease, () => {
        ran = true;
      })
      .catch((caught: unknown) => caught);
    assert.ok(error instanceof LeaseFencedError, String(error));
    assert.ok(error instanceof LeaseError);
    assert.equal(error.name, 'LeaseFencedError');
    assert.equal(error.code, 'stale_epoch');
    assert.equal(error.sqlState, SQLSTATE.STALE_EPOCH);
    assert.equal(error.message, STALE_EPOCH_MESSAGE);
    assert.equal(error.key, key);
    assert.equal(error.epoch, lease.epoch);
    assert.equal(
      error.detail,
      `key "${key}": epoch ${lease.epoch} presented, but the key is free with watermark ${lease.epoch + 1n}`,
    );
    assert.ok(error.cause instanceof pg.DatabaseError);
    assert.equal((error.cause as pg.DatabaseError).code, 'PLF01');
    assert.equal(ran, false);
    assert.equal(checkedOut(), before, 'the connection went back to the pool');
  });

  test('maps a refusal by a fence_row trigger inside the callback, and commits none of it', async () => {
    const key = uniqueKey('fenced-trigger');
    const lease = (await client.acquire(key, { ttl: '30s' }))!;
    const error = await client
      .fenced(lease, async (tx) => {
        await tx.query("INSERT INTO notes VALUES ($1, 'before the stale row')", [key]);
        await tx.query('INSERT INTO jobs VALUES (1, $1, $2)', [key, String(lease.epoch + 1n)]);
      })
      .catch((caught: unknown) => caught);
    assert.ok(error instanceof LeaseFencedError, String(error));
    assert.match(error.detail ?? '', /is held under epoch 1$/);
    assert.deepEqual(await notes(key), []);
    await client.fenced(lease, (tx) =>
      tx.query("INSERT INTO jobs VALUES (2, $1, $2, 'ok')", [key, String(lease.epoch)]),
    );
    await lease.release();
  });

  test('a lease that lapsed before the transaction is refused', async () => {
    const key = uniqueKey('fenced-lapsed');
    const lease = (await client.acquire(key, { ttl: 200 }))!;
    await waitFor('the lease lapses', async () => !(await client.inspect(key))!.held);
    const error = await client
      .fenced(lease, (tx) => tx.query("INSERT INTO notes VALUES ($1, 'late')", [key]))
      .catch((caught: unknown) => caught);
    assert.ok(error instanceof LeaseFencedError);
    assert.match(error.detail!, /the key lapsed \(epoch 1\)$/);
    assert.deepEqual(await notes(key), []);
  });

  test('rethrows the callback error untouched, rolls back and returns the connection', async () => {
    const key = uniqueKey('fenced-throws');
    const lease = (await client.acquire(key, { ttl: '30s' }))!;
    const before = checkedOut();
    const thrown = new Error('business rule');
    const error = await client
      .fenced(lease, async (tx) => {
        await tx.query("INSERT INTO notes VALUES ($1, 'undone')", [key]);
        throw thrown;
      })
      .catch((caught: unknown) => caught);
    assert.equal(error, thrown);
    assert.deepEqual(await notes(key), []);
    assert.equal(checkedOut(), before);
    // The key's row is not left locked: the release goes through.
    assert.equal(await lease.release(), 'ok');
  });

  test('rejects when the callback swallowed a failed statement, instead of reporting a commit', async () => {
    const key = uniqueKey('fenced-swallowed');
    const lease = (await client.acquire(key, { ttl: '30s' }))!;
    const error = await client
      .fenced(lease, async (tx) => {
        await tx.query("INSERT INTO notes VALUES ($1, 'lost')", [key]);
        await tx.query('SELECT 1 / 0').catch(() => undefined);
        return 'looks fine';
      })
      .catch((caught: unknown) => caught);
    assert.ok(error instanceof Error && /rolled back/.test(error.message), String(error));
    assert.deepEqual(await notes(key), []);
    await lease.release();
  });

  test('runs at the isolation level asked for', async () => {
    const key = uniqueKey('fenced-isolation');
    const lease = (await client.acquire(key, { ttl: '30s' }))!;
    for (const isolation of ['read committed', 'repeatable read', 'serializable'] as const) {
      const level = await client.fenced(
        lease,
        async (tx) => (await tx.query('SHOW transaction_isolation')).rows[0].transaction_isolation,
        { isolation },
      );
      assert.equal(level, isolation);
    }
    await assert.rejects(
      client.fenced(lease, () => undefined, { isolation: 'chaos' as 'serializable' }),
      LeaseInvalidInputError,
    );
    await lease.release();
  });
});

describe('fencedTransaction', () => {
  test('fences by any key and epoch, on a dedicated client too', async () => {
    const key = uniqueKey('fenced-standalone');
    const lease = (await client.acquire(key, { ttl: '30s' }))!;
    const dedicated = new pg.Client({ connectionString: db.url });
    await dedicated.connect();
    try {
      await fencedTransaction(dedicated, { key, epoch: lease.epoch }, (tx) =>
        tx.query("INSERT INTO notes VALUES ($1, 'dedicated')", [key]),
      );
      assert.equal(dedicated.getTransactionStatus(), 'I');
      await assert.rejects(
        fencedTransaction(dedicated, { key, epoch: lease.epoch + 5n }, () => undefined),
        LeaseFencedError,
      );
      assert.equal(dedicated.getTransactionStatus(), 'I');
      await dedicated.query('BEGIN');
      const error = await fencedTransaction(dedicated, { key, epoch: lease.epoch }, () => 1).catch(
        (caught: unknown) => caught,
      );
      assert.ok(error instanceof LeaseError && error.code === 'in_transaction', String(error));
      await dedicated.query('ROLLBACK');
    } finally {
      await dedicated.end();
    }
    assert.deepEqual(await notes(key), ['dedicated']);
    await lease.release();
  });
});
