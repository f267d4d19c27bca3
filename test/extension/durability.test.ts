/**
 * SEMANTICS.md I10 (durable) and I2/I3 (epochs never handed out twice): a grant, renew or
 * release whose commit returned must survive a crash, so the writing calls never commit
 * asynchronously, whatever the caller's session asked for. 0.2.0 decides at commit time (a
 * deferred trigger); that the commit record is then flushed is shown by
 * defects-0.1.0.test.ts. Here: the caller's own setting is never changed, inside the
 * transaction or after it.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type pg from 'pg';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { acquire, release, renew } from '../support/lease-calls.js';
import { uniqueKey } from '../support/helpers.js';

let db: TestDatabase;
before(async () => {
  db = await createTestDatabase();
});
after(() => db.close());

async function synchronousCommit(client: pg.PoolClient): Promise<string> {
  const { rows } = await client.query<{ synchronous_commit: string }>('SHOW synchronous_commit');
  return rows[0]!.synchronous_commit;
}

/** Runs `call` in a transaction of a session with the given setting; reports the setting seen inside the transaction and after it. */
async function settingAround(
  session: string,
  call: (client: pg.PoolClient) => Promise<unknown>,
): Promise<{ inside: string; after: string }> {
  const client = await db.pool.connect();
  try {
    await client.query(`SET synchronous_commit = ${session}`);
    await client.query('BEGIN');
    await call(client);
    const inside = await synchronousCommit(client);
    await client.query('COMMIT');
    return { inside, after: await synchronousCommit(client) };
  } finally {
    await client.query('RESET synchronous_commit');
    client.release();
  }
}

describe('writes commit durably', { concurrency: true }, () => {
  test('an acquire in an asynchronous-commit session leaves the session setting as it was', async () => {
    const key = uniqueKey('durable-acquire');
    const seen = await settingAround('off', (client) => acquire(client, key, 'worker-a', '1 minute'));
    assert.deepEqual(seen, { inside: 'off', after: 'off' });
  });

  test('a denied acquire in an asynchronous-commit session leaves the setting as it was', async () => {
    const key = uniqueKey('durable-denied');
    await acquire(db.pool, key, 'worker-a', '1 minute');
    const seen = await settingAround('off', async (client) => {
      const denied = await acquire(client, key, 'worker-b', '1 minute');
      assert.equal(denied.acquired, false);
    });
    assert.deepEqual(seen, { inside: 'off', after: 'off' });
  });

  test('a renew and a release in an asynchronous-commit session leave the setting as it was', async () => {
    const key = uniqueKey('durable-renew-release');
    const granted = await acquire(db.pool, key, 'worker-a', '1 minute');
    const renewed = await settingAround('off', async (client) => {
      assert.equal((await renew(client, key, 'worker-a', granted.epoch!, '1 minute')).status, 'ok');
    });
    assert.deepEqual(renewed, { inside: 'off', after: 'off' });
    const released = await settingAround('off', async (client) => {
      assert.equal((await release(client, key, 'worker-a', granted.epoch!)).status, 'ok');
    });
    assert.deepEqual(released, { inside: 'off', after: 'off' });
  });

  test('a stronger caller setting is left as it is', async () => {
    const key = uniqueKey('durable-stronger');
    for (const setting of ['on', 'remote_write', 'remote_apply', 'local']) {
      const seen = await settingAround(setting, (client) =>
        acquire(client, `${key}-${setting}`, 'worker-a', '1 minute'),
      );
      assert.deepEqual(seen, { inside: setting, after: setting });
    }
  });
});
