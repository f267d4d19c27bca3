/**
 * SEMANTICS.md §5 (first rule) and I9: each call commits or rolls back with the caller's
 * transaction; a rolled-back call, savepoint or failed statement leaves no trace.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type pg from 'pg';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { acquire, allRows, inspect, pgError, release, renew, sleepPast, storedRow } from '../support/lease-calls.js';
import { uniqueKey } from '../support/helpers.js';

let db: TestDatabase;
before(async () => {
  db = await createTestDatabase();
});
after(() => db.close());

/** Runs `body` on one pooled connection, rolling back whatever transaction it leaves open. */
async function withClient<T>(body: (client: pg.PoolClient) => Promise<T>): Promise<T> {
  const client = await db.pool.connect();
  try {
    return await body(client);
  } finally {
    await client.query('ROLLBACK').catch(() => undefined);
    client.release();
  }
}

describe('rollback', { concurrency: true }, () => {
  test('an acquire in a rolled-back transaction never happened', async () => {
    const key = uniqueKey('rollback-never');
    await withClient(async (client) => {
      await client.query('BEGIN');
      const granted = await acquire(client, key, 'worker-a', '1 minute');
      assert.equal(granted.epoch, 1n);
      await client.query('ROLLBACK');
    });
    assert.equal(await inspect(db.pool, key), undefined);
    assert.equal(await storedRow(db.pool, key), undefined);
    const next = await acquire(db.pool, key, 'worker-b', '1 minute');
    assert.equal(next.epoch, 1n, 'the key is still never-leased');
  });

  test('a rolled-back acquire of a released key leaves its watermark', async () => {
    const key = uniqueKey('rollback-free');
    const first = await acquire(db.pool, key, 'worker-a', '1 minute');
    await release(db.pool, key, 'worker-a', first.epoch);
    const rowBefore = await storedRow(db.pool, key);
    await withClient(async (client) => {
      await client.query('BEGIN');
      assert.equal((await acquire(client, key, 'worker-b', '1 minute')).epoch, 3n);
      await client.query('ROLLBACK');
    });
    assert.deepEqual(await storedRow(db.pool, key), rowBefore);
    assert.equal((await acquire(db.pool, key, 'worker-c', '1 minute')).epoch, 3n);
  });

  test('a rolled-back takeover leaves the lease lapsed with its old epoch', async () => {
    const key = uniqueKey('rollback-lapsed');
    const first = await acquire(db.pool, key, 'worker-a', '300 milliseconds');
    await sleepPast(db.pool, first.expiresAt);
    const rowBefore = await storedRow(db.pool, key);
    await withClient(async (client) => {
      await client.query('BEGIN');
      assert.equal((await acquire(client, key, 'worker-b', '1 minute')).epoch, 2n);
      await client.query('ROLLBACK');
    });
    assert.deepEqual(await storedRow(db.pool, key), rowBefore);
    assert.equal((await renew(db.pool, key, 'worker-a', first.epoch, '1 minute')).status, 'lapsed');
  });

  test('a rolled-back renew restores the previous expiry', async () => {
    const key = uniqueKey('rollback-renew');
    const granted = await acquire(db.pool, key, 'worker-a', '1 minute');
    await withClient(async (client) => {
      await client.query('BEGIN');
      const renewed = await renew(client, key, 'worker-a', granted.epoch, '1 hour');
      assert.equal(renewed.status, 'ok');
      await client.query('ROLLBACK');
    });
    assert.equal((await inspect(db.pool, key))!.expiresAt, granted.expiresAt);
  });

  test('a rolled-back release leaves the lease held with the same epoch', async () => {
    const key = uniqueKey('rollback-release');
    const granted = await acquire(db.pool, key, 'worker-a', '1 minute');
    await withClient(async (client) => {
      await client.query('BEGIN');
      assert.equal((await release(client, key, 'worker-a', granted.epoch)).status, 'ok');
      await client.query('ROLLBACK');
    });
    assert.deepEqual(await inspect(db.pool, key), {
      held: true,
      owner: 'worker-a',
      epoch: granted.epoch,
      expiresAt: granted.expiresAt,
    });
    assert.equal((await renew(db.pool, key, 'worker-a', granted.epoch, '1 minute')).status, 'ok');
  });

  test('rollback to a savepoint undoes only the calls made after it', async () => {
    const kept = uniqueKey('savepoint-kept');
    const undone = uniqueKey('savepoint-undone');
    await withClient(async (client) => {
      await client.query('BEGIN');
      const first = await acquire(client, kept, 'worker-a', '1 minute');
      await client.query('SAVEPOINT before_more');
      await acquire(client, undone, 'worker-a', '1 minute');
      assert.equal((await release(client, kept, 'worker-a', first.epoch)).status, 'ok');
      await client.query('ROLLBACK TO SAVEPOINT before_more');
      assert.equal((await inspect(client, kept))!.held, true);
      await client.query('COMMIT');
    });
    assert.equal((await inspect(db.pool, kept))!.epoch, 1n);
    assert.equal((await inspect(db.pool, kept))!.held, true);
    assert.equal(await inspect(db.pool, undone), undefined);
  });

  test('a failed call aborts the transaction and its earlier grant leaves no trace', async () => {
    const key = uniqueKey('abort');
    // Other tests of this file run concurrently: compare only rows of this test's key.
    const before = await allRows(db.pool, [key]);
    await withClient(async (client) => {
      await client.query('BEGIN');
      await acquire(client, key, 'worker-a', '1 minute');
      const error = await pgError(acquire(client, key, 'worker-a', '0'));
      assert.equal(error.code, '22023');
      const aborted = await pgError(inspect(client, key));
      assert.equal(aborted.code, '25P02', 'the transaction is aborted');
      await client.query('ROLLBACK');
    });
    assert.equal(await inspect(db.pool, key), undefined);
    assert.deepEqual(await allRows(db.pool, [key]), before);
  });

  test('a failed call inside a savepoint is undone by rolling back to it', async () => {
    const key = uniqueKey('savepoint-error');
    await withClient(async (client) => {
      await client.query('BEGIN');
      const granted = await acquire(client, key, 'worker-a', '1 minute');
      await client.query('SAVEPOINT attempt');
      assert.equal((await pgError(renew(client, key, 'worker-a', null, '1 minute'))).code, '22023');
      await client.query('ROLLBACK TO SAVEPOINT attempt');
      assert.equal((await renew(client, key, 'worker-a', granted.epoch, '2 minutes')).status, 'ok');
      await client.query('COMMIT');
    });
    assert.equal((await inspect(db.pool, key))!.held, true);
  });
});

describe('commit', { concurrency: true }, () => {
  test('calls in one transaction see each other, and others see them only after commit', async () => {
    const key = uniqueKey('commit');
    await withClient(async (client) => {
      await client.query('BEGIN');
      const first = await acquire(client, key, 'worker-a', '1 minute');
      assert.equal((await renew(client, key, 'worker-a', first.epoch, '2 minutes')).status, 'ok');
      assert.equal((await release(client, key, 'worker-a', first.epoch)).status, 'ok');
      const second = await acquire(client, key, 'worker-b', '1 minute');
      assert.equal(second.epoch, 3n);
      assert.equal(await inspect(db.pool, key), undefined, 'uncommitted work is invisible');
      await client.query('COMMIT');
    });
    const seen = await inspect(db.pool, key);
    assert.equal(seen?.owner, 'worker-b');
    assert.equal(seen?.epoch, 3n);
  });
});
