/**
 * Waiting behind PgBouncer in transaction mode, where LISTEN does not work: the client finds
 * out (its probe notification never comes back), polls with expiry-exact sleeps instead, marks
 * no key (so releases do not notify for nobody), and pins no server connection while it waits.
 * Cancelling attempts through the pooler leaves it running.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { LeaseAbortedError, LeaseClient } from '../../src/index.js';
import { uniqueKey } from '../support/helpers.js';
import { blockTakeovers } from '../support/lease-calls.js';
import { bouncedPool, skipWithoutPgBouncer, startBounced, type Bounced } from './support.js';
import { setTimeout as sleep } from 'node:timers/promises';

const skip = skipWithoutPgBouncer();
let bounced: Bounced;
let direct: pg.Pool;
const pools: pg.Pool[] = [];

before(async () => {
  if (skip) return;
  // One server connection: a waiter that pinned it would stop everyone else.
  bounced = await startBounced('transaction', 1);
  direct = new pg.Pool({ connectionString: bounced.directUrl, max: 2 });
});

after(async () => {
  await Promise.all(pools.map((pool) => pool.end()));
  await direct?.end();
  await bounced?.close();
});

function bouncedClient(): LeaseClient {
  const pool = bouncedPool(bounced.url, 4);
  pools.push(pool);
  return new LeaseClient(pool, { pollInterval: 20 });
}

describe('waiting behind PgBouncer in transaction mode', { skip }, () => {
  test('a waiter falls back to polling, marks nothing and pins no server connection', async () => {
    const key = uniqueKey('pgbouncer-wait');
    const holderClient = bouncedClient();
    const waiterClient = bouncedClient();
    const holder = (await holderClient.acquire(key, { ttl: '1 min' }))!;
    const waiting = waiterClient.acquire(key, { ttl: '1 min', wait: '30s' });
    waiting.catch(() => undefined);
    // Past the probe (2 s): the waiter polls now.
    await sleep(2_500);
    // With one server connection, the holder's calls still go through at once.
    for (let i = 0; i < 5; i++) {
      const started = performance.now();
      await holder.renew();
      assert.ok(performance.now() - started < 2_000, 'the holder waited for the waiter');
    }
    const { rows } = await direct.query<{ watched_until: Date | null }>(
      'SELECT watched_until FROM lease.leases WHERE key = $1',
      [key],
    );
    assert.equal(rows[0]?.watched_until, null, 'a polling waiter marked the key');
    await holder.release();
    const lease = await waiting;
    assert.ok(lease, 'the polling waiter got the released key');
    assert.equal(lease.epoch, holder.epoch + 2n);
    await lease.release();
  });

  test('a polling waiter takes a lapsed lease over at its expiry', async () => {
    const key = uniqueKey('pgbouncer-lapse');
    const holder = (await bouncedClient().acquire(key, { ttl: '3s' }))!;
    const lease = await bouncedClient().acquire(key, { ttl: '1 min', wait: '30s' });
    assert.ok(lease);
    assert.ok(lease.expiresAt.getTime() - 60_000 >= holder.expiresAt.getTime());
    await lease.release();
  });
});

describe('cancelling through PgBouncer', { skip }, () => {
  test('attempts cancelled one after another through the pooler leave it serving', async () => {
    const key = uniqueKey('pgbouncer-cancel');
    const holderClient = bouncedClient();
    const holder = (await holderClient.acquire(key, { ttl: '1s' }))!;
    const blocker = await blockTakeovers(direct, key, holder);
    try {
      const waiter = bouncedClient();
      for (let i = 0; i < 25; i++) {
        const controller = new AbortController();
        const waiting = waiter.acquire(key, { ttl: '30s', signal: controller.signal });
        await sleep(20);
        controller.abort();
        await assert.rejects(waiting, LeaseAbortedError);
      }
      await blocker.commit();
      // PgBouncer still serves: the holder renews through it, and nothing was granted.
      const renewed = await holderClient.renew(key, {
        owner: holder.owner,
        epoch: holder.epoch,
        ttl: '1 min',
      });
      assert.equal(renewed.status, 'ok');
      await holderClient.release(key, { owner: holder.owner, epoch: holder.epoch });
    } finally {
      await blocker.close();
    }
  });
});
