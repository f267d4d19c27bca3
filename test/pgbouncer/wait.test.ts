/**
 * Waiting behind PgBouncer in transaction mode, where LISTEN does not work: the client finds
 * out (its probe notification never comes back), polls with expiry-exact sleeps instead, marks
 * no key (so releases do not notify for nobody), and pins no server connection while it waits.
 * Cancelling attempts through the pooler leaves it running, and ends them even when PgBouncer
 * still queues their statement (it drops the cancel request then).
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import * as fs from 'node:fs';
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

/** How many cancel requests PgBouncer dropped because their client had no server connection. */
function droppedCancels(): number {
  const log = fs.readFileSync(bounced.bouncer.logFile, 'utf8');
  return log.split('cancel request for idle client').length - 1;
}

describe('cancelling through PgBouncer', { skip }, () => {
  test('an attempt aborted while PgBouncer still queues its statement ends', async () => {
    // PgBouncer 1.18 drops a cancel request for a client that has no server connection yet
    // (its statement queued for one): the statement then runs when a server connection frees
    // up, and here blocks on a row lock that is released only after the attempt ends.
    const key = uniqueKey('pgbouncer-queued-cancel');
    const holderClient = bouncedClient();
    const holder = (await holderClient.acquire(key, { ttl: '1s' }))!;
    const blocker = await blockTakeovers(direct, key, holder);
    // The waiter's connection to PgBouncer is open before the server connection is taken.
    const waiterPool = bouncedPool(bounced.url, 1);
    pools.push(waiterPool);
    // Unnamed statements: a named one may be refused by the server connection (which already
    // has the name), and the client's fallback to an unnamed one would end the attempt.
    const waiter = new LeaseClient(waiterPool, { preparedStatements: false });
    await waiter.inspect(key);
    // The one server connection, held by a transaction through PgBouncer.
    const busy = new pg.Client({ connectionString: bounced.url });
    busy.on('error', () => undefined);
    await busy.connect();
    let busyOpen = false;
    try {
      await busy.query('BEGIN');
      await busy.query('SELECT 1');
      busyOpen = true;
      const controller = new AbortController();
      const dropped = droppedCancels();
      const waiting = waiter.acquire(key, { ttl: '30s', signal: controller.signal });
      const settled = waiting.then(
        () => 'resolved',
        (error: unknown) => error,
      );
      // Its statement waits in PgBouncer for the server connection.
      for (let tries = 0; ; tries++) {
        const pool = (await bounced.bouncer.admin('SHOW POOLS')).find(
          (row) => row.database === 'leases',
        );
        if (Number(pool?.cl_waiting) >= 1) break;
        assert.ok(tries < 400, 'the attempt never queued in PgBouncer');
        await sleep(25);
      }
      controller.abort();
      for (let tries = 0; droppedCancels() === dropped; tries++) {
        assert.ok(tries < 400, 'PgBouncer did not drop the cancel request of a queued client');
        await sleep(25);
      }
      // The server connection frees up: the queued statement reaches the server and waits
      // for the blocker's row lock.
      await busy.query('COMMIT');
      busyOpen = false;
      const outcome = await Promise.race([settled, sleep(10_000, 'still running')]);
      assert.ok(
        outcome instanceof LeaseAbortedError,
        `the aborted attempt did not end: ${String(outcome)}`,
      );
      // And no statement of it is left waiting on the server.
      const { rows } = await direct.query(
        `SELECT pid FROM pg_stat_activity
          WHERE datname = current_database() AND wait_event_type = 'Lock'`,
      );
      assert.deepEqual(rows, [], 'the aborted statement still waits on the server');
    } finally {
      if (busyOpen) await busy.query('ROLLBACK').catch(() => undefined);
      await busy.end().catch(() => undefined);
      await blocker.commit().catch(() => undefined);
      await blocker.close();
    }
    // PgBouncer still serves.
    const renewed = await holderClient.renew(key, {
      owner: holder.owner,
      epoch: holder.epoch,
      ttl: '1 min',
    });
    assert.equal(renewed.status, 'ok');
    await holderClient.release(key, { owner: holder.owner, epoch: holder.epoch });
  });

  test('an attempt aborted while PgBouncer queues its statement for long ends, unrun', async () => {
    // Cancel requests cannot reach a statement PgBouncer keeps queued: after a bound the client
    // closes the connection, and PgBouncer forgets the statement.
    const key = uniqueKey('pgbouncer-queued-drop');
    const holderClient = bouncedClient();
    const holder = (await holderClient.acquire(key, { ttl: '1s' }))!;
    const blocker = await blockTakeovers(direct, key, holder);
    const waiterPool = bouncedPool(bounced.url, 1);
    pools.push(waiterPool);
    const waiter = new LeaseClient(waiterPool, { preparedStatements: false });
    await waiter.inspect(key);
    const busy = new pg.Client({ connectionString: bounced.url });
    busy.on('error', () => undefined);
    await busy.connect();
    try {
      await busy.query('BEGIN');
      await busy.query('SELECT 1');
      const controller = new AbortController();
      const waiting = waiter.acquire(key, { ttl: '30s', signal: controller.signal });
      const settled = waiting.then(
        () => 'resolved',
        (error: unknown) => error,
      );
      for (let tries = 0; ; tries++) {
        const pool = (await bounced.bouncer.admin('SHOW POOLS')).find(
          (row) => row.database === 'leases',
        );
        if (Number(pool?.cl_waiting) >= 1) break;
        assert.ok(tries < 400, 'the attempt never queued in PgBouncer');
        await sleep(25);
      }
      const aborted = performance.now();
      controller.abort();
      const outcome = await Promise.race([settled, sleep(15_000, 'still running')]);
      assert.ok(
        outcome instanceof LeaseAbortedError,
        `the aborted attempt did not end: ${String(outcome)}`,
      );
      assert.ok(performance.now() - aborted < 10_000);
      // The server connection frees up: nothing of the attempt is left to run on it.
      await busy.query('COMMIT');
      await sleep(500);
      const { rows } = await direct.query(
        `SELECT pid FROM pg_stat_activity
          WHERE datname = current_database() AND wait_event_type = 'Lock'`,
      );
      assert.deepEqual(rows, [], 'the aborted statement reached the server');
      // The client goes on with a new connection.
      assert.equal((await waiter.inspect(key))?.epoch, holder.epoch);
    } finally {
      await busy.end().catch(() => undefined);
      await blocker.commit().catch(() => undefined);
      await blocker.close();
    }
    await holderClient.release(key, { owner: holder.owner, epoch: holder.epoch });
  });

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
