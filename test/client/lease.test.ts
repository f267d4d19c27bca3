import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import {
  LeaseClient,
  LeaseError,
  LeaseLostError,
  LeaseNotAcquiredError,
  type Lease,
} from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { uniqueKey } from '../support/helpers.js';

let db: TestDatabase;
let client: LeaseClient;

before(async () => {
  db = await createTestDatabase();
  client = new LeaseClient(db.pool);
});
after(() => db.close());

describe('acquire', () => {
  test('grants a free key with epoch 1 and reports it in inspect', async () => {
    const key = uniqueKey();
    const lease = await client.acquire(key, { ttl: '30s', owner: 'worker-a' });
    assert.ok(lease);
    assert.equal(lease.key, key);
    assert.equal(lease.owner, 'worker-a');
    assert.equal(lease.epoch, 1n);
    assert.equal(typeof lease.epoch, 'bigint');
    assert.ok(lease.expiresAt instanceof Date);
    assert.equal(lease.signal.aborted, false);
    const state = await client.inspect(key);
    assert.deepEqual(state, {
      held: true,
      owner: 'worker-a',
      epoch: 1n,
      expiresAt: lease.expiresAt,
    });
    await lease.release();
  });

  test('returns null while another owner holds the key', async () => {
    const key = uniqueKey();
    const holder = await client.acquire(key, { ttl: '30s' });
    assert.ok(holder);
    assert.equal(await client.acquire(key, { ttl: '30s' }), null);
    await holder.release();
  });

  test('gives every acquire its own default owner, so one process cannot take a key twice', async () => {
    const key = uniqueKey();
    const [first, second] = await Promise.all([
      client.acquire(key, { ttl: '30s' }),
      client.acquire(key, { ttl: '30s' }),
    ]);
    assert.equal([first, second].filter(Boolean).length, 1);
    const lease = (first ?? second)!;
    assert.match(lease.owner, /^.+:\d+:[0-9a-f]{8}$/);
    await lease.release();
  });

  test('exactly one of many concurrent acquirers wins', async () => {
    const key = uniqueKey();
    const results = await Promise.all(
      Array.from({ length: 10 }, (_, i) => client.acquire(key, { ttl: '30s', owner: `w${i}` })),
    );
    const winners = results.filter((lease): lease is Lease => lease !== null);
    assert.equal(winners.length, 1);
    await winners[0]!.release();
  });

  test('a same-owner acquire returns the live grant unchanged (same epoch and expiry)', async () => {
    const key = uniqueKey();
    const sameOwner = new LeaseClient(db.pool, { owner: 'fixed-owner' });
    const first = (await sameOwner.acquire(key, { ttl: '30s' }))!;
    const again = (await sameOwner.acquire(key, { ttl: '5 min' }))!;
    assert.equal(again.epoch, first.epoch);
    assert.equal(again.expiresAt.getTime(), first.expiresAt.getTime());
    await first.release();
  });

  test('after release the next grant carries a greater epoch', async () => {
    const key = uniqueKey();
    const first = (await client.acquire(key, { ttl: '30s' }))!;
    assert.equal(await first.release(), 'ok');
    const state = await client.inspect(key);
    assert.deepEqual(state, { held: false, owner: null, epoch: 2n, expiresAt: null });
    const second = (await client.acquire(key, { ttl: '30s' }))!;
    assert.equal(second.epoch, 3n);
    await second.release();
  });

  test('keeps epochs beyond 2^53 exact, as bigint, through acquire, renew and release', async () => {
    const key = uniqueKey();
    const first = (await client.acquire(key, { ttl: '30s' }))!;
    await first.release();
    // Only the superuser can touch the internal table: set the counter near the bigint limit.
    await db.pool.query('UPDATE lease.leases SET epoch = $2 WHERE key = $1', [
      key,
      '9007199254740993',
    ]);
    const lease = (await client.acquire(key, { ttl: '30s' }))!;
    assert.equal(lease.epoch, 9007199254740994n);
    await lease.renew();
    const state = await client.inspect(key);
    assert.equal(state?.epoch, 9007199254740994n);
    assert.equal(await lease.release(), 'ok');
  });

  test('sends the ttl as exact time: one month is 30 days of 24 hours, not a calendar month', async () => {
    const key = uniqueKey();
    const lease = (await client.acquire(key, { ttl: '1 mon' }))!;
    const { rows } = await db.pool.query<{ seconds: number }>(
      `SELECT date_part('epoch', expires_at - clock_timestamp()) AS seconds
         FROM lease.leases WHERE key = $1`,
      [key],
    );
    const expected = 30 * 24 * 3600;
    assert.ok(Math.abs(rows[0]!.seconds - expected) < 60, `${rows[0]!.seconds} s`);
    await lease.release();
  });

  test('accepts milliseconds and interval text alike', async () => {
    const key = uniqueKey();
    const lease = (await client.acquire(key, { ttl: 90_000 }))!;
    const { rows } = await db.pool.query<{ seconds: number }>(
      `SELECT date_part('epoch', expires_at - clock_timestamp()) AS seconds
         FROM lease.leases WHERE key = $1`,
      [key],
    );
    assert.ok(rows[0]!.seconds > 60 && rows[0]!.seconds <= 90, `${rows[0]!.seconds} s`);
    await lease.renew('PT2M');
    const renewed = await db.pool.query<{ seconds: number }>(
      `SELECT date_part('epoch', expires_at - clock_timestamp()) AS seconds
         FROM lease.leases WHERE key = $1`,
      [key],
    );
    assert.ok(renewed.rows[0]!.seconds > 90 && renewed.rows[0]!.seconds <= 120);
    await lease.release();
  });
});

describe('renew and release on a handle', () => {
  test('renew extends the expiry and keeps the epoch', async () => {
    const key = uniqueKey();
    const lease = (await client.acquire(key, { ttl: '10s' }))!;
    const before = lease.expiresAt;
    const expiresAt = await lease.renew('1 min');
    assert.ok(expiresAt.getTime() > before.getTime());
    assert.equal(lease.expiresAt, expiresAt);
    const state = await client.inspect(key);
    assert.equal(state?.epoch, lease.epoch);
    assert.equal(state?.expiresAt?.getTime(), expiresAt.getTime());
    await lease.release();
  });

  test('release aborts the signal with lease_released and is idempotent', async () => {
    const key = uniqueKey();
    const lease = (await client.acquire(key, { ttl: '30s' }))!;
    assert.equal(await lease.release(), 'ok');
    assert.equal(lease.signal.aborted, true);
    const reason = lease.signal.reason as LeaseError;
    assert.ok(reason instanceof LeaseError);
    assert.equal(reason.code, 'lease_released');
    assert.equal(lease.lost, undefined);
    assert.equal(await lease.release(), 'ok');
    assert.equal((await client.inspect(key))?.epoch, lease.epoch + 1n);
  });

  test('a signal read before the end aborts with it, and one first read after it is born aborted', async () => {
    const early = (await client.acquire(uniqueKey(), { ttl: '30s' }))!;
    const signal = early.signal;
    const events: unknown[] = [];
    signal.addEventListener('abort', () => events.push(signal.reason));
    assert.equal(signal.aborted, false);
    await early.release();
    assert.equal(events.length, 1);
    assert.equal((events[0] as LeaseError).code, 'lease_released');
    assert.equal(early.signal, signal);

    const late = (await client.acquire(uniqueKey(), { ttl: '30s' }))!;
    await late.release();
    assert.equal(late.signal.aborted, true);
    assert.equal((late.signal.reason as LeaseError).code, 'lease_released');
    assert.equal(late.remainingMs(), 0);
  });

  test('renew after release rejects without calling the server', async () => {
    const key = uniqueKey();
    const lease = (await client.acquire(key, { ttl: '30s' }))!;
    await lease.release();
    const other = (await client.acquire(key, { ttl: '30s' }))!;
    await assert.rejects(lease.renew(), (error: LeaseError) => error.code === 'lease_released');
    // Thrown, the release reason carries a stack of the call that hit it.
    const thrown = (await lease.renew().then(
      () => undefined,
      (error: unknown) => error,
    )) as LeaseError;
    assert.match(thrown.stack ?? '', /\n\s+at /);
    await other.release();
  });

  test('expiresAt is the server expiry truncated to the millisecond, also centuries ahead', async () => {
    for (const ttl of ['30s', '490 years', '999 years']) {
      const key = uniqueKey();
      const lease = (await client.acquire(key, { ttl }))!;
      const { rows } = await db.pool.query<{ ms: string }>(
        `SELECT (trunc(EXTRACT(EPOCH FROM expires_at) * 1000))::text AS ms
           FROM lease.leases WHERE key = $1`,
        [key],
      );
      assert.equal(String(lease.expiresAt.getTime()), rows[0]!.ms, ttl);
      await lease.release();
    }
  });

  test('renew after another owner took over reports not_owner and loses the handle', async () => {
    const key = uniqueKey();
    const lease = (await client.acquire(key, { ttl: '30s', owner: 'old' }))!;
    assert.equal(await client.release(key, { owner: 'old', epoch: lease.epoch }), 'ok');
    const taker = (await client.acquire(key, { ttl: '30s', owner: 'new' }))!;
    await assert.rejects(
      lease.renew(),
      (error: unknown) => error instanceof LeaseLostError && error.status === 'not_owner',
    );
    assert.equal(lease.lost?.status, 'not_owner');
    assert.equal(lease.lost?.epoch, lease.epoch);
    assert.equal(await lease.release(), 'not_owner');
    assert.equal((await client.inspect(key))?.owner, 'new');
    await taker.release();
  });

  test('await using releases the lease at the end of the block', async () => {
    const key = uniqueKey();
    {
      await using lease = await client.acquire(key, { ttl: '30s' });
      assert.equal((await client.inspect(key))?.held, true);
      assert.ok(lease);
    }
    assert.deepEqual(await client.inspect(key), {
      held: false,
      owner: null,
      epoch: 2n,
      expiresAt: null,
    });
  });
});

describe('handle-less calls', () => {
  test('renew and release by key, owner and epoch report every status in contract order', async () => {
    const key = uniqueKey();
    assert.deepEqual(await client.renew(key, { owner: 'a', epoch: 1n, ttl: '1s' }), {
      status: 'not_owner',
      expiresAt: null,
    });
    const lease = (await client.acquire(key, { ttl: '30s', owner: 'a' }))!;
    const wrongEpoch = await client.renew(key, { owner: 'a', epoch: lease.epoch + 5n, ttl: '1s' });
    assert.deepEqual(wrongEpoch, { status: 'epoch_mismatch', expiresAt: null });
    const ok = await client.renew(key, { owner: 'a', epoch: lease.epoch, ttl: '1 ms' });
    assert.equal(ok.status, 'ok');
    assert.ok(ok.expiresAt instanceof Date);
    await new Promise((resolve) => setTimeout(resolve, 50)); // let the 1 ms grant lapse
    assert.equal(await client.release(key, { owner: 'a', epoch: lease.epoch }), 'lapsed');
    assert.equal(await client.release(key, { owner: 'b', epoch: lease.epoch }), 'not_owner');
  });

  test('inspect returns null for a key never leased', async () => {
    assert.equal(await client.inspect(uniqueKey('never')), null);
  });
});

describe('withLease', () => {
  test('runs the callback holding the lease, returns its result and releases', async () => {
    const key = uniqueKey();
    const result = await client.withLease(key, { ttl: '30s' }, async (lease, signal) => {
      assert.equal(signal, lease.signal);
      const state = await client.inspect(key);
      assert.equal(state?.owner, lease.owner);
      return lease.epoch;
    });
    assert.equal(result, 1n);
    assert.deepEqual(await client.inspect(key), {
      held: false,
      owner: null,
      epoch: 2n,
      expiresAt: null,
    });
  });

  test('rejects with LeaseNotAcquiredError when the key is held, without running the callback', async () => {
    const key = uniqueKey();
    const holder = (await client.acquire(key, { ttl: '30s' }))!;
    let ran = false;
    await assert.rejects(
      client.withLease(key, { ttl: '30s' }, () => {
        ran = true;
      }),
      (error: unknown) =>
        error instanceof LeaseNotAcquiredError &&
        error.code === 'not_acquired' &&
        error.key === key,
    );
    assert.equal(ran, false);
    await holder.release();
  });

  test("passes the callback's error through and still releases", async () => {
    const key = uniqueKey();
    const failure = new Error('job failed');
    await assert.rejects(
      client.withLease(key, { ttl: '30s' }, async () => {
        throw failure;
      }),
      (error: unknown) => error === failure,
    );
    assert.equal((await client.inspect(key))?.held, false);
  });

  test('aborts the callback signal on loss and rejects with the loss after the callback', async () => {
    const key = uniqueKey();
    const outcome = client.withLease(key, { ttl: '3s', owner: 'runner' }, async (lease, signal) => {
      // An operator frees the key and someone else takes it: the next renewal says not_owner.
      await client.release(key, { owner: 'runner', epoch: lease.epoch });
      await client.acquire(key, { ttl: '30s', owner: 'intruder' });
      await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
      return 'finished anyway';
    });
    await assert.rejects(
      outcome,
      (error: unknown) => error instanceof LeaseLostError && error.status === 'not_owner',
    );
    assert.equal((await client.inspect(key))?.owner, 'intruder');
  });
});

describe('connections and transactions', () => {
  test('a dedicated client inside a transaction block is refused with in_transaction', async () => {
    const connection = new pg.Client({ connectionString: db.url });
    connection.on('error', () => undefined);
    await connection.connect();
    try {
      const dedicated = new LeaseClient(connection);
      const key = uniqueKey();
      await connection.query('BEGIN');
      await assert.rejects(
        dedicated.acquire(key, { ttl: '30s' }),
        (error: unknown) => error instanceof LeaseError && error.code === 'in_transaction',
      );
      await connection.query('ROLLBACK');
      const lease = (await dedicated.acquire(key, { ttl: '30s' }))!;
      assert.equal(lease.epoch, 1n);
      // Committed on its own: visible from another connection straight away.
      assert.equal((await client.inspect(key))?.held, true);
      await lease.release();
    } finally {
      await connection.end();
    }
  });

  /** A dedicated connection, ended after `fn`. */
  async function onDedicated(fn: (connection: pg.Client) => Promise<void>): Promise<void> {
    const connection = new pg.Client({ connectionString: db.url });
    connection.on('error', () => undefined);
    await connection.connect();
    try {
      await fn(connection);
    } finally {
      await connection.end();
    }
  }

  /** Milliseconds the server still grants the key, by its own clock. */
  async function serverRemainingMs(key: string): Promise<number> {
    const { rows } = await db.pool.query<{ ms: number }>(
      `SELECT extract(epoch FROM expires_at - clock_timestamp()) * 1000 AS ms
         FROM lease.leases WHERE key = $1`,
      [key],
    );
    return Number(rows[0]!.ms);
  }

  test('a renew that ran inside a fenced transaction rolled back does not move the deadline', async () => {
    await onDedicated(async (connection) => {
      const dedicated = new LeaseClient(connection);
      const key = uniqueKey();
      const lease = (await dedicated.acquire(key, { ttl: '3s' }))!;
      // The fenced transaction's BEGIN is queued first; the renew passes the idle check and
      // runs after it, inside the transaction, which the callback's error rolls back.
      const fenced = dedicated.fenced(lease, () => {
        throw new Error('the business write failed');
      });
      const renewed = lease.renew('10s').then(
        () => 'renewed',
        (error: unknown) => error,
      );
      await assert.rejects(fenced, /the business write failed/);
      const outcome = await renewed;
      const server = await serverRemainingMs(key);
      // The handle never claims more than the server grants (allowing for this query's time).
      assert.ok(
        lease.remainingMs() <= server + 50,
        `the handle says ${lease.remainingMs().toFixed(0)} ms, the server ${server.toFixed(0)} ms (${String(outcome)})`,
      );
      if (outcome !== 'renewed') {
        assert.ok(
          outcome instanceof LeaseError && outcome.code === 'in_transaction',
          String(outcome),
        );
        assert.ok(server < 3_000, `${server} ms`);
      }
      await lease.release();
    });
  });

  test('keep-alive on a dedicated client rides out a transaction block the application keeps open', async () => {
    await onDedicated(async (connection) => {
      const dedicated = new LeaseClient(connection);
      const key = uniqueKey();
      const lease = (await dedicated.acquire(key, {
        ttl: '3s',
        keepAlive: { interval: '300ms' },
      }))!;
      await connection.query('BEGIN');
      await sleep(1_000); // several renewals meet the open transaction
      await connection.query('COMMIT');
      await sleep(3_500); // longer than the ttl: only renewals after the COMMIT keep it
      assert.equal(lease.lost, undefined, String(lease.lost));
      const state = await client.inspect(key);
      assert.equal(state?.held, true);
      assert.equal(state?.epoch, lease.epoch);
      assert.equal(await lease.release(), 'ok');
    });
  });

  test("waiting acquires hold no pool connection but the shared listening one: the holder's calls go through", async () => {
    const pool = new pg.Pool({ connectionString: db.url, max: 2 });
    pool.on('error', () => undefined);
    const small = new LeaseClient(pool);
    try {
      const keys = [uniqueKey(), uniqueKey()];
      const holders = await Promise.all(
        keys.map(async (key) => (await small.acquire(key, { ttl: '30s', owner: 'holder' }))!),
      );
      // Two waits on a pool of two: a wait that kept its connection would leave none free.
      const waits = keys.map((key) =>
        small.acquire(key, { ttl: '30s', owner: 'waiter', wait: '20s' }),
      );
      for (const wait of waits) wait.catch(() => undefined);
      await sleep(500);
      const started = performance.now();
      for (const holder of holders) await holder.renew();
      assert.ok(performance.now() - started < 10_000, 'the renewals waited for the waiters');
      for (const holder of holders) assert.equal(await holder.release(), 'ok');
      for (const [n, wait] of waits.entries()) {
        const taken = await wait;
        assert.equal(taken?.owner, 'waiter');
        assert.equal(taken?.epoch, holders[n]!.epoch + 2n);
        await taken?.release();
      }
    } finally {
      await small.end();
      await pool.end();
    }
  });

  test('a client made from a connection string owns its pool and end() closes it', async () => {
    const own = new LeaseClient(db.url);
    const key = uniqueKey();
    const lease = (await own.acquire(key, { ttl: '30s' }))!;
    await lease.release();
    await own.end();
    await assert.rejects(own.inspect(key), /after calling end|Cannot use a pool/);
  });
});
