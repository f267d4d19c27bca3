/**
 * Counted and shared keys through PgBouncer in transaction mode (SEMANTICS §13): permits and
 * shared grants are single autocommitted statements like every other call; a waiter, which
 * cannot LISTEN here, polls, and still wakes at the earliest permit's expiry rather than the
 * latest one or its poll interval; and an exclusive waiter, which waits in the server while
 * the key is shared (each slice one statement, so one transaction, as the pooler runs it),
 * is not starved by a stream of overlapping readers.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { LeaseClient, type Lease, type LeaseClientOptions } from '../../src/index.js';
import { uniqueKey } from '../support/helpers.js';
import { bouncedPool, skipWithoutPgBouncer, startBounced, type Bounced } from './support.js';

const skip = skipWithoutPgBouncer();
let bounced: Bounced;
let direct: pg.Pool;
const pools: pg.Pool[] = [];

before(async () => {
  if (skip) return;
  bounced = await startBounced('transaction');
  direct = new pg.Pool({ connectionString: bounced.directUrl, max: 2 });
});

after(async () => {
  await Promise.all(pools.map((pool) => pool.end()));
  await direct?.end();
  await bounced?.close();
});

function bouncedClient(options: LeaseClientOptions = {}): LeaseClient {
  const pool = bouncedPool(bounced.url, 3);
  pools.push(pool);
  return new LeaseClient(pool, options);
}

describe('counted and shared keys behind PgBouncer in transaction mode', { skip }, () => {
  test('N+1 concurrent acquires of an N-permit key grant exactly N, kept alive through the pooler', async () => {
    const key = uniqueKey('pgbouncer-permits');
    const n = 3;
    const leases = await Promise.all(
      Array.from({ length: n + 1 }, () =>
        bouncedClient().acquire(key, { ttl: '2s', limit: n, keepAlive: true }),
      ),
    );
    const granted = leases.filter((lease): lease is Lease => lease !== null);
    assert.equal(granted.length, n);
    assert.equal(new Set(granted.map((lease) => lease.epoch)).size, n);
    // Past the ttl: renewed through the pooler.
    await new Promise((resolve) => setTimeout(resolve, 3_000));
    for (const lease of granted) assert.equal(lease.signal.aborted, false);
    const { rows } = await direct.query<{ n: number }>(
      'SELECT count(*)::int AS n FROM lease.holders($1)',
      [key],
    );
    assert.equal(rows[0]!.n, n);
    assert.deepEqual(await Promise.all(granted.map((lease) => lease.release())), [
      'ok',
      'ok',
      'ok',
    ]);
  });

  test("a polling waiter gets a released permit well before the other permit's expiry", async () => {
    const key = uniqueKey('pgbouncer-permit-release');
    const holderClient = bouncedClient();
    const [a, b] = await Promise.all(
      [1, 2].map(() => holderClient.acquire(key, { ttl: '2 min', limit: 2 })),
    );
    assert.ok(a && b);
    const waiting = bouncedClient({ pollInterval: 200 }).acquire(key, {
      ttl: '1 min',
      limit: 2,
      wait: '40s',
    });
    waiting.catch(() => undefined);
    // Past the notification probe (2 s): the waiter polls.
    await new Promise((resolve) => setTimeout(resolve, 2_500));
    const releasedAt = performance.now();
    assert.equal(await a.release(), 'ok');
    const lease = await waiting;
    assert.ok(lease);
    const woken = performance.now() - releasedAt;
    assert.ok(woken < 8_000, `got the permit ${Math.round(woken)} ms after the release`);
    await Promise.all([lease.release(), b.release()]);
  });

  test("a polling waiter with a long poll interval wakes at the earliest permit's lapse", async () => {
    const key = uniqueKey('pgbouncer-permit-lapse');
    const holderClient = bouncedClient();
    const long = (await holderClient.acquire(key, { ttl: '3 min', limit: 2 }))!;
    const short = (await holderClient.acquire(key, { ttl: '3s', limit: 2 }))!;
    assert.ok(long && short);
    const started = performance.now();
    const lease = await bouncedClient({ pollInterval: '30s' }).acquire(key, {
      ttl: '1 min',
      limit: 2,
      wait: '50s',
    });
    const waited = performance.now() - started;
    assert.ok(lease);
    assert.ok(waited < 15_000, `waited ${Math.round(waited)} ms for a permit lapsing after 3 s`);
    await Promise.all([lease.release(), long.release()]);
  });

  test('shared holders and an exclusive waiter through the pooler', async () => {
    const key = uniqueKey('pgbouncer-shared');
    const readers = await Promise.all(
      [1, 2].map(() => bouncedClient().acquire(key, { ttl: '1 min', shared: true })),
    );
    assert.ok(readers.every((lease) => lease !== null));
    const writing = bouncedClient({ pollInterval: 200 }).acquire(key, {
      ttl: '1 min',
      wait: '40s',
    });
    writing.catch(() => undefined);
    await new Promise((resolve) => setTimeout(resolve, 2_500));
    assert.equal(await readers[0]!.release(), 'ok');
    const releasedAt = performance.now();
    assert.equal(await readers[1]!.release(), 'ok');
    const writer = await writing;
    assert.ok(writer);
    assert.ok(performance.now() - releasedAt < 8_000);
    assert.equal(await bouncedClient().acquire(key, { ttl: '1 min', shared: true }), null);
    await writer.release();
  });

  test('a waiting writer is not starved by a stream of overlapping readers through the pooler', async () => {
    const key = uniqueKey('pgbouncer-shared-stream');
    const readerClient = bouncedClient();
    let running = true;
    let granted = 0;
    let denied = 0;
    const endAt = performance.now() + 25_000; // longer than the writer's wait
    const stream = (async () => {
      let previous: Lease | null = null;
      try {
        for (let n = 0; running && performance.now() < endAt; n++) {
          const lease = await readerClient.acquire(key, {
            ttl: '1 min',
            shared: true,
            owner: `${key}-reader-${n % 2}`,
          });
          if (lease) granted++;
          else denied++;
          await new Promise((resolve) => setTimeout(resolve, 150));
          await previous?.release();
          previous = lease;
        }
      } finally {
        running = false;
        await previous?.release();
      }
    })();
    try {
      while (granted < 2) await new Promise((resolve) => setTimeout(resolve, 25));
      const writer = await bouncedClient({ pollInterval: 200 }).acquire(key, {
        ttl: '1 min',
        wait: '10s',
      });
      assert.ok(writer);
      assert.equal(running, true, 'granted while the readers were still trying');
      const grantedBefore = granted;
      const deniedBefore = denied;
      while (denied < deniedBefore + 2) await new Promise((resolve) => setTimeout(resolve, 25));
      assert.equal(granted, grantedBefore, 'no reader is granted beside the writer');
      const { rows } = await direct.query<{ owner: string | null }>(
        'SELECT owner FROM lease.inspect($1)',
        [key],
      );
      assert.equal(rows[0]!.owner, writer.owner);
      assert.equal(await writer.release(), 'ok');
    } finally {
      running = false;
      await stream;
    }
  });
});
