/**
 * A server restart (`pg_ctl restart`: a fast shutdown, which terminates every session with
 * 57P01, then a start) under each documented way of connecting a LeaseClient, on a cluster of
 * this file's own. The process must survive it, and where the client can reconnect (a pool,
 * the user's or its own) a keep-alive handle must keep its lease under the same epoch.
 *
 * The pools here get no `error` listener of the test's: the README's setup
 * `new LeaseClient(new pg.Pool({ connectionString }))` has none either.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import {
  LeaseClient,
  LeaseLostError,
  subscribeLeaseEvents,
  type ConnectionErrorEvent,
  type RenewalFailedEvent,
} from '../../src/index.js';
import { PgCluster } from 'pg-lease-testing';
import { abortReason, assertRodeOut, uniqueKey, waitFor } from '../support/helpers.js';

let cluster: PgCluster;
let url: string;

before(async () => {
  cluster = await PgCluster.start();
  url = await cluster.createDatabase();
});
after(async () => {
  await cluster.destroy();
});

/**
 * Runs `run`, failing the test if the process saw an uncaught exception meanwhile (which
 * would have ended a process of its own), and gives it the client's events.
 */
async function recording<T>(
  run: (events: { connection: ConnectionErrorEvent[]; failed: RenewalFailedEvent[] }) => Promise<T>,
): Promise<T> {
  const events = { connection: [] as ConnectionErrorEvent[], failed: [] as RenewalFailedEvent[] };
  const unsubscribe = subscribeLeaseEvents({
    connectionError: (event) => events.connection.push(event),
    renewalFailed: (event) => events.failed.push(event),
  });
  const uncaught: unknown[] = [];
  const monitor = (error: unknown) => uncaught.push(error);
  process.on('uncaughtExceptionMonitor', monitor);
  try {
    const result = await run(events);
    assert.deepEqual(uncaught, [], 'an uncaught exception would have ended the process');
    return result;
  } finally {
    process.off('uncaughtExceptionMonitor', monitor);
    unsubscribe();
  }
}

/**
 * Holds a keep-alive lease (and has a second owner waiting for it, so that the listening
 * connection is open too) across a restart; checks the lease is still held under its epoch.
 */
async function ridesOutRestart(client: LeaseClient): Promise<void> {
  const key = uniqueKey('restart');
  // The restart takes a second or two; the ttl leaves room for several retries after it.
  const lease = (await client.acquire(key, { ttl: '15s', keepAlive: true }))!;
  assert.ok(lease);
  const stopWaiting = new AbortController();
  const waiter = client
    .acquire(key, { ttl: '15s', wait: '1 min', signal: stopWaiting.signal })
    .then(
      (granted) => assert.fail(`the waiter was granted epoch ${granted?.epoch}`),
      (error: unknown) => error,
    );
  // Restart once the waiter listens and sleeps: its watching attempt's connection back in the
  // pool, idle, and the listening connection idle too.
  await waitFor('the waiter listens and sleeps', async () => {
    const { rows } = await cluster.query<{ query: string }>(
      `SELECT query FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle'`,
      [],
      new URL(url).pathname.slice(1),
    );
    return (
      rows.some((row) => row.query.startsWith('LISTEN')) &&
      rows.some((row) => row.query.includes('lease.watch'))
    );
  });
  // A fenced transaction is open, its callback busy with something else, during the restart.
  let restarted!: () => void;
  const afterRestart = new Promise<void>((resolve) => (restarted = resolve));
  let fenceOpen!: () => void;
  const fenceIsOpen = new Promise<void>((resolve) => (fenceOpen = resolve));
  const fenced = client
    .fenced(lease, async (tx) => {
      await tx.query('SELECT 1');
      fenceOpen();
      await afterRestart;
      await tx.query('SELECT 1');
    })
    .then(
      () => assert.fail('a transaction survived the restart'),
      (error: unknown) => error,
    );
  await fenceIsOpen;
  const before = lease.expiresAt.getTime();
  await cluster.restart();
  restarted();
  assert.ok((await fenced) instanceof Error);
  await assertRodeOut(client, lease, before);
  stopWaiting.abort();
  await waiter;
  assert.equal(await lease.release(), 'ok');
}

describe('a server restart', () => {
  test('a pg.Pool given without an error listener: the process survives and the lease is kept', async () => {
    const pool = new pg.Pool({ connectionString: url, connectionTimeoutMillis: 2_000 });
    const client = new LeaseClient(pool);
    try {
      await recording(async (events) => {
        await ridesOutRestart(client);
        // The idle connections the shutdown terminated were reported, not thrown.
        assert.ok(
          events.connection.some((e) => (e.error as { code?: unknown }).code === '57P01'),
          `connection errors: ${events.connection.map((e) => String(e.error)).join('; ')}`,
        );
      });
      assert.equal(pool.listenerCount('error'), 1, 'the client listens for its errors');
    } finally {
      await client.end();
      await pool.end();
    }
    // The pool is the user's again: the client took its listener away.
    assert.equal(pool.listenerCount('error'), 0);
  });

  test('a connection string: the process survives and the lease is kept', async () => {
    const client = new LeaseClient(url);
    try {
      await recording(() => ridesOutRestart(client));
    } finally {
      await client.end();
    }
  });

  test('a dedicated pg.Client (with its error listener, as documented) cannot reconnect: the process survives and the lease is lost by its deadline', async () => {
    const connection = new pg.Client({ connectionString: url });
    const errors: unknown[] = [];
    connection.on('error', (error) => errors.push(error));
    await connection.connect();
    const client = new LeaseClient(connection);
    try {
      await recording(async (events) => {
        const lease = (await client.acquire(uniqueKey('restart-client'), {
          ttl: '4s',
          keepAlive: true,
        }))!;
        await cluster.restart();
        const reason = await abortReason(lease.signal, 30_000);
        assert.ok(reason instanceof LeaseLostError, String(reason));
        assert.equal(reason.status, 'expired');
        assert.ok(events.failed.length > 0, 'no renewal failed');
        assert.ok(errors.length > 0, 'the connection reported no error');
        await lease.release().catch(() => undefined);
      });
    } finally {
      await client.end();
      await connection.end().catch(() => undefined);
    }
  });
});
