/**
 * Waiting for a key without a transaction (`acquire(key, { wait, signal })`): what the waiter
 * holds on the server while it waits, what wakes it, and what an abort leaves behind.
 */
import assert from 'node:assert/strict';
import { after, afterEach, before, beforeEach, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import {
  LeaseAbortedError,
  LeaseClient,
  LeaseTimeoutError,
  type LeaseClientOptions,
} from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { uniqueKey, waitFor } from '../support/helpers.js';
import { blockTakeovers } from '../support/lease-calls.js';

let db: TestDatabase;
let admin: LeaseClient;

before(async () => {
  db = await createTestDatabase();
  admin = new LeaseClient(db.pool);
});
after(() => db.close());

let clients = 0;
/** A client on a pool of its own, whose connections carry `application_name` = the returned name. */
function waiterClient(options: LeaseClientOptions = {}): {
  client: LeaseClient;
  pool: pg.Pool;
  app: string;
} {
  const app = `wait-test-${process.pid}-${++clients}`;
  const pool = new pg.Pool({ connectionString: db.url, application_name: app, max: 4 });
  pool.on('error', () => undefined);
  return { client: new LeaseClient(pool, options), pool, app };
}

interface Session {
  pid: number;
  state: string | null;
  query: string;
  inTransaction: boolean;
  /** When its transaction began (text, to compare exactly), or null. */
  xactStart: string | null;
  waitEventType: string | null;
}

async function sessionsOf(app: string): Promise<Session[]> {
  const { rows } = await db.pool.query<Session>(
    `SELECT pid, state, query, wait_event_type AS "waitEventType", xact_start::text AS "xactStart",
            (xact_start IS NOT NULL OR backend_xid IS NOT NULL) AS "inTransaction"
       FROM pg_stat_activity WHERE application_name = $1`,
    [app],
  );
  return rows;
}

/** Whether a waiter has marked the key watched: it listens, and sleeps between attempts. */
async function watched(key: string): Promise<boolean> {
  const { rows } = await db.pool.query<{ watched: boolean }>(
    'SELECT watched_until > now() AS watched FROM lease.leases WHERE key = $1',
    [key],
  );
  return rows[0]?.watched === true;
}

/** Resolves with how the promise settled, without letting a rejection go unhandled. */
function settle<T>(promise: Promise<T>): Promise<{ value?: T; error?: unknown }> {
  return promise.then(
    (value) => ({ value }),
    (error: unknown) => ({ error }),
  );
}

describe('acquire with wait, outside any transaction', { concurrency: true }, () => {
  test('a waiting acquire keeps no transaction open and runs no statement between attempts', async () => {
    const key = uniqueKey('wait-no-xact');
    const holder = (await admin.acquire(key, { ttl: '30s' }))!;
    const { client, pool, app } = waiterClient();
    try {
      const waiting = settle(client.acquire(key, { ttl: '30s', wait: '20s' }));
      await waitFor('the waiter is waiting', async () => (await sessionsOf(app)).length > 0);
      // Sample the waiter's connections for a while: an attempt may be caught in flight, and on
      // a loaded machine in two samples, but no one transaction may stay open through five
      // samples, 200 ms or more (a blocking SQL wait would stay open through all of them).
      let samples = 0;
      let seenBefore = new Map<string, number>();
      for (let i = 0; i < 20; i++) {
        const seen = new Map<string, number>();
        for (const s of await sessionsOf(app)) {
          if (!s.inTransaction) continue;
          const transaction = `${s.pid} ${s.xactStart}`;
          const times = (seenBefore.get(transaction) ?? 0) + 1;
          assert.ok(
            times < 5,
            `backend ${s.pid} kept one transaction open through ${times} samples`,
          );
          seen.set(transaction, times);
        }
        seenBefore = seen;
        samples++;
        await sleep(50);
      }
      assert.equal(samples, 20);
      assert.equal((await admin.inspect(key))?.owner, holder.owner);
      await holder.release();
      const { value: lease } = await waiting;
      assert.ok(lease, 'the waiter got the key after the release');
      assert.equal(lease.epoch, holder.epoch + 2n);
      await lease.release();
    } finally {
      await client.end();
      await pool.end();
    }
  });

  test('a release wakes the waiter by notification, without polling', async () => {
    const key = uniqueKey('wait-notify');
    // A poll interval of an hour: only a notification can wake the waiter in time.
    const { client, pool } = waiterClient({ notifications: true, pollInterval: '1 hour' });
    try {
      const holder = (await admin.acquire(key, { ttl: '1 hour' }))!;
      const waiting = settle(client.acquire(key, { ttl: '30s', wait: '30s' }));
      await sleep(300);
      const releasedAt = performance.now();
      await holder.release();
      const { value: lease, error } = await waiting;
      assert.ok(lease, `not granted: ${String(error)}`);
      assert.ok(performance.now() - releasedAt < 10_000, 'woken long after the release');
      await lease.release();
    } finally {
      await client.end();
      await pool.end();
    }
  });

  test('a lapsed lease is taken over at its expiry, by the server’s clock, not before', async () => {
    const key = uniqueKey('wait-lapse');
    const { client, pool } = waiterClient({ pollInterval: '1 hour' });
    try {
      const holder = (await admin.acquire(key, { ttl: '1500ms' }))!;
      const lease = await client.acquire(key, { ttl: '30s', wait: '20s' });
      assert.ok(lease);
      assert.equal(lease.epoch, holder.epoch + 1n);
      // expiresAt is server time: the grant came at or after the holder's expiry.
      const grantedAt = lease.expiresAt.getTime() - 30_000;
      assert.ok(
        grantedAt >= holder.expiresAt.getTime(),
        `granted at ${grantedAt}, before the expiry ${holder.expiresAt.getTime()}`,
      );
      await lease.release();
    } finally {
      await client.end();
      await pool.end();
    }
  });

  test('an observer sees a lapse at the holder’s expiry, without polling', async () => {
    const key = uniqueKey('observe-lapse');
    // Polling once an hour and no notifications: only the holder's expiry can wake it in time.
    const { client, pool } = waiterClient({ notifications: false, pollInterval: '1 hour' });
    const stop = new AbortController();
    try {
      const holder = (await admin.acquire(key, { ttl: '1500ms' }))!;
      const seen: (boolean | undefined)[] = [];
      const observing = (async () => {
        for await (const state of client.observe(key, { signal: stop.signal }))
          seen.push(state?.held);
      })();
      await waitFor('the holder is observed', () => seen.length === 1);
      assert.equal(seen[0], true);
      await waitFor('the lapse is observed', () => seen.length === 2, 15_000);
      assert.equal(seen[1], false);
      assert.ok(
        Date.now() >= holder.expiresAt.getTime() - 1000,
        'not observed long before the expiry',
      );
      stop.abort();
      await observing;
    } finally {
      stop.abort();
      await client.end();
      await pool.end();
    }
  });

  test('polling without notifications still gets a released key', async () => {
    const key = uniqueKey('wait-poll');
    const { client, pool, app } = waiterClient({ notifications: false, pollInterval: 20 });
    try {
      const holder = (await admin.acquire(key, { ttl: '1 hour' }))!;
      const waiting = settle(client.acquire(key, { ttl: '30s', wait: '30s' }));
      await sleep(200);
      assert.ok(
        (await sessionsOf(app)).every((s) => !/LISTEN/i.test(s.query)),
        'a polling client does not LISTEN',
      );
      await holder.release();
      const { value: lease } = await waiting;
      assert.ok(lease);
      await lease.release();
    } finally {
      await client.end();
      await pool.end();
    }
  });

  test('a wait that runs out rejects with LeaseTimeoutError and leaves the key alone', async () => {
    const key = uniqueKey('wait-timeout');
    const holder = (await admin.acquire(key, { ttl: '1 hour' }))!;
    const { client, pool } = waiterClient();
    try {
      // A second, not less: the first attempt must have answered (denied) by the deadline for
      // the detail to say held, and on a loaded machine a first connection can take a while.
      await assert.rejects(
        client.acquire(key, { ttl: '30s', wait: '1s' }),
        (error: unknown) =>
          error instanceof LeaseTimeoutError &&
          error.key === key &&
          /still held after waiting 1000 ms/.test(error.detail ?? ''),
      );
      const state = await admin.inspect(key);
      assert.deepEqual([state?.owner, state?.epoch], [holder.owner, holder.epoch]);
    } finally {
      await holder.release();
      await client.end();
      await pool.end();
    }
  });

  test('a wait that runs out while its attempt waits for another transaction’s row lock says the key was locked', async () => {
    const key = uniqueKey('wait-timeout-locked');
    const blocker = await db.pool.connect();
    const { client, pool } = waiterClient();
    try {
      // Another transaction inserts the key and does not commit: every attempt waits on it.
      await blocker.query('BEGIN');
      await blocker.query("SELECT lease.acquire($1, 'blocker', '1 hour')", [key]);
      await assert.rejects(
        client.acquire(key, { ttl: '30s', wait: '400ms' }),
        (error: unknown) =>
          error instanceof LeaseTimeoutError &&
          /still locked by another transaction after waiting 400 ms/.test(error.detail ?? ''),
      );
    } finally {
      await blocker.query('ROLLBACK');
      blocker.release();
      await client.end();
      await pool.end();
    }
    assert.equal(await admin.inspect(key), null, 'the waiter left nothing behind');
  });

  test('an aborted wait rejects with LeaseAbortedError at once, grants nothing and leaves no statement running', async () => {
    const key = uniqueKey('wait-abort');
    const holder = (await admin.acquire(key, { ttl: '1 hour' }))!;
    const { client, pool, app } = waiterClient();
    try {
      const controller = new AbortController();
      const waiting = settle(
        client.acquire(key, { ttl: '30s', wait: '1 min', signal: controller.signal }),
      );
      // Aborted while it sleeps, with nothing of its own in flight: the listening connection
      // is set up (its probe done) and the key watched.
      await waitFor('the waiter watches the key', () => watched(key));
      const reason = new Error('shutting down');
      controller.abort(reason);
      const abortedAt = performance.now();
      const { error } = await waiting;
      assert.ok(error instanceof LeaseAbortedError, `rejected with ${String(error)}`);
      assert.equal(error.cause, reason);
      assert.ok(performance.now() - abortedAt < 5_000, 'the abort took effect late');
      for (const session of await sessionsOf(app)) {
        assert.notEqual(session.state, 'active', `still running: ${session.query}`);
        assert.equal(session.inTransaction, false);
      }
      // Nothing was granted to the aborted waiter, also not once the key is released.
      await holder.release();
      await sleep(300);
      const state = await admin.inspect(key);
      assert.deepEqual([state?.held, state?.epoch], [false, holder.epoch + 1n]);
    } finally {
      await client.end();
      await pool.end();
    }
  });

  test('an abort cancels an attempt stuck behind another transaction’s row lock', async () => {
    const key = uniqueKey('wait-abort-locked');
    const holder = (await admin.acquire(key, { ttl: '1s' }))!;
    const { client, pool, app } = waiterClient();
    const blocker = await blockTakeovers(db.pool, key, holder);
    try {
      const controller = new AbortController();
      const waiting = settle(
        client.acquire(key, { ttl: '30s', wait: '1 min', signal: controller.signal }),
      );
      await waitFor('an attempt waits for the row lock', async () =>
        (await sessionsOf(app)).some(
          (s) => s.waitEventType === 'Lock' && /lease\.acquire/.test(s.query),
        ),
      );
      controller.abort();
      const { error } = await waiting;
      assert.ok(error instanceof LeaseAbortedError, `rejected with ${String(error)}`);
      await waitFor('no statement of the waiter is running', async () =>
        (await sessionsOf(app)).every((s) => s.state !== 'active'),
      );
      await blocker.commit();
      assert.equal((await admin.inspect(key))?.owner, holder.owner);
    } finally {
      await blocker.close();
      await holder.release();
      await client.end();
      await pool.end();
    }
  });

  test('a waiter does not queue behind the holder’s fenced transaction: it polls, then gets the key', async () => {
    const key = uniqueKey('wait-fenced');
    const holder = (await admin.acquire(key, { ttl: '1 hour' }))!;
    const fenced = await db.pool.connect();
    const { client, pool, app } = waiterClient({ pollInterval: 20 });
    try {
      // The holder's open fenced transaction keeps a share lock on the key's row.
      await fenced.query('BEGIN');
      await fenced.query('SELECT lease.fence($1, $2)', [key, holder.epoch.toString()]);
      const waiting = settle(client.acquire(key, { ttl: '30s', wait: '1 min' }));
      // Past the first attempts (and the watch that could not mark the locked row):
      await sleep(500);
      const blocked = await db.pool.query(
        `SELECT count(*)::int AS n FROM pg_stat_activity
          WHERE application_name = $1 AND wait_event_type = 'Lock'`,
        [app],
      );
      assert.equal(blocked.rows[0].n, 0, 'an attempt waited for the fenced transaction');
      await fenced.query('COMMIT');
      await holder.release();
      const { value, error } = await waiting;
      assert.ok(value, `the waiter got nothing: ${String(error)}`);
      assert.equal(value.epoch, holder.epoch + 2n);
      await value.release();
    } finally {
      await fenced.query('ROLLBACK').catch(() => undefined);
      fenced.release();
      await client.end();
      await pool.end();
    }
  });

  test('the waiters of one client share a single listening connection', async () => {
    const keys = [1, 2, 3, 4, 5].map(() => uniqueKey('wait-shared'));
    const holders = await Promise.all(keys.map((key) => admin.acquire(key, { ttl: '1 hour' })));
    const { client, pool, app } = waiterClient({ notifications: true });
    try {
      const waits = keys.map((key) => settle(client.acquire(key, { ttl: '30s', wait: '30s' })));
      await waitFor('a connection listens', async () =>
        (await sessionsOf(app)).some((s) => /^LISTEN/i.test(s.query)),
      );
      await sleep(200);
      assert.equal((await sessionsOf(app)).filter((s) => /^LISTEN/i.test(s.query)).length, 1);
      for (const holder of holders) await holder!.release();
      for (const { value } of await Promise.all(waits)) {
        assert.ok(value);
        await value.release();
      }
    } finally {
      await client.end();
      await pool.end();
    }
  });

  test('waiters of one key in one client are served in arrival order, one grant per release', async () => {
    const key = uniqueKey('wait-order');
    const first = (await admin.acquire(key, { ttl: '1 hour' }))!;
    const { client, pool } = waiterClient({ notifications: true });
    try {
      const order: number[] = [];
      const waits = [0, 1, 2].map(async (n) => {
        await sleep(n * 100);
        const lease = (await client.acquire(key, { ttl: '1 hour', wait: '30s' }))!;
        order.push(n);
        return lease;
      });
      await sleep(500);
      let current = first;
      for (let round = 0; round < 3; round++) {
        await current.release();
        await waitFor('the next waiter holds the key', () => order.length === round + 1);
        current = await waits[order[round]!]!;
      }
      await current.release();
      assert.deepEqual(order, [0, 1, 2]);
    } finally {
      await client.end();
      await pool.end();
    }
  });
});

describe('a wait cut off at its deadline by a stalled attempt', () => {
  // Each test has a database of its own: the table lock would stall other tests' calls.
  let own: TestDatabase;
  let pool: pg.Pool;
  let client: LeaseClient;
  let locker: pg.PoolClient;
  beforeEach(async () => {
    own = await createTestDatabase();
    pool = new pg.Pool({ connectionString: own.url, max: 4 });
    client = new LeaseClient(pool);
    locker = await own.pool.connect();
  });
  afterEach(async () => {
    await locker.query('ROLLBACK');
    locker.release();
    await client.end();
    await pool.end();
    await own.close();
  });
  /** A lock on the whole table, not on any key's row: every call waits until the rollback. */
  async function lockTable(): Promise<void> {
    await locker.query('BEGIN');
    await locker.query('LOCK TABLE lease.leases IN ACCESS EXCLUSIVE MODE');
  }

  test('when no attempt has answered, it says so and claims no row lock', async () => {
    const key = uniqueKey('wait-timeout-unanswered');
    await lockTable();
    await assert.rejects(
      client.acquire(key, { ttl: '30s', wait: '400ms' }),
      (error: unknown) =>
        error instanceof LeaseTimeoutError &&
        /no attempt had been answered after waiting 400 ms/.test(error.detail ?? ''),
    );
    await locker.query('ROLLBACK');
    assert.equal(await new LeaseClient(own.pool).inspect(key), null, 'the waiter left nothing');
  });

  test('when an earlier attempt found the key held, it says the key was still held', async () => {
    const key = uniqueKey('wait-timeout-stalled');
    const owner = new LeaseClient(own.pool);
    const holder = (await owner.acquire(key, { ttl: '700ms' }))!;
    const waiting = settle(client.acquire(key, { ttl: '30s', wait: '1500ms' }));
    // Denied and watching; its next attempt, at the holder's expiry, stalls on the table lock.
    await waitFor('the waiter watches the key', async () => {
      const { rows } = await own.pool.query<{ watched: boolean }>(
        'SELECT watched_until > now() AS watched FROM lease.leases WHERE key = $1',
        [key],
      );
      return rows[0]?.watched === true;
    });
    await lockTable();
    const { error } = await waiting;
    assert.ok(error instanceof LeaseTimeoutError, String(error));
    assert.match(error.detail ?? '', /still held after waiting 1500 ms/);
    await locker.query('ROLLBACK');
    assert.deepEqual((await owner.inspect(key))?.epoch, holder.epoch, 'nothing was granted');
  });
});
