import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import {
  ACQUIRE_TIMEOUT_MESSAGE,
  LeaseAbortedError,
  LeaseClient,
  LeaseError,
  LeaseReadOnlyError,
  LeaseTimeoutError,
  SQLSTATE,
} from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { uniqueKey, waitFor } from '../support/helpers.js';
import { blockTakeovers } from '../support/lease-calls.js';

let db: TestDatabase;
let client: LeaseClient;

before(async () => {
  db = await createTestDatabase();
  client = new LeaseClient(db.pool);
});
after(() => db.close());

/** The backend of a waiting acquire, as seen in pg_stat_activity, once it is running. */
async function waitingBackend(): Promise<number> {
  let pid: number | undefined;
  await waitFor('the acquire is running', async () => {
    const { rows } = await db.pool.query<{ pid: number }>(
      `SELECT pid FROM pg_stat_activity
        WHERE datname = current_database() AND state = 'active' AND wait_event_type = 'Lock'
          AND query LIKE '%lease.acquire%' AND pid <> pg_backend_pid()`,
    );
    pid = rows[0]?.pid;
    return pid !== undefined;
  });
  return pid!;
}

describe('errors', () => {
  test('a wait that runs out rejects with LeaseTimeoutError naming the key', async () => {
    const key = uniqueKey();
    const holder = (await client.acquire(key, { ttl: '30s' }))!;
    const error = await client.acquire(key, { ttl: '30s', wait: '300ms' }).then(
      () => assert.fail('acquired a held key'),
      (caught: unknown) => caught,
    );
    assert.ok(error instanceof LeaseTimeoutError);
    assert.ok(error instanceof LeaseError);
    assert.equal(error.name, 'LeaseTimeoutError');
    assert.equal(error.code, 'acquire_timeout');
    assert.equal(error.sqlState, SQLSTATE.QUERY_CANCELED);
    assert.equal(error.key, key);
    assert.ok(error.message.startsWith(ACQUIRE_TIMEOUT_MESSAGE));
    assert.match(error.detail ?? '', new RegExp(key));
    // The client's own deadline ended the wait (between attempts): no server error behind it.
    assert.equal(error.cause, undefined);
    assert.equal((await client.inspect(key))?.owner, holder.owner);
    await holder.release();
  });

  /**
   * An open transaction that renewed the key keeps its row locked: the waiter's next attempt
   * then runs, blocked, until something ends it.
   */
  test('a statement_timeout that stops an attempt is rethrown untouched, not taken for an acquire timeout', async () => {
    const key = uniqueKey();
    const holder = (await client.acquire(key, { ttl: '1s' }))!;
    const blocker = await blockTakeovers(db.pool, key, holder);
    const impatient = new pg.Pool({
      connectionString: db.url,
      options: '-c statement_timeout=300',
    });
    impatient.on('error', () => undefined);
    try {
      const error = await new LeaseClient(impatient).acquire(key, { ttl: '30s', wait: '10s' }).then(
        () => assert.fail('acquired a held key'),
        (caught: unknown) => caught,
      );
      assert.ok(error instanceof pg.DatabaseError);
      assert.ok(!(error instanceof LeaseError));
      assert.equal(error.code, SQLSTATE.QUERY_CANCELED);
      assert.match(error.message, /statement timeout/);
    } finally {
      await blocker.commit();
      await blocker.close();
      await impatient.end();
    }
    assert.equal((await client.inspect(key))?.owner, holder.owner);
    await holder.release();
  });

  test('an attempt cancelled from outside is rethrown untouched and leaves the key as it was', async () => {
    const key = uniqueKey();
    const holder = (await client.acquire(key, { ttl: '1s' }))!;
    const blocker = await blockTakeovers(db.pool, key, holder);
    try {
      const waiting = client.acquire(key, { ttl: '30s', wait: '20s' }).then(
        () => assert.fail('acquired a held key'),
        (caught: unknown) => caught,
      );
      const pid = await waitingBackend();
      await db.pool.query('SELECT pg_cancel_backend($1)', [pid]);
      const error = await waiting;
      assert.ok(error instanceof pg.DatabaseError);
      assert.ok(!(error instanceof LeaseError));
      assert.equal(error.code, SQLSTATE.QUERY_CANCELED);
      assert.match(error.message, /user request/);
    } finally {
      await blocker.commit();
      await blocker.close();
    }
    const state = await client.inspect(key);
    assert.equal(state?.owner, holder.owner);
    assert.equal(state?.epoch, holder.epoch);
    await holder.release();
  });

  test('errors the client does not know are rethrown untouched', async () => {
    const bare = await createTestDatabase({ extension: false });
    try {
      const error = await new LeaseClient(bare.pool).acquire(uniqueKey(), { ttl: '30s' }).then(
        () => assert.fail('acquired without pg_lease installed'),
        (caught: unknown) => caught,
      );
      assert.ok(error instanceof pg.DatabaseError);
      assert.ok(!(error instanceof LeaseError));
      assert.equal(error.code, '3F000'); // schema "lease" does not exist
    } finally {
      await bare.close();
    }
  });

  test('connection failures are rethrown untouched', async () => {
    const unreachable = new LeaseClient('postgresql://postgres@127.0.0.1:1/none');
    try {
      await assert.rejects(
        unreachable.inspect(uniqueKey()),
        (error: unknown) => error instanceof Error && !(error instanceof LeaseError),
      );
    } finally {
      await unreachable.end();
    }
  });

  test('a writing call in a read-only session rejects with LeaseReadOnlyError naming the primary', async () => {
    const key = uniqueKey();
    const readOnly = new pg.Pool({
      connectionString: db.url,
      options: '-c default_transaction_read_only=on',
      max: 1,
    });
    try {
      const leases = new LeaseClient(readOnly);
      const error = await leases.acquire(key, { ttl: '30s' }).then(
        () => assert.fail('acquired in a read-only session'),
        (caught: unknown) => caught,
      );
      assert.ok(error instanceof LeaseReadOnlyError);
      assert.equal(error.code, 'read_only');
      assert.equal(error.sqlState, SQLSTATE.READ_ONLY_SQL_TRANSACTION);
      assert.match(error.message, /hot standby/);
      assert.match(error.message, /primary/);
      assert.equal((error.cause as pg.DatabaseError).code, '25006');
      await assert.rejects(
        leases.renew(key, { owner: 'o', epoch: 1n, ttl: '30s' }),
        LeaseReadOnlyError,
      );
      await assert.rejects(leases.release(key, { owner: 'o', epoch: 1n }), LeaseReadOnlyError);
      assert.equal(await leases.inspect(key), null);
    } finally {
      await readOnly.end();
    }
  });
});

describe('the error table of docs/client.md', () => {
  test('lists every error class the package exports, and only those', async () => {
    const api = await import('../../src/index.js');
    const exported = Object.entries(api)
      .filter(([, value]) => typeof value === 'function' && value.prototype instanceof Error)
      .map(([name]) => name)
      .sort();
    const doc = readFileSync(new URL('../../../docs/client.md', import.meta.url), 'utf8');
    const table = doc.slice(doc.indexOf('\n## Errors\n'));
    const listed = [...table.matchAll(/^\| `(\w+Error)` \|/gm)].map((match) => match[1]!).sort();
    assert.ok(exported.length >= 9, exported.join());
    assert.deepEqual(listed, exported);
  });
});

describe('an acquire aborted before it starts', () => {
  test('says the acquire was aborted, not that a wait was, and sends nothing', async () => {
    const key = uniqueKey();
    const error = await client
      .acquire(key, { ttl: '30s', signal: AbortSignal.abort('stop') })
      .catch((e: unknown) => e);
    assert.ok(error instanceof LeaseAbortedError, String(error));
    assert.equal(error.message, `pg_lease: the acquire of ${JSON.stringify(key)} was aborted`);
    assert.equal(error.cause, 'stop');
    assert.equal(await client.inspect(key), null);
  });
});

describe('an abort while the call waits for a pool connection', () => {
  test('sends nothing: the attempt rejects at once, not after a row lock it would have queued on', async () => {
    const key = uniqueKey();
    const holder = (await client.acquire(key, { ttl: '1s' }))!;
    const blocker = await blockTakeovers(db.pool, key, holder);
    // A pool of one, its connection in use: the acquire waits for the pool, and the signal
    // aborts meanwhile. Sent after that, it would wait for the blocker's row lock, and a cancel
    // request made before it started would not reach it.
    const small = new pg.Pool({ connectionString: db.url, max: 1 });
    small.on('error', () => undefined);
    const busy = await small.connect();
    try {
      const controller = new AbortController();
      const waiting = new LeaseClient(small)
        .acquire(key, { ttl: '30s', signal: controller.signal })
        .catch((e: unknown) => e);
      await new Promise((resolve) => setTimeout(resolve, 100));
      controller.abort('stop');
      busy.release();
      const outcome = await Promise.race([
        waiting,
        new Promise((resolve) => setTimeout(() => resolve('still waiting after 10 s'), 10_000)),
      ]);
      assert.ok(outcome instanceof LeaseAbortedError, String(outcome));
      const { rows } = await db.pool.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM pg_stat_activity
          WHERE datname = current_database() AND query LIKE '%lease.acquire%' AND state = 'active'
            AND pid <> pg_backend_pid()`,
      );
      assert.equal(rows[0]!.n, 0, 'an acquire is still running on the server');
    } finally {
      await blocker.close();
      await small.end();
    }
  });
});
