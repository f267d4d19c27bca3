import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import {
  LeaseClient,
  LeaseInvalidInputError,
  LeaseLostError,
  subscribeLeaseEvents,
  type Lease,
  type RenewalFailedEvent,
} from '../../src/index.js';
import { KeepAliveGroup } from '../../src/keep-alive-group.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { abortReason, uniqueKey, waitFor } from '../support/helpers.js';

let db: TestDatabase;
let client: LeaseClient;

before(async () => {
  db = await createTestDatabase();
  client = new LeaseClient(db.pool);
});
after(() => db.close());

async function serverExpiry(key: string): Promise<number> {
  const { rows } = await db.pool.query<{ expires_at: Date }>(
    'SELECT expires_at FROM lease.leases WHERE key = $1',
    [key],
  );
  return rows[0]!.expires_at.getTime();
}

async function renewalsWaitingOnALock(): Promise<number> {
  const { rows } = await db.pool.query(
    `SELECT 1 FROM pg_stat_activity
      WHERE datname = current_database() AND wait_event_type = 'Lock'
        AND query LIKE '%lease.renew%'`,
  );
  return rows.length;
}

describe('keep-alive', () => {
  test('renews on its own, so the lease outlives several ttls with the same epoch', async () => {
    const key = uniqueKey();
    const lease = (await client.acquire(key, { ttl: '2s', keepAlive: true }))!;
    const firstExpiry = await serverExpiry(key);
    await sleep(5_000);
    assert.equal(lease.signal.aborted, false, String(lease.signal.reason));
    const state = await client.inspect(key);
    assert.equal(state?.held, true);
    assert.equal(state?.epoch, lease.epoch);
    assert.ok((await serverExpiry(key)) > firstExpiry + 2_000);
    assert.equal(await lease.release(), 'ok');
  });

  test('renews at the interval it is given', async () => {
    const key = uniqueKey();
    const lease = (await client.acquire(key, {
      ttl: '1 min',
      keepAlive: { interval: '200ms' },
    }))!;
    const seen = new Set<number>([await serverExpiry(key)]);
    const end = performance.now() + 2_000;
    while (performance.now() < end) {
      seen.add(await serverExpiry(key));
      await sleep(50);
    }
    // A ttl/3 schedule would not renew at all within these 2 s.
    assert.ok(seen.size >= 3, `${seen.size - 1} renewals seen`);
    await lease.release();
  });

  test('reports not_owner when the key was freed and another owner took it', async () => {
    const key = uniqueKey();
    const lease = (await client.acquire(key, { ttl: '2s', keepAlive: true }))!;
    assert.equal(await client.release(key, { owner: lease.owner, epoch: lease.epoch }), 'ok');
    const taker = (await client.acquire(key, { ttl: '30s', owner: 'taker' }))!;
    const reason = await abortReason(lease.signal, 10_000);
    assert.ok(reason instanceof LeaseLostError);
    assert.equal(reason.status, 'not_owner');
    assert.equal(reason.code, 'lease_lost');
    assert.equal(reason.epoch, lease.epoch);
    assert.equal((await client.inspect(key))?.owner, 'taker');
    await taker.release();
  });

  test('reports epoch_mismatch when the same owner holds the key under a newer epoch', async () => {
    const key = uniqueKey();
    const lease = (await client.acquire(key, { ttl: '2s', keepAlive: true }))!;
    await client.release(key, { owner: lease.owner, epoch: lease.epoch });
    const again = (await client.acquire(key, { ttl: '30s', owner: lease.owner }))!;
    assert.equal(again.epoch, lease.epoch + 2n);
    const reason = await abortReason(lease.signal, 10_000);
    assert.ok(reason instanceof LeaseLostError);
    assert.equal(reason.status, 'epoch_mismatch');
    await again.release();
  });

  test('reports lapsed when the grant expired on the server before the renewal arrived', async () => {
    const key = uniqueKey();
    const lease = (await client.acquire(key, { ttl: '3s', keepAlive: true }))!;
    // Someone with the same identity shortens the grant behind the handle's back.
    const shortened = await client.renew(key, { owner: lease.owner, epoch: lease.epoch, ttl: 1 });
    assert.equal(shortened.status, 'ok');
    const reason = await abortReason(lease.signal, 10_000);
    assert.ok(reason instanceof LeaseLostError);
    assert.equal(reason.status, 'lapsed');
  });

  test('a grant answered late renews at once, not an interval later', async () => {
    const key = uniqueKey();
    const blocker = await db.pool.connect();
    try {
      // The acquire waits on the row another transaction is inserting, then gets the key:
      // its deadline counts from the send, so little of the 6 s ttl is left when it arrives.
      await blocker.query('BEGIN');
      await blocker.query("SELECT lease.acquire($1, 'blocker', '1 hour')", [key]);
      const sentAt = performance.now();
      const acquiring = client.acquire(key, { ttl: '6s', keepAlive: true });
      await sleep(4_800);
      await blocker.query('ROLLBACK');
      const lease = (await acquiring)!;
      assert.ok(lease.remainingMs() < 6_000 - (performance.now() - sentAt) + 100);
      // An interval (6 s / 3) after the grant would be past the deadline.
      await sleep(2_500);
      assert.equal(lease.lost, undefined, String(lease.lost));
      assert.ok(lease.remainingMs() > 1_000, `${lease.remainingMs()} ms left`);
      assert.equal(await lease.release(), 'ok');
    } finally {
      await blocker.query('ROLLBACK');
      blocker.release();
    }
  });

  test("a renew to a shorter ttl moves keep-alive to that ttl's interval", async () => {
    const lease = (await client.acquire(uniqueKey(), { ttl: '3s', keepAlive: true }))!;
    await sleep(100);
    await lease.renew('600ms');
    // On the 1 s interval of the 3 s ttl, the next renewal would come after the 600 ms lapsed.
    await sleep(2_000);
    assert.equal(lease.lost, undefined, String(lease.lost));
    assert.equal(await lease.release(), 'ok');
  });

  test('a keep-alive renewal queued behind a renew(ttl) renews with that new ttl, not the old one', async () => {
    const key = uniqueKey();
    const lease = (await client.acquire(key, { ttl: '3s', keepAlive: { interval: '200ms' } }))!;
    const blocker = new pg.Client({ connectionString: db.url });
    await blocker.connect();
    try {
      // The row is locked: the renew to 1.5 s waits, and keep-alive renewals queue behind it.
      await blocker.query('BEGIN');
      await blocker.query('SELECT 1 FROM lease.leases WHERE key = $1 FOR UPDATE', [key]);
      const renewing = lease.renew('1500ms');
      await sleep(500);
      await blocker.query('ROLLBACK');
      await renewing;
      await sleep(300); // the queued keep-alive renewal has run
      const { rows } = await db.pool.query<{ left: number }>(
        `SELECT extract(epoch FROM expires_at - clock_timestamp()) * 1000 AS left
           FROM lease.leases WHERE key = $1`,
        [key],
      );
      assert.ok(Number(rows[0]!.left) <= 1_500, `${Number(rows[0]!.left).toFixed(0)} ms left`);
    } finally {
      await blocker.query('ROLLBACK');
      await blocker.end();
    }
    await lease.release();
  });

  test('handles a tick boundary split renew together after their first renewal', async () => {
    const tickMs = 20; // an interval of 320 ms has ticks of 20 ms
    // One run: two ttl starts 2 ms apart, on either side of a tick boundary (adjacent slots),
    // `ahead` ticks from now. It is valid only when both members joined before the first of
    // those slots came due; on a loaded box the test's own turn may come later than that, and
    // then the run is repeated. Two runs, one tick apart, put the pair at either phase of the
    // wheel's own ticks.
    const run = async (ahead: number) => {
      const group = new KeepAliveGroup({ hold: () => () => undefined });
      const fired: number[][] = [[], []];
      const member = (i: number) =>
        group.scheduler(
          async () => void fired[i]!.push(performance.now()),
          () => 60_000,
          { interval: '320ms' },
        );
      const boundary = (Math.floor(performance.now() / tickMs) + ahead) * tickMs;
      const a = member(0);
      const b = member(1);
      a.start(boundary - 320 - 1);
      b.start(boundary - 320 + 1);
      const valid = performance.now() < boundary - 2 * tickMs;
      await sleep(1_100);
      a.stop();
      b.stop();
      return { valid, fired };
    };
    for (const ahead of [5, 6]) {
      let outcome = await run(ahead);
      for (let attempt = 1; !outcome.valid && attempt < 5; attempt++) outcome = await run(ahead);
      const { valid, fired } = outcome;
      assert.ok(valid, 'the members never joined ahead of their first slot');
      assert.ok(fired[0]!.length >= 3 && fired[1]!.length >= 3, JSON.stringify(fired));
      for (let i = 0; i < 3; i++)
        assert.ok(
          Math.abs(fired[0]![i]! - fired[1]![i]!) < 5,
          `${ahead} ticks ahead, renewal ${i + 1}: ${(fired[1]![i]! - fired[0]![i]!).toFixed(1)} ms apart`,
        );
    }
  });

  test('a lost handle stopped again leaves the group keeping its other handles', () => {
    const group = new KeepAliveGroup({ hold: () => () => undefined });
    const member = () =>
      group.scheduler(
        () => new Promise<never>(() => undefined),
        () => 60_000,
        {},
      );
    const lost = member();
    lost.start(performance.now());
    lost.stop(); // the loss
    const kept = member();
    kept.start(performance.now());
    lost.stop(); // release() of the lost handle stops it once more
    assert.equal(group.size, 1);
    const joined = member();
    joined.start(performance.now());
    assert.equal(group.size, 2);
    kept.stop();
    joined.stop();
    assert.equal(group.size, 0);
  });

  test("a handle in a long fenced transaction holds up none of its owner's other renewals", async () => {
    // Five handles of one owner renew together (renew_many), every second of a 3 s ttl. One of
    // them runs a fenced transaction for twice that period: the fence keeps its key's row
    // locked, so its own renewal must wait, but the others' must not.
    const keys = Array.from({ length: 5 }, () => uniqueKey('fenced-group'));
    const leases = (await client.acquireMany(keys, {
      ttl: '3s',
      owner: 'worker-fenced-group',
      keepAlive: true,
    })) as Lease[];
    const fencedLease = leases[2]!;
    const others = leases.filter((lease) => lease !== fencedLease);
    const renewedSince = (lease: Lease, expiresAt: number) => lease.expiresAt.getTime() > expiresAt;
    const othersAt = others.map((lease) => lease.expiresAt.getTime());
    const fencedAt = fencedLease.expiresAt.getTime();
    const serverAt = await Promise.all(others.map((lease) => serverExpiry(lease.key)));
    let renewedWhileFenced = false;
    await client.fenced(fencedLease, async () => {
      const end = performance.now() + 2_000;
      while (performance.now() < end && !renewedWhileFenced) {
        renewedWhileFenced = others.every((lease, i) => renewedSince(lease, othersAt[i]!));
        await sleep(50);
      }
      assert.ok(renewedWhileFenced, 'the other handles renewed while the fenced transaction ran');
      // On the server too, while the fenced row is still locked.
      const now = await Promise.all(others.map((lease) => serverExpiry(lease.key)));
      for (const [i, at] of now.entries()) assert.ok(at > serverAt[i]!, keys[i]);
      assert.equal(renewedSince(fencedLease, fencedAt), false, 'the fenced key waits for its row');
      await sleep(Math.max(0, end - performance.now()));
    });
    // Once the transaction is over, the fenced handle's waiting renewal goes through.
    await waitFor('the fenced handle renews', () => renewedSince(fencedLease, fencedAt), 3_000);
    await sleep(1_500);
    for (const lease of leases) assert.equal(lease.lost, undefined, String(lease.lost));
    await Promise.all(leases.map((lease) => lease.release()));
  });

  test('a renewal stuck behind a row lock loses the lease at the deadline, not later', async () => {
    const key = uniqueKey();
    const lease = (await client.acquire(key, { ttl: '1500ms', keepAlive: true }))!;
    const blocker = new pg.Client({ connectionString: db.url });
    await blocker.connect();
    try {
      // Another transaction holds the key's row: every renew waits behind it.
      await blocker.query('BEGIN');
      await blocker.query('SELECT 1 FROM lease.leases WHERE key = $1 FOR UPDATE', [key]);
      const lockedAt = performance.now();
      await waitFor('a renewal waits on the lock', async () => {
        return (await renewalsWaitingOnALock()) > 0;
      });
      const reason = await abortReason(lease.signal, 10_000);
      const lostAfter = performance.now() - lockedAt;
      assert.ok(reason instanceof LeaseLostError);
      assert.equal(reason.status, 'expired');
      assert.ok(lostAfter <= 1_500 + 1_000, `lost ${lostAfter} ms after the lock`);
      // The renewal is still waiting: the loss came from the client's deadline alone.
      assert.equal(await renewalsWaitingOnALock(), 1);
    } finally {
      await blocker.query('ROLLBACK');
      await blocker.end();
    }
    await lease.release();
  });
});

describe('deadline without keep-alive', () => {
  /** Blocks the event loop for `ms`, as a long synchronous task of the application would. */
  function stall(ms: number): void {
    const until = performance.now() + ms;
    while (performance.now() < until);
  }

  test('the deadline counts from the send: an answer handled late leaves that much less time', async () => {
    // The server measures the time left while it answers; the answer may be handled much
    // later (a stalled event loop, a slow network). Counted from the answer's handling, the
    // deadline would run past the server's expiry by that much.
    const connection = new pg.Client({ connectionString: db.url });
    connection.on('error', () => undefined);
    await connection.connect();
    const stalled = new LeaseClient(connection);
    const query = connection.query.bind(connection) as (...args: unknown[]) => unknown;
    let stallMs = 0;
    (connection as unknown as { query: (...args: unknown[]) => unknown }).query = (...args) => {
      const result = query(...args);
      const ms = stallMs;
      stallMs = 0;
      stall(ms);
      return result;
    };
    try {
      const key = uniqueKey();
      stallMs = 500;
      const lease = (await stalled.acquire(key, { ttl: '10s' }))!;
      let left = lease.remainingMs();
      assert.ok(left < 9_600 && left > 7_000, `acquire: ${left.toFixed(0)} ms left of 10 s`);
      stallMs = 500;
      await lease.renew();
      left = lease.remainingMs();
      assert.ok(left < 9_600 && left > 7_000, `renew: ${left.toFixed(0)} ms left of 10 s`);
      assert.equal(await lease.release(), 'ok');
    } finally {
      await stalled.end();
      await connection.end();
    }
  });

  test("the deadline never reads the client's wall clock: an hour off either way changes nothing", async () => {
    // Only the server's measure of the time left counts: expiresAt is the server's clock, and
    // a client clock that is off (no NTP, a VM resumed) must not stretch or shrink a lease.
    const RealDate = Date;
    for (const skewMs of [3_600_000, -3_600_000]) {
      class SkewedDate extends RealDate {
        constructor(...args: unknown[]) {
          if (args.length === 0) super(RealDate.now() + skewMs);
          else super(...(args as [string]));
        }
        static override now(): number {
          return RealDate.now() + skewMs;
        }
      }
      globalThis.Date = SkewedDate as DateConstructor;
      try {
        const lease = (await client.acquire(uniqueKey(), { ttl: '10s' }))!;
        let left = lease.remainingMs();
        assert.ok(left > 8_000 && left <= 10_000, `skew ${skewMs}: acquire left ${left} ms`);
        await lease.renew();
        left = lease.remainingMs();
        assert.ok(left > 8_000 && left <= 10_000, `skew ${skewMs}: renew left ${left} ms`);
        assert.equal(await lease.release(), 'ok');
      } finally {
        globalThis.Date = RealDate;
      }
    }
  });

  test('the handle counts itself lost before another owner can be granted the key', async () => {
    const key = uniqueKey();
    const first = (await client.acquire(key, { ttl: '1s', owner: 'first' }))!;
    const taker = (await client.acquire(key, { ttl: '30s', owner: 'taker', wait: '20s' }))!;
    // The taker's grant has arrived: the first handle's deadline must have passed already,
    // so its renew fails locally ("expired") instead of asking the server ("not_owner").
    await assert.rejects(
      first.renew(),
      (error: unknown) => error instanceof LeaseLostError && error.status === 'expired',
    );
    assert.equal(first.signal.aborted, true);
    assert.equal(first.lost?.status, 'expired');
    await taker.release();
  });

  test('a renewal to a shorter ttl moves the deadline earlier, and the handle is lost then', async () => {
    const key = uniqueKey();
    const lease = (await client.acquire(key, { ttl: '1 min' }))!;
    const renewedAt = performance.now();
    await lease.renew('1s');
    // Armed for the minute of the grant, a timer kept as it was would fire 59 s too late.
    const reason = await abortReason(lease.signal, 10_000);
    assert.ok(reason instanceof LeaseLostError && reason.status === 'expired', String(reason));
    const lostAfter = performance.now() - renewedAt;
    assert.ok(lostAfter >= 900 && lostAfter < 5_000, `lost ${lostAfter.toFixed(0)} ms after`);
  });

  test('a handle renewed again and again is lost at its last deadline, not an earlier one', async () => {
    const key = uniqueKey();
    const lease = (await client.acquire(key, { ttl: '800ms' }))!;
    for (let i = 0; i < 4; i++) {
      await sleep(300);
      await lease.renew();
    }
    // 1.2 s after the grant: every deadline but the last has passed.
    const lastAt = performance.now();
    assert.equal(lease.signal.aborted, false, String(lease.signal.reason));
    const reason = await abortReason(lease.signal, 10_000);
    assert.ok(reason instanceof LeaseLostError && reason.status === 'expired', String(reason));
    const lostAfter = performance.now() - lastAt;
    assert.ok(lostAfter >= 400 && lostAfter < 3_000, `lost ${lostAfter.toFixed(0)} ms after`);
  });

  test('a grant that arrives after a long wait gets a deadline measured from the grant', async () => {
    const key = uniqueKey();
    await client.acquire(key, { ttl: '1500ms', owner: 'first' });
    const sentAt = performance.now();
    const taker = (await client.acquire(key, { ttl: '3s', owner: 'taker', wait: '20s' }))!;
    const grantedAt = performance.now();
    assert.ok(grantedAt - sentAt >= 1_000, `waited ${grantedAt - sentAt} ms`);
    // Measured from the send, the deadline would fall about 1.5 s after the grant.
    await sleep(2_000);
    assert.equal(taker.signal.aborted, false, String(taker.signal.reason));
    await taker.renew();
    await taker.release();
  });
});

/**
 * Issue 32, item 4: one key the server refuses must not cost the owner's other leases. The
 * keep-alive renews the handles of one owner and ttl in one renew_many; a statement the server
 * refuses as a whole used to fail every handle in it, on every retry, until they all lapsed.
 */
describe('keep-alive: one bad key costs no other key its lease', () => {
  // Long enough that a loaded box (npm test beside another CPU load) renews in time; without
  // the fallback every lease lapses after one ttl, so two ttls of waiting tell the difference.
  const TTL_MS = 2_000;
  const TTL = `${TTL_MS}ms`;
  const UNRELATED = 40;

  /** Acquires `keys` for `owner` at once with keep-alive, so that their renewals share ticks. */
  async function acquireAll(
    keys: string[],
    owner: string,
  ): Promise<PromiseSettledResult<Lease | null>[]> {
    return Promise.allSettled(
      keys.map((key) => client.acquire(key, { ttl: TTL, owner, keepAlive: true })),
    );
  }

  /** Waits two ttls, then checks that each handle is held and that nobody else can take it. */
  async function assertAllKept(leases: Lease[]): Promise<void> {
    await sleep(2 * TTL_MS);
    const lost = leases.filter((lease) => lease.signal.aborted);
    assert.deepEqual(
      lost.map((lease) => `${lease.key}: ${String(lease.signal.reason)}`),
      [],
      `${lost.length} of ${leases.length} unrelated leases lost`,
    );
    const taken = await Promise.all(
      leases.map((lease) => client.acquire(lease.key, { ttl: '30s', owner: 'another-owner' })),
    );
    assert.equal(taken.filter((lease) => lease !== null).length, 0, 'another owner took keys');
  }

  test("the issue's scenario: two keys with lone surrogates are refused, the other 40 leases live on", async () => {
    const owner = `one-owner-${process.pid}`;
    const unrelated = Array.from({ length: UNRELATED }, (_, i) => `${uniqueKey('job')}-${i}`);
    const problems = [`job-${process.pid}-\uD800`, `job-${process.pid}-\uD801`];
    const settled = await acquireAll([...unrelated, ...problems], owner);
    const leases = settled.slice(0, UNRELATED).map((result) => {
      assert.equal(result.status, 'fulfilled');
      return (result as PromiseFulfilledResult<Lease | null>).value!;
    });
    const problemLeases = settled
      .slice(UNRELATED)
      .map((r) => (r.status === 'fulfilled' ? r.value : null));
    try {
      await assertAllKept(leases);
      settled.slice(UNRELATED).forEach((result, i) => {
        assert.equal(result.status, 'rejected', `${JSON.stringify(problems[i])} was acquired`);
        const error = (result as PromiseRejectedResult).reason as unknown;
        assert.ok(error instanceof LeaseInvalidInputError, String(error));
        assert.match(
          error.detail,
          /^key must be well-formed Unicode: lone surrogate U\+D80[01] at index \d+$/,
        );
      });
    } finally {
      await client.releaseMany([...leases, ...problemLeases.filter((l) => l !== null)]);
    }
  });

  const refusals: [string, string, (error: unknown) => boolean][] = [
    [
      "pg_lease's own invalid input (22023)",
      `RAISE EXCEPTION 'pg_lease: invalid input' USING ERRCODE = 'invalid_parameter_value',
         DETAIL = 'keys must be distinct: keys[42] repeats keys[1]'`,
      (error) => error instanceof LeaseInvalidInputError,
    ],
    [
      'a data exception of PostgreSQL (22021)',
      `RAISE EXCEPTION 'invalid byte sequence for encoding "UTF8": 0x00'
         USING ERRCODE = 'character_not_in_repertoire'`,
      (error) => error instanceof pg.DatabaseError && error.code === '22021',
    ],
  ];
  for (const [name, raise, isTheRefusal] of refusals)
    test(`a renew_many refused for one key's input (${name}) is renewed key by key`, async () => {
      const owner = `one-owner-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
      const poison = uniqueKey('poison');
      const unrelated = Array.from({ length: UNRELATED }, (_, i) => `${uniqueKey('job')}-${i}`);
      const failed: RenewalFailedEvent[] = [];
      const unsubscribe = subscribeLeaseEvents({ renewalFailed: (event) => failed.push(event) });
      const settled = await acquireAll([poison, ...unrelated], owner);
      const [bad, ...leases] = settled.map((result) => {
        assert.equal(result.status, 'fulfilled');
        return (result as PromiseFulfilledResult<Lease | null>).value!;
      });
      // From now on the server refuses every statement that renews the poisoned key: a real
      // statement refused as a whole for one element, as a key it cannot take would be.
      const trigger = `refuse_${process.pid}_${Math.random().toString(36).slice(2, 8)}`;
      await db.pool.query(
        `CREATE FUNCTION public.${trigger}() RETURNS trigger LANGUAGE plpgsql AS $f$
         BEGIN
           IF NEW.key = '${poison}' THEN ${raise}; END IF;
           RETURN NEW;
         END $f$`,
      );
      await db.pool.query(
        `CREATE TRIGGER ${trigger} BEFORE UPDATE ON lease.leases
           FOR EACH ROW EXECUTE FUNCTION public.${trigger}()`,
      );
      try {
        await assertAllKept(leases);
        // The poisoned handle alone failed its renewals, said so, and was lost at its deadline.
        const reason = await abortReason(bad!.signal, 5_000);
        assert.ok(reason instanceof LeaseLostError && reason.status === 'expired', String(reason));
        assert.ok(failed.some((event) => event.key === poison && isTheRefusal(event.error)));
        assert.deepEqual(
          [...new Set(failed.map((event) => event.key))].filter((key) => key !== poison),
          [],
        );
      } finally {
        unsubscribe();
        await db.pool.query(`DROP TRIGGER ${trigger} ON lease.leases`);
        await db.pool.query(`DROP FUNCTION public.${trigger}()`);
        await client.releaseMany([bad!, ...leases]);
      }
    });
});

describe('keep-alive at scale: batches and the shared deadline timer', () => {
  test('12 000 handles renew in statements of at most 5000 keys, and a renew() during one waits for it', async () => {
    const counts: number[] = [];
    const counting = new pg.Pool({
      connectionString: db.url,
      max: 4,
      Client: class extends pg.Client {
        override query(...args: unknown[]): never {
          const first = args[0] as { text?: string; values?: unknown[] } | string;
          // The keep-alive's statements skip locked rows; acquireMany's first renewal of grants
          // that arrived late (one per acquire_many statement) does not.
          if (
            typeof first === 'object' &&
            first.text?.includes('lease.renew_many') &&
            first.text.includes(', true)')
          )
            counts.push((first.values?.[0] as unknown[]).length);
          return (super.query as (...a: unknown[]) => never)(...args);
        }
      },
    });
    const scaled = new LeaseClient(counting);
    try {
      const keys = Array.from({ length: 12_000 }, () => uniqueKey('scale'));
      const leases = (await scaled.acquireMany(keys, {
        ttl: '6s',
        owner: 'worker-scale',
        keepAlive: { interval: '1s' },
      })) as Lease[];
      const first = leases.map((lease) => lease.expiresAt.getTime());
      // renew() calls made while the keep-alive's statements are out queue behind them.
      await waitFor('a keep-alive statement', () => counts.length > 0, 5_000);
      const renewed = await Promise.all(leases.slice(0, 50).map((lease) => lease.renew()));
      assert.equal(renewed.length, 50);
      await waitFor(
        'every handle renewed',
        () => leases.every((lease, i) => lease.expiresAt.getTime() > first[i]!),
        10_000,
      );
      assert.ok(counts.length >= 3, `${counts.length} statements`);
      assert.ok(Math.max(...counts) <= 5_000, `largest statement: ${Math.max(...counts)} keys`);
      assert.ok(leases.every((lease) => lease.lost === undefined && !lease.signal.aborted));
      await scaled.releaseMany(leases);
    } finally {
      await scaled.end();
      await counting.end();
    }
  });

  test('handles without keep-alive are lost at their own deadlines, in order, with one timer for all', async () => {
    const leases = await Promise.all(
      [900, 300, 600].map(
        async (ms) => (await client.acquire(uniqueKey('deadlines'), { ttl: `${ms}ms` }))!,
      ),
    );
    const lost: { index: number; ms: number }[] = [];
    const start = performance.now();
    leases.forEach((lease, index) =>
      lease.signal.addEventListener('abort', () =>
        lost.push({ index, ms: performance.now() - start }),
      ),
    );
    // A renewal moves one deadline later: its earlier list entry is skipped.
    await leases[1]!.renew('1200ms');
    await waitFor('three losses', () => lost.length === 3, 5_000);
    assert.deepEqual(
      lost.map((l) => l.index),
      [2, 0, 1],
      JSON.stringify(lost),
    );
    assert.ok(lost[2]!.ms > 1_000, JSON.stringify(lost));
    assert.ok(leases.every((lease) => lease.lost?.status === 'expired'));
    await Promise.all(leases.map((lease) => lease.release()));
  });
});
