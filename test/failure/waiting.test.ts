/**
 * Failure model, interrupted waits: a blocking acquire that is cancelled, runs into
 * statement_timeout, runs out of wait or loses its backend must leave nothing behind: no
 * state change, no open transaction, no lock, and the holder's own calls go straight through.
 * The checks use distinct keys and run in parallel in one database of the shared cluster.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type pg from 'pg';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import {
  acquireTimed as acquire,
  inspect,
  releaseTimed as release,
  renew,
  type TimedAcquired,
} from '../support/lease-calls.js';
import {
  assertNothingLeftBehind,
  backendPid,
  connect,
  disconnect,
  rejectsSomehow,
  rejectsWithCode,
  waitUntilBackendGone,
  waitUntilWaiting,
} from './support/sessions.js';

const QUERY_CANCELED = '57014';
const ADMIN_SHUTDOWN = '57P01';

describe('interrupted blocking acquire', { concurrency: true }, () => {
  let database: TestDatabase;
  before(async () => {
    database = await createTestDatabase();
  });
  after(() => database?.close());

  /**
   * Runs `interrupt` against a waiter blocked on a key held by someone else, then checks that
   * the key is exactly as before and that the holder can still renew and release at once.
   */
  async function interruptWait(
    key: string,
    interrupt: (
      waiter: pg.Client,
      waiterPid: number,
      waiting: Promise<TimedAcquired>,
    ) => Promise<void>,
    options: { wait?: string; setup?: (waiter: pg.Client) => Promise<void> } = {},
  ): Promise<void> {
    const { pool } = database;
    const holder = await connect(database.url);
    const waiter = await connect(database.url);
    try {
      // The holder's calls must never wait for the waiter: a lock_timeout turns a row lock
      // taken (or left behind) by the waiter into an error instead of a delay.
      await holder.query("SET lock_timeout = '300ms'");
      const grant = await acquire(holder, key, 'holder', '60 seconds');
      await options.setup?.(waiter);
      const waiterPid = await backendPid(waiter);
      const waiting = acquire(waiter, key, 'waiter', '60 seconds', options.wait ?? '60 seconds');
      waiting.catch(() => undefined);

      // While it waits, the waiter must not stand in the holder's way.
      await waitUntilWaiting(pool, waiterPid);
      assert.equal((await renew(holder, key, 'holder', grant.epoch!, '60 seconds')).status, 'ok');
      const before = await inspect(pool, key);

      await interrupt(waiter, waiterPid, waiting);

      assert.deepEqual(await inspect(pool, key), before);
      assert.equal((await renew(holder, key, 'holder', grant.epoch!, '60 seconds')).status, 'ok');
      assert.equal((await release(holder, key, 'holder', grant.epoch!)).status, 'ok');
      assert.equal((await acquire(pool, key, 'next', '1 second')).epoch, grant.epoch! + 2n);
    } finally {
      await disconnect(holder, waiter);
    }
  }

  test('a blocking acquire cancelled by pg_cancel_backend changes nothing and leaves no transaction or lock', async () => {
    const { pool } = database;
    await interruptWait('wait/cancelled', async (waiter, waiterPid, waiting) => {
      await waitUntilWaiting(pool, waiterPid);
      await pool.query('SELECT pg_cancel_backend($1)', [waiterPid]);
      await rejectsWithCode(waiting, QUERY_CANCELED, /user request/);
      await assertNothingLeftBehind(pool, waiterPid, { gone: false });
      // The session itself is fine: it can go on using leases.
      assert.equal((await acquire(waiter, 'wait/cancelled', 'waiter', '1 second')).acquired, false);
    });
  });

  test('a blocking acquire stopped by statement_timeout changes nothing and leaves no transaction or lock', async () => {
    const { pool } = database;
    await interruptWait(
      'wait/statement-timeout',
      async (_waiter, waiterPid, waiting) => {
        await rejectsWithCode(waiting, QUERY_CANCELED, /statement timeout/);
        await assertNothingLeftBehind(pool, waiterPid, { gone: false });
      },
      { setup: (waiter) => waiter.query("SET statement_timeout = '1500ms'").then(() => undefined) },
    );
  });

  test('a blocking acquire that runs out of wait changes nothing and leaves no transaction or lock', async () => {
    const { pool } = database;
    await interruptWait(
      'wait/timed-out',
      async (_waiter, waiterPid, waiting) => {
        await rejectsWithCode(waiting, QUERY_CANCELED, /^pg_lease: acquire timed out/);
        await assertNothingLeftBehind(pool, waiterPid, { gone: false });
      },
      { wait: '1500 milliseconds' },
    );
  });

  test('a blocking acquire cancelled inside a transaction undoes that transaction’s other grants once rolled back', async () => {
    const { pool } = database;
    await interruptWait(
      'wait/cancelled-in-transaction',
      async (waiter, waiterPid, waiting) => {
        await waitUntilWaiting(pool, waiterPid);
        await pool.query('SELECT pg_cancel_backend($1)', [waiterPid]);
        await rejectsWithCode(waiting, QUERY_CANCELED);
        await waiter.query('ROLLBACK');
        await assertNothingLeftBehind(pool, waiterPid, { gone: false });
        assert.equal(await inspect(pool, 'wait/cancelled-in-transaction/other'), undefined);
      },
      {
        setup: async (waiter) => {
          await waiter.query('BEGIN');
          const other = await acquire(
            waiter,
            'wait/cancelled-in-transaction/other',
            'waiter',
            '60 seconds',
          );
          assert.equal(other.acquired, true);
        },
      },
    );
  });

  test('a blocking acquire cancelled while another transaction holds the key’s row lock leaves nothing behind', async () => {
    const { pool } = database;
    const key = 'wait/cancelled-behind-row-lock';
    const holder = await connect(database.url);
    const waiter = await connect(database.url);
    try {
      const grant = await acquire(holder, key, 'holder', '60 seconds');
      // The holder renews inside a transaction it keeps open: the row stays locked.
      await holder.query('BEGIN');
      assert.equal((await renew(holder, key, 'holder', grant.epoch!, '60 seconds')).status, 'ok');
      const waiterPid = await backendPid(waiter);
      const waiting = acquire(waiter, key, 'waiter', '60 seconds', '60 seconds');
      waiting.catch(() => undefined);
      await waitUntilWaiting(pool, waiterPid);
      await pool.query('SELECT pg_cancel_backend($1)', [waiterPid]);
      await rejectsWithCode(waiting, QUERY_CANCELED);
      await assertNothingLeftBehind(pool, waiterPid, { gone: false });
      await holder.query('COMMIT');
      const state = await inspect(pool, key);
      assert.deepEqual([state?.owner, state?.epoch], ['holder', grant.epoch]);
    } finally {
      await disconnect(holder, waiter);
    }
  });

  test('a blocking acquire whose backend is terminated mid-wait leaves nothing behind', async () => {
    const { pool } = database;
    await interruptWait('wait/terminated', async (waiter, waiterPid, waiting) => {
      await waitUntilWaiting(pool, waiterPid);
      await pool.query('SELECT pg_terminate_backend($1)', [waiterPid]);
      const error = await rejectsSomehow(waiting);
      assert.ok(
        (error as { code?: string }).code === ADMIN_SHUTDOWN || /terminat/i.test(error.message),
        `unexpected error: ${error.message}`,
      );
      await waitUntilBackendGone(pool, waiterPid);
      await assertNothingLeftBehind(pool, waiterPid, { gone: true });
      await rejectsSomehow(waiter.query('SELECT 1'));
    });
  });
});
