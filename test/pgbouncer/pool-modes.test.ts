/**
 * What works in PgBouncer's other two pool modes, for the README's table. Session pooling
 * gives each client a server connection of its own for as long as it is connected: all of
 * pg_lease works as on a direct connection, with as many server connections as clients.
 * Statement pooling hands the connection back after every statement: the client's calls
 * (each one autocommitted statement, waits included) work, explicit transactions do not.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { LeaseClient } from '../../src/index.js';
import { acquire, release } from '../support/lease-calls.js';
import { rejectsSomehow } from '../failure/support/sessions.js';
import { POOL_SIZE, bouncedPool, skipWithoutPgBouncer, startBounced } from './support.js';

const skip = skipWithoutPgBouncer();

/**
 * Six clients, two per key, take turns: acquire with a wait, renew, release. At most one
 * client per key waits at a time, so the waits never take every server connection.
 */
async function cycle(url: string): Promise<number> {
  const pools = Array.from({ length: 6 }, () => bouncedPool(url, 1));
  let grants = 0;
  try {
    await Promise.all(
      pools.map(async (pool, n) => {
        const client = new LeaseClient(pool);
        for (let round = 0; round < 5; round++) {
          const lease = await client.acquire(`modes/${(n + round) % 4}`, {
            ttl: '30s',
            wait: '30s',
          });
          grants++;
          await lease!.renew();
          assert.equal(await lease!.release(), 'ok');
        }
      }),
    );
  } finally {
    await Promise.all(pools.map((pool) => pool.end()));
  }
  return grants;
}

describe('PgBouncer pool modes', { skip }, () => {
  test('session pooling: the client, waits and explicit transactions work while each client has its own server connection', async () => {
    // Each connected client holds a server connection in session mode: room for all of them.
    const bounced = await startBounced('session', 8);
    try {
      assert.equal(await cycle(bounced.url), 30);
      const pool = bouncedPool(bounced.url, 1);
      try {
        const client = await pool.connect();
        try {
          await client.query('BEGIN');
          const grant = await acquire(client, 'modes/tx', 'me', '30 seconds');
          assert.equal((await release(client, 'modes/tx', 'me', grant.epoch!)).status, 'ok');
          await client.query('COMMIT');
        } finally {
          client.release();
        }
      } finally {
        await pool.end();
      }
    } finally {
      await bounced.close();
    }
  });

  test('statement pooling: the client and its waits work, explicit transactions are refused by PgBouncer', async () => {
    const bounced = await startBounced('statement');
    try {
      assert.ok(POOL_SIZE > 3, 'the cycle has up to three waits at once');
      assert.equal(await cycle(bounced.url), 30);
      const pool = bouncedPool(bounced.url, 1);
      try {
        const error = await rejectsSomehow(pool.query('BEGIN'));
        assert.match(error.message, /transaction blocks not allowed in statement pooling mode/);
      } finally {
        await pool.end();
      }
    } finally {
      await bounced.close();
    }
  });
});
