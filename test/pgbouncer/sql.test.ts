/**
 * The SQL API through PgBouncer in transaction mode: blocking waits that end early (a cancel
 * on the server, the caller's statement_timeout, the wait's own bound) leave nothing on the
 * server connection that PgBouncer hands to the next client, and explicit transactions keep
 * their one server connection for their whole length.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type pg from 'pg';
import { acquire, inspect, release, renew } from '../support/lease-calls.js';
import { rejectsWithCode } from '../failure/support/sessions.js';
import {
  assertNothingLeftOnServer,
  bouncedPool,
  sampled,
  skipWithoutPgBouncer,
  startBounced,
  waitForServerWaiters,
  POOL_SIZE,
  type Bounced,
} from './support.js';

const skip = skipWithoutPgBouncer();

describe('SQL API behind PgBouncer (transaction pooling)', { skip }, () => {
  let bounced: Bounced;
  let pool: pg.Pool;
  before(async () => {
    bounced = await startBounced();
    pool = bouncedPool(bounced.url, 40);
  });
  after(async () => {
    await pool?.end();
    await bounced?.close();
  });

  /** The holder takes `key` for a minute; returns its epoch. */
  async function hold(key: string): Promise<bigint> {
    const grant = await acquire(pool, key, 'holder', '60 seconds');
    assert.equal(grant.acquired, true);
    return grant.epoch!;
  }

  /** After an interrupted wait: nothing left on the server, the key unchanged, the holder served. */
  async function assertUndisturbed(key: string, epoch: bigint): Promise<void> {
    await assertNothingLeftOnServer(bounced.admin);
    assert.equal((await inspect(pool, key))?.owner, 'holder');
    assert.equal((await renew(pool, key, 'holder', epoch, '60 seconds')).status, 'ok');
    assert.equal((await release(pool, key, 'holder', epoch)).status, 'ok');
    assert.equal((await inspect(pool, key))?.epoch, epoch + 1n);
  }

  test('a wait cancelled on the server leaves no transaction or row lock on the pooled connection', async () => {
    const epoch = await hold('sql/cancelled');
    // The rejection is awaited from the start, so that it is handled whenever it comes.
    const cancelled = rejectsWithCode(
      acquire(pool, 'sql/cancelled', 'waiter', '60 seconds', '60 seconds'),
      '57014',
      /canceling statement due to user request/,
    );
    const [pid] = await waitForServerWaiters(bounced.admin, 1);
    await bounced.admin.query('SELECT pg_cancel_backend($1)', [pid]);
    await cancelled;
    await assertUndisturbed('sql/cancelled', epoch);
  });

  test("a wait ended by the caller's SET LOCAL statement_timeout rolls back, and the setting ends with that transaction", async () => {
    const epoch = await hold('sql/timeout');
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      await client.query("SET LOCAL statement_timeout = '300ms'");
      await rejectsWithCode(
        acquire(client, 'sql/timeout', 'waiter', '60 seconds', '60 seconds'),
        '57014',
        /statement timeout/,
      );
      await client.query('ROLLBACK');
    } finally {
      client.release();
    }
    await assertUndisturbed('sql/timeout', epoch);
    // Whatever server connection the next statements get, none carries the timeout on.
    const settings = await Promise.all(
      Array.from({ length: POOL_SIZE * 2 }, () => pool.query('SHOW statement_timeout')),
    );
    for (const { rows } of settings) assert.equal(rows[0].statement_timeout, '0');
  });

  test('a wait that runs out of its own bound reports the lease timeout and leaves nothing behind', async () => {
    const epoch = await hold('sql/bound');
    await rejectsWithCode(
      acquire(pool, 'sql/bound', 'waiter', '60 seconds', '300 milliseconds'),
      '57014',
      /pg_lease: acquire timed out/,
    );
    await assertUndisturbed('sql/bound', epoch);
  });

  test('thirty-two clients run explicit transactions of acquire, fenced write and release through four server connections', async () => {
    await pool.query(
      'CREATE TABLE IF NOT EXISTS guarded (key text PRIMARY KEY, epoch bigint, writes int)',
    );
    const keys = Array.from({ length: 8 }, (_, n) => `sql/tx/${n}`);
    await pool.query(
      'INSERT INTO guarded SELECT k, 0, 0 FROM unnest($1::text[]) AS k ON CONFLICT DO NOTHING',
      [keys],
    );
    const clients = Array.from({ length: 32 }, () => bouncedPool(bounced.url, 1));
    let committed = 0;
    try {
      const { maxServer } = await sampled(
        bounced,
        Promise.all(
          clients.map(async (own, n) => {
            for (let round = 0; round < 10; round++) {
              const key = keys[(n + round) % keys.length]!;
              const client = await own.connect();
              try {
                await client.query('BEGIN');
                const grant = await acquire(client, key, `tx-${n}`, '30 seconds');
                if (grant.acquired) {
                  const { rowCount } = await client.query(
                    'UPDATE guarded SET epoch = $2, writes = writes + 1 WHERE key = $1 AND epoch < $2',
                    [key, grant.epoch],
                  );
                  assert.equal(
                    rowCount,
                    1,
                    `${key}: fenced write under epoch ${grant.epoch} refused`,
                  );
                  assert.equal((await release(client, key, `tx-${n}`, grant.epoch!)).status, 'ok');
                }
                await client.query('COMMIT');
                if (grant.acquired) committed++;
              } finally {
                client.release();
              }
            }
          }),
        ),
      );
      assert.ok(maxServer <= POOL_SIZE, `${maxServer} server connections`);
      const { rows } = await pool.query<{ writes: number }>(
        'SELECT sum(writes)::int AS writes FROM guarded',
      );
      assert.equal(rows[0]!.writes, committed);
      assert.ok(committed >= 32, `only ${committed} transactions got their key`);
      await assertNothingLeftOnServer(bounced.admin);
    } finally {
      await Promise.all(clients.map((own) => own.end()));
    }
  });
});
