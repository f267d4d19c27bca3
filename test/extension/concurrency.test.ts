/**
 * SEMANTICS.md §5 races as deterministic interleavings of several sessions, isolationtester
 * style: a step expected to wait is confirmed blocked (pg_blocking_pids) or waiting by the
 * server before the test goes on, and a step that must go through fails the test when the
 * server shows it blocked. No sleep guesses at an interleaving. This file is the only home of
 * these races on every supported major; the isolation specs that once repeated them
 * (concurrent-acquire, denied-acquire-holds-no-lock, renew-vs-takeover, release-vs-acquire,
 * rollback-acquire, blocking-acquire-*, repeatable-read*, lapse-after-lock-wait) were ported
 * here and removed.
 */
import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { after, before, describe, test } from 'node:test';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { acquire, acquireCall, inspect, inspectCall, release, releaseCall, renew, renewCall, serverNow, sleepPast, type Acquired, type Queryable } from '../support/lease-calls.js';
import { uniqueKey } from '../support/helpers.js';
import { Isolation, type Session, type Step } from '../support/sessions.js';

let db: TestDatabase;
before(async () => {
  db = await createTestDatabase();
});
after(() => db.close());

type KeyState = 'never-leased' | 'released' | 'lapsed';

/** Brings a fresh key into a state; returns the epoch the next grant must carry. */
async function prepare(db: Queryable, key: string, state: KeyState): Promise<bigint> {
  if (state === 'never-leased') return 1n;
  if (state === 'released') {
    const granted = await acquire(db, key, 'worker-0', '1 minute');
    assert.equal((await release(db, key, 'worker-0', granted.epoch)).status, 'ok');
    return granted.epoch! + 2n;
  }
  const granted = await acquire(db, key, 'worker-0', '300 milliseconds');
  await sleepPast(db, granted.expiresAt);
  return granted.epoch! + 1n;
}

async function assertAcquireTimedOut(
  step: Step<Acquired>,
  key: string,
  wait: string,
): Promise<void> {
  const error = await step.error();
  assert.equal(error.code, '57014', `expected 57014, got ${error.code}: ${error.message}`);
  assert.equal(error.message, 'pg_lease: acquire timed out');
  assert.ok(error.detail?.includes(key), `DETAIL must name the key: ${error.detail}`);
  const { rows } = await db.pool.query('SELECT $1::interval::text AS wait', [wait]);
  assert.ok(error.detail?.includes(rows[0].wait), `DETAIL must name the wait: ${error.detail}`);
}

describe('concurrent acquires: exactly one winner', { concurrency: true }, () => {
  for (const state of ['never-leased', 'released', 'lapsed'] as const) {
    test(`acquires racing an uncommitted grant of a ${state} key wait for it, then are denied`, async () => {
      await using iso = await Isolation.open(db.url, ['s1', 's2', 's3']);
      const { s1, s2, s3 } = iso.named;
      const key = uniqueKey(`race-${state}`);
      const expected = await prepare(db.pool, key, state);

      await s1.query('BEGIN');
      const won = await s1.run(acquireCall(key, 'worker-a', '1 minute'));
      assert.equal(won.epoch, expected);
      const s2Acquire = s2.start(acquireCall(key, 'worker-b', '1 minute', '0'));
      await iso.untilBlocked(s2Acquire, s1);
      const s3Acquire = s3.start(acquireCall(key, 'worker-c', '1 minute', '0'));
      await iso.untilBlocked(s3Acquire);
      await s1.query('COMMIT');
      assert.deepEqual(await s2Acquire.result(), { acquired: false, epoch: null, expiresAt: null });
      assert.deepEqual(await s3Acquire.result(), { acquired: false, epoch: null, expiresAt: null });
      const seen = await inspect(db.pool, key);
      assert.equal(seen?.owner, 'worker-a');
      assert.equal(seen?.epoch, expected);
    });

    test(`an acquire racing a grant of a ${state} key that rolls back wins with the same epoch`, async () => {
      await using iso = await Isolation.open(db.url, ['s1', 's2']);
      const { s1, s2 } = iso.named;
      const key = uniqueKey(`race-rollback-${state}`);
      const expected = await prepare(db.pool, key, state);

      await s1.query('BEGIN');
      assert.equal((await s1.run(acquireCall(key, 'worker-a', '1 minute'))).epoch, expected);
      const s2Acquire = s2.start(acquireCall(key, 'worker-b', '1 minute', '0'));
      await iso.untilBlocked(s2Acquire, s1);
      await s1.query('ROLLBACK');
      const s2Result = await s2Acquire.result();
      assert.equal(s2Result.acquired, true);
      assert.equal(s2Result.epoch, expected, 'the rolled-back grant never happened');
      assert.equal((await inspect(db.pool, key))?.owner, 'worker-b');
    });
  }

  test('two acquires wait on a grant of a released key that rolls back: the first in the lock queue wins with its epoch, the next is denied', async () => {
    await using iso = await Isolation.open(db.url, ['s1', 's2', 's3']);
    const { s1, s2, s3 } = iso.named;
    const key = uniqueKey('race-rollback-two-waiters');
    const expected = await prepare(db.pool, key, 'released');

    await s1.query('BEGIN');
    assert.equal((await s1.run(acquireCall(key, 'worker-a', '1 minute'))).epoch, expected);
    const s2Acquire = s2.start(acquireCall(key, 'worker-b', '1 minute', '0'));
    await iso.untilBlocked(s2Acquire, s1);
    const s3Acquire = s3.start(acquireCall(key, 'worker-c', '1 minute', '0'));
    await iso.untilBlocked(s3Acquire);
    await s1.query('ROLLBACK');
    const first = await s2Acquire.result();
    assert.equal(first.acquired, true);
    assert.equal(first.epoch, expected, 'the rolled-back grant never happened');
    assert.deepEqual(await s3Acquire.result(), { acquired: false, epoch: null, expiresAt: null });
    assert.deepEqual(await inspect(db.pool, key), {
      held: true,
      owner: 'worker-b',
      epoch: expected,
      expiresAt: first.expiresAt,
    });
  });

  for (const state of ['never-leased', 'released', 'lapsed'] as const) {
    test(`two racing acquires of a ${state} key by the same owner both report the one grant`, async () => {
      await using iso = await Isolation.open(db.url, ['s1', 's2']);
      const { s1, s2 } = iso.named;
      const key = uniqueKey(`race-same-owner-${state}`);
      const expected = await prepare(db.pool, key, state);

      await s1.query('BEGIN');
      const first = await s1.run(acquireCall(key, 'worker-a', '1 minute'));
      assert.equal(first.epoch, expected);
      const second = s2.start(acquireCall(key, 'worker-a', '5 minutes', '0'));
      await iso.untilBlocked(second, s1);
      await s1.query('COMMIT');
      assert.deepEqual(await second.result(), first, 'the same grant, not a second one');
      assert.deepEqual(await inspect(db.pool, key), {
        held: true,
        owner: 'worker-a',
        epoch: expected,
        expiresAt: first.expiresAt,
      });
    });
  }

  test('N clients racing under Promise.all: exactly one winner per round, epochs strictly increasing', async () => {
    const clients = 8;
    const rounds = 12;
    const names = Array.from({ length: clients }, (_, i) => `c${i}`);
    await using iso = await Isolation.open(db.url, names);
    const key = uniqueKey('race-rounds');
    let previous = 0n;
    let freedBy: 'start' | 'release' | 'lapse' = 'start';
    for (let round = 0; round < rounds; round++) {
      const steps = iso.sessions.map((session) =>
        session.start(acquireCall(key, `worker-${session.name}`, '1 minute')),
      );
      const results = await Promise.all(steps.map((step) => step.result()));
      const winners = results.filter((result) => result.acquired);
      assert.equal(winners.length, 1, `round ${round}: ${winners.length} winners`);
      for (const loser of results.filter((result) => !result.acquired))
        assert.deepEqual(loser, { acquired: false, epoch: null, expiresAt: null });
      const winner = winners[0]!;
      const expected: bigint = freedBy === 'start' ? 1n : previous + (freedBy === 'release' ? 2n : 1n);
      assert.equal(winner.epoch, expected, `round ${round} (key ${freedBy})`);
      assert.ok(winner.epoch! > previous);
      previous = winner.epoch!;

      const owner = `worker-${names[results.indexOf(winner)]}`;
      if (round % 2 === 0) {
        assert.equal((await release(db.pool, key, owner, winner.epoch)).status, 'ok');
        freedBy = 'release';
      } else {
        // Cut the grant short rather than race with a short ttl: a racer delayed past a short
        // ttl by a noisy machine would rightly take over and look like a second winner.
        const cut = await renew(db.pool, key, owner, winner.epoch, '1 millisecond');
        assert.equal(cut.status, 'ok');
        await sleepPast(db.pool, cut.expiresAt);
        freedBy = 'lapse';
      }
    }
  });

  test('several waiting acquires: a release lets exactly one of them in, the others time out', async () => {
    const waiters = 5;
    const names = ['holder', ...Array.from({ length: waiters }, (_, i) => `w${i}`)];
    await using iso = await Isolation.open(db.url, names);
    const [holder, ...others] = iso.sessions as [Session, ...Session[]];
    const key = uniqueKey('waiters');
    const granted = await holder.run(acquireCall(key, 'worker-holder', '1 minute'));
    const steps = others.map((session) =>
      session.start(acquireCall(key, `worker-${session.name}`, '1 minute', '5 seconds')),
    );
    for (const step of steps) await iso.untilWaiting(step);
    assert.equal((await holder.run(releaseCall(key, 'worker-holder', granted.epoch))).status, 'ok');

    const outcomes = await Promise.allSettled(steps.map((step) => step.result()));
    const winners = outcomes.filter(
      (outcome): outcome is PromiseFulfilledResult<Acquired> =>
        outcome.status === 'fulfilled' && outcome.value.acquired,
    );
    assert.equal(winners.length, 1, 'exactly one waiter wins');
    assert.equal(winners[0]!.value.epoch, granted.epoch! + 2n);
    for (const [index, outcome] of outcomes.entries()) {
      if (outcome.status === 'fulfilled') continue;
      const error = outcome.reason as { code?: string; message?: string };
      assert.equal(error.code, '57014', `waiter ${index}: ${error.message}`);
      assert.equal(error.message, 'pg_lease: acquire timed out');
    }
  });
});

describe('renew and release racing acquires', { concurrency: true }, () => {
  test('renew and release of a lapsed grant answer lapsed at once during an uncommitted takeover, not_owner once it commits', async () => {
    await using iso = await Isolation.open(db.url, ['holder', 'taker']);
    const { holder, taker } = iso.named;
    const key = uniqueKey('renew-vs-takeover');
    const old = await acquire(db.pool, key, 'worker-a', '300 milliseconds');
    await sleepPast(db.pool, old.expiresAt);
    const lapsed = { status: 'lapsed', expiresAt: null };
    const notOwner = { status: 'not_owner', expiresAt: null };
    assert.deepEqual(await holder.run(renewCall(key, 'worker-a', old.epoch, '1 minute')), lapsed);
    assert.deepEqual(await holder.run(releaseCall(key, 'worker-a', old.epoch)), { status: 'lapsed' });

    await taker.query('BEGIN');
    const taken = await taker.run(acquireCall(key, 'worker-b', '1 minute'));
    assert.equal(taken.epoch, old.epoch! + 1n);
    // run() fails with StepBlockedError if either call waits for the open takeover: the
    // committed state still shows the caller's own lapsed grant, which is final.
    assert.deepEqual(await holder.run(renewCall(key, 'worker-a', old.epoch, '1 minute')), lapsed);
    assert.deepEqual(await holder.run(releaseCall(key, 'worker-a', old.epoch)), { status: 'lapsed' });
    await taker.query('COMMIT');
    assert.deepEqual(await holder.run(renewCall(key, 'worker-a', old.epoch, '1 minute')), notOwner);
    assert.deepEqual(await holder.run(releaseCall(key, 'worker-a', old.epoch)), { status: 'not_owner' });
    assert.equal((await taker.run(renewCall(key, 'worker-b', taken.epoch, '1 minute'))).status, 'ok');
    const seen = await inspect(db.pool, key);
    assert.deepEqual([seen?.held, seen?.owner, seen?.epoch], [true, 'worker-b', old.epoch! + 1n]);
  });

  test('renew racing a takeover that rolls back answers lapsed; the old owner then re-acquires with the epoch the takeover had', async () => {
    await using iso = await Isolation.open(db.url, ['holder', 'taker']);
    const { holder, taker } = iso.named;
    const key = uniqueKey('renew-vs-rollback');
    const old = await acquire(db.pool, key, 'worker-a', '300 milliseconds');
    await sleepPast(db.pool, old.expiresAt);

    await taker.query('BEGIN');
    assert.equal((await taker.run(acquireCall(key, 'worker-b', '1 minute'))).epoch, old.epoch! + 1n);
    const lapsed = { status: 'lapsed', expiresAt: null };
    assert.deepEqual(await holder.run(renewCall(key, 'worker-a', old.epoch, '1 minute')), lapsed);
    await taker.query('ROLLBACK');
    assert.deepEqual(await holder.run(renewCall(key, 'worker-a', old.epoch, '1 minute')), lapsed);
    const again = await holder.run(acquireCall(key, 'worker-a', '1 minute'));
    assert.deepEqual([again.acquired, again.epoch], [true, old.epoch! + 1n]);
    const seen = await inspect(db.pool, key);
    assert.deepEqual([seen?.held, seen?.owner, seen?.epoch], [true, 'worker-a', old.epoch! + 1n]);
  });

  test('the old owner re-acquires its lapsed key first: a takeover in an open transaction is denied', async () => {
    await using iso = await Isolation.open(db.url, ['holder', 'taker']);
    const { holder, taker } = iso.named;
    const key = uniqueKey('reacquire-vs-takeover');
    const old = await acquire(db.pool, key, 'worker-a', '300 milliseconds');
    await sleepPast(db.pool, old.expiresAt);
    const again = await holder.run(acquireCall(key, 'worker-a', '1 minute'));
    assert.deepEqual([again.acquired, again.epoch], [true, old.epoch! + 1n]);
    await taker.query('BEGIN');
    assert.deepEqual(await taker.run(acquireCall(key, 'worker-b', '1 minute')), {
      acquired: false,
      epoch: null,
      expiresAt: null,
    });
    await taker.query('COMMIT');
    const seen = await inspect(db.pool, key);
    assert.deepEqual([seen?.held, seen?.owner, seen?.epoch], [true, 'worker-a', old.epoch! + 1n]);
  });

  for (const call of ['renew', 'release'] as const) {
    test(`a ${call} that waited for the row lock across the expiry answers lapsed and changes nothing`, async () => {
      await using iso = await Isolation.open(db.url, ['locker', 'caller']);
      const { locker, caller } = iso.named;
      const key = uniqueKey(`lapse-after-wait-${call}`);
      const granted = await acquire(db.pool, key, 'worker-a', '2 seconds');
      // Another session of the holder locks the row (a renew it will roll back).
      await locker.query('BEGIN');
      assert.equal((await locker.run(renewCall(key, 'worker-a', granted.epoch, '1 millisecond'))).status, 'ok');
      const step = caller.start(
        call === 'renew'
          ? renewCall(key, 'worker-a', granted.epoch, '10 seconds')
          : releaseCall(key, 'worker-a', granted.epoch),
      );
      await iso.untilBlocked(step, locker);
      await sleepPast(db.pool, granted.expiresAt);
      // The rollback brings back the original grant, which has lapsed meanwhile.
      await locker.query('ROLLBACK');
      assert.equal((await step.result()).status, 'lapsed');
      assert.deepEqual(await inspect(db.pool, key), {
        held: false,
        owner: null,
        epoch: granted.epoch,
        expiresAt: null,
      });
    });
  }

  test('an acquire racing an uncommitted renew by the holder is denied, before or after the renew commits', async () => {
    await using iso = await Isolation.open(db.url, ['holder', 'other']);
    const { holder, other } = iso.named;
    const key = uniqueKey('acquire-vs-renew');
    const granted = await acquire(db.pool, key, 'worker-a', '1 minute');

    await holder.query('BEGIN');
    assert.equal((await holder.run(renewCall(key, 'worker-a', granted.epoch, '2 minutes'))).status, 'ok');
    const otherAcquire = other.start(acquireCall(key, 'worker-b', '1 minute', '0'));
    await iso.blockedOrSettled(otherAcquire, holder);
    await holder.query('COMMIT');
    assert.deepEqual(await otherAcquire.result(), { acquired: false, epoch: null, expiresAt: null });
  });

  test('a waiting acquire racing an uncommitted release is granted once the release commits', async () => {
    await using iso = await Isolation.open(db.url, ['holder', 'other']);
    const { holder, other } = iso.named;
    const key = uniqueKey('release-vs-acquire');
    const granted = await acquire(db.pool, key, 'worker-a', '1 minute');

    await holder.query('BEGIN');
    assert.equal((await holder.run(releaseCall(key, 'worker-a', granted.epoch))).status, 'ok');
    const otherAcquire = other.start(acquireCall(key, 'worker-b', '1 minute', '20 seconds'));
    await iso.untilWaiting(otherAcquire);
    await holder.query('COMMIT');
    const result = await otherAcquire.result();
    assert.equal(result.acquired, true);
    assert.equal(result.epoch, granted.epoch! + 2n);
  });

  for (const end of ['COMMIT', 'ROLLBACK'] as const) {
    test(`an acquire during an uncommitted release is denied at once; after the release's ${end} the next acquire in the same transaction is ${end === 'COMMIT' ? 'granted' : 'denied'}`, async () => {
      await using iso = await Isolation.open(db.url, ['holder', 'other']);
      const { holder, other } = iso.named;
      const key = uniqueKey(`release-${end}-vs-acquire`);
      const granted = await acquire(db.pool, key, 'worker-a', '1 minute');
      const denied = { acquired: false, epoch: null, expiresAt: null };

      await holder.query('BEGIN');
      assert.equal((await holder.run(releaseCall(key, 'worker-a', granted.epoch))).status, 'ok');
      await other.query('BEGIN');
      // run() fails with StepBlockedError if the acquire waits for the releasing transaction.
      assert.deepEqual(await other.run(acquireCall(key, 'worker-b', '1 minute', '0')), denied);
      await holder.query(end);
      const next = await other.run(acquireCall(key, 'worker-b', '1 minute', '0'));
      await other.query('COMMIT');
      const seen = await inspect(db.pool, key);
      if (end === 'COMMIT') {
        assert.deepEqual([next.acquired, next.epoch], [true, granted.epoch! + 2n]);
        assert.deepEqual([seen?.held, seen?.owner, seen?.epoch], [true, 'worker-b', granted.epoch! + 2n]);
      } else {
        assert.deepEqual(next, denied);
        assert.deepEqual(seen, { held: true, owner: 'worker-a', epoch: granted.epoch, expiresAt: granted.expiresAt });
      }
    });
  }
});

describe('waiting acquires', { concurrency: true }, () => {
  test("a blocking acquire is woken by a release in another session and never delays the holder's renew or release", async () => {
    await using iso = await Isolation.open(db.url, ['holder', 'waiter']);
    const { holder, waiter } = iso.named;
    const key = uniqueKey('woken-by-release');
    const granted = await holder.run(acquireCall(key, 'worker-a', '1 minute'));
    const waiting = waiter.start(acquireCall(key, 'worker-b', '1 minute', '30 seconds'));
    await iso.untilWaiting(waiting);

    const renewed = await holder.run(renewCall(key, 'worker-a', granted.epoch, '2 minutes'));
    assert.equal(renewed.status, 'ok', 'the holder renews while another waits');
    await iso.untilWaiting(waiting);
    assert.equal(waiting.settled, false, 'the waiter still waits after the renew');

    assert.equal((await holder.run(releaseCall(key, 'worker-a', granted.epoch))).status, 'ok');
    const releasedAt = performance.now();
    const result = await waiting.result();
    assert.equal(result.acquired, true);
    assert.equal(result.epoch, granted.epoch! + 2n);
    const afterRelease = performance.now() - releasedAt;
    assert.ok(afterRelease < 10_000, `granted ${afterRelease} ms after the release`);
  });

  test('a waiting acquire sees a lapse and takes over with the next epoch', async () => {
    await using iso = await Isolation.open(db.url, ['waiter']);
    const { waiter } = iso.named;
    const key = uniqueKey('woken-by-lapse');
    const granted = await acquire(db.pool, key, 'worker-a', '1 minute');
    const waiting = waiter.start(acquireCall(key, 'worker-b', '1 minute', '30 seconds'));
    await iso.untilWaiting(waiting);
    // Cut the lease short only now, so the lapse surely happens while the waiter waits.
    const cut = await renew(db.pool, key, 'worker-a', granted.epoch, '200 milliseconds');
    assert.equal(cut.status, 'ok');
    const result = await waiting.result();
    assert.ok(result.expiresAt! - 60_000_000n >= cut.expiresAt!, 'granted at or after the lapse');
    assert.equal(result.acquired, true);
    assert.equal(result.epoch, granted.epoch! + 1n);
    assert.equal((await renew(db.pool, key, 'worker-a', granted.epoch, '1 minute')).status, 'not_owner');
  });

  test('a waiting acquire sees a grant roll back and takes the key with the same epoch', async () => {
    await using iso = await Isolation.open(db.url, ['first', 'waiter']);
    const { first, waiter } = iso.named;
    const key = uniqueKey('waiter-vs-rollback');
    const expected = await prepare(db.pool, key, 'lapsed');

    await first.query('BEGIN');
    assert.equal((await first.run(acquireCall(key, 'worker-a', '1 minute'))).epoch, expected);
    const waiting = waiter.start(acquireCall(key, 'worker-b', '1 minute', '20 seconds'));
    await iso.untilWaiting(waiting);
    await first.query('ROLLBACK');
    const result = await waiting.result();
    assert.equal(result.acquired, true);
    assert.equal(result.epoch, expected);
  });

  test('a wait-0 acquire never sleeps', async () => {
    await using iso = await Isolation.open(db.url, ['denied']);
    const { denied } = iso.named;
    const key = uniqueKey('wait0-no-sleep');
    await acquire(db.pool, key, 'worker-a', '1 minute');
    // 300 denied calls in one statement: a poll interval slept even once per call would keep
    // the backend in a PgSleep wait for seconds, where the monitor cannot miss it.
    const many = denied.start(
      `SELECT count(*) FILTER (WHERE a.acquired) AS granted, count(*) AS calls
         FROM generate_series(1, 300) AS i
         CROSS JOIN LATERAL lease.acquire($1 || repeat('', i), 'worker-b', interval '1 minute', interval '0') AS a`,
      [key],
    );
    const sleeps: string[] = [];
    while (!many.settled) {
      const { rows } = await iso.monitor.query(
        `SELECT wait_event FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Timeout'`,
        [denied.pid],
      );
      if (rows.length > 0) sleeps.push(rows[0].wait_event);
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    const { rows } = await many.result();
    assert.deepEqual(rows, [{ granted: '0', calls: '300' }]);
    assert.deepEqual(sleeps, [], 'a wait-0 acquire was seen sleeping');
  });

  const lockHolders: {
    name: string;
    lock(session: Queryable, key: string): Promise<void>;
  }[] = [
    {
      name: "the holder's uncommitted renew",
      async lock(session, key) {
        const granted = await acquire(db.pool, key, 'worker-a', '1 minute');
        await session.query('BEGIN');
        assert.equal((await renew(session, key, 'worker-a', granted.epoch, '1 minute')).status, 'ok');
      },
    },
    {
      name: 'an uncommitted grant of a never-leased key',
      async lock(session, key) {
        await session.query('BEGIN');
        assert.equal((await acquire(session, key, 'worker-a', '1 minute')).acquired, true);
      },
    },
    {
      name: 'an uncommitted grant of a released key',
      async lock(session, key) {
        await prepare(db.pool, key, 'released');
        await session.query('BEGIN');
        assert.equal((await acquire(session, key, 'worker-a', '1 minute')).acquired, true);
      },
    },
    {
      name: "an uncommitted takeover of a lapsed lease",
      async lock(session, key) {
        await prepare(db.pool, key, 'lapsed');
        await session.query('BEGIN');
        assert.equal((await acquire(session, key, 'worker-a', '1 minute')).acquired, true);
      },
    },
    {
      name: 'an open transaction with a SELECT ... FOR UPDATE of the key row',
      async lock(session, key) {
        await acquire(db.pool, key, 'worker-a', '1 minute');
        await session.query('BEGIN');
        const { rows } = await session.query(
          `SELECT c.oid::regclass::text AS t FROM pg_class c
            WHERE c.relnamespace = 'lease'::regnamespace AND c.relkind = 'r'`,
        );
        const locked = await session.query(`SELECT 1 FROM ${rows[0]!.t} WHERE key = $1 FOR UPDATE`, [key]);
        assert.equal(locked.rowCount, 1);
      },
    },
  ];

  for (const holder of lockHolders) {
    test(`a waiting acquire still times out within its bound while ${holder.name} holds the row lock`, async () => {
      await using iso = await Isolation.open(db.url, ['locker', 'waiter']);
      const { locker, waiter } = iso.named;
      const key = uniqueKey('bounded-wait');
      await holder.lock(locker, key);
      // The wait is server time: bracket the call with server clock readings for the lower
      // bound, and use the client's monotonic clock only for the generous upper bound.
      const before = await serverNow(iso.monitor);
      const waiting = waiter.start(acquireCall(key, 'worker-b', '1 minute', '1 second'));
      await assertAcquireTimedOut(waiting, key, '1 second');
      const after = await serverNow(iso.monitor);
      assert.ok(after - before >= 1_000_000n, `gave up within ${after - before} us, before the wait`);
      assert.ok(waiting.elapsedMs < 4_000, `a 1 s wait took ${waiting.elapsedMs} ms`);
      await locker.query('COMMIT');
      assert.equal((await inspect(db.pool, key))?.owner, 'worker-a', 'the timed-out acquire left nothing');
    });
  }
});

describe('a denied acquire never delays the holder', { concurrency: true }, () => {
  test("a denied acquire whose transaction stays open does not block the holder's renew or release", async () => {
    await using iso = await Isolation.open(db.url, ['holder', 'denied']);
    const { holder, denied } = iso.named;
    const key = uniqueKey('denied-open-tx');
    const granted = await holder.run(acquireCall(key, 'worker-a', '1 minute'));

    await denied.query('BEGIN');
    const refused = await denied.run(acquireCall(key, 'worker-b', '1 minute', '0'));
    assert.equal(refused.acquired, false);
    // The denied transaction stays open while the holder works.
    const renewed = await holder.run(renewCall(key, 'worker-a', granted.epoch, '2 minutes'));
    assert.equal(renewed.status, 'ok');
    assert.equal((await holder.run(releaseCall(key, 'worker-a', granted.epoch))).status, 'ok');

    const retried = await denied.run(acquireCall(key, 'worker-b', '1 minute', '0'));
    assert.equal(retried.acquired, true, 'the open transaction sees the committed release');
    assert.equal(retried.epoch, granted.epoch! + 2n);
    await denied.query('COMMIT');
    assert.equal((await inspect(db.pool, key))?.owner, 'worker-b');
  });

  for (const state of ['never-leased', 'released', 'lapsed'] as const) {
    test(`an acquire that lost the race for a ${state} key keeps no lock while its transaction stays open`, async () => {
      await using iso = await Isolation.open(db.url, ['winner', 'loser']);
      const { winner, loser } = iso.named;
      const key = uniqueKey(`denied-race-${state}`);
      const expected = await prepare(db.pool, key, state);

      await winner.query('BEGIN');
      const won = await winner.run(acquireCall(key, 'worker-a', '1 minute'));
      assert.equal(won.epoch, expected);
      await loser.query('BEGIN');
      const lost = loser.start(acquireCall(key, 'worker-b', '1 minute', '0'));
      await iso.untilBlocked(lost, winner);
      await winner.query('COMMIT');
      assert.deepEqual(await lost.result(), { acquired: false, epoch: null, expiresAt: null });
      // The loser's transaction stays open: run() fails with StepBlockedError had it kept a lock.
      assert.equal((await winner.run(renewCall(key, 'worker-a', won.epoch, '2 minutes'))).status, 'ok');
      assert.equal((await winner.run(releaseCall(key, 'worker-a', won.epoch))).status, 'ok');
      await loser.query('COMMIT');
      assert.deepEqual(await inspect(db.pool, key), {
        held: false,
        owner: null,
        epoch: expected + 1n,
        expiresAt: null,
      });
    });
  }

  test("many denied acquires in open transactions do not block the holder's renew", async () => {
    await using iso = await Isolation.open(db.url, ['holder', 'd1', 'd2', 'd3']);
    const [holder, ...deniers] = iso.sessions as [Session, ...Session[]];
    const key = uniqueKey('denied-many');
    const granted = await holder.run(acquireCall(key, 'worker-a', '1 minute'));
    for (const session of deniers) {
      await session.query('BEGIN');
      assert.equal((await session.run(acquireCall(key, `worker-${session.name}`, '1 minute'))).acquired, false);
    }
    for (let i = 0; i < 3; i++) {
      assert.equal((await holder.run(renewCall(key, 'worker-a', granted.epoch, '1 minute'))).status, 'ok');
    }
    assert.equal((await holder.run(releaseCall(key, 'worker-a', granted.epoch))).status, 'ok');
    for (const session of deniers) await session.query('COMMIT');
  });

  test("a denied same-owner renew or wrong-epoch release in an open transaction does not block the holder", async () => {
    await using iso = await Isolation.open(db.url, ['holder', 'stranger']);
    const { holder, stranger } = iso.named;
    const key = uniqueKey('denied-renew-open-tx');
    const granted = await holder.run(acquireCall(key, 'worker-a', '1 minute'));
    await stranger.query('BEGIN');
    assert.equal((await stranger.run(renewCall(key, 'worker-b', granted.epoch, '1 minute'))).status, 'not_owner');
    assert.equal((await stranger.run(releaseCall(key, 'worker-b', granted.epoch))).status, 'not_owner');
    assert.equal((await holder.run(renewCall(key, 'worker-a', granted.epoch, '1 minute'))).status, 'ok');
    assert.equal((await holder.run(releaseCall(key, 'worker-a', granted.epoch))).status, 'ok');
    await stranger.query('COMMIT');
  });
});

describe('distinct keys never interact', { concurrency: true }, () => {
  test('an open transaction holding key A does not block any operation on key B', async () => {
    await using iso = await Isolation.open(db.url, ['onA', 'onNewA', 'onB']);
    const { onA, onNewA, onB } = iso.named;
    const keyA = uniqueKey('isolation-A');
    const newKeyA = uniqueKey('isolation-newA');
    const keyB = uniqueKey('isolation-B');
    const a = await acquire(db.pool, keyA, 'worker-a', '1 minute');
    await onA.query('BEGIN');
    assert.equal((await onA.run(renewCall(keyA, 'worker-a', a.epoch, '1 minute'))).status, 'ok');
    await onNewA.query('BEGIN');
    assert.equal((await onNewA.run(acquireCall(newKeyA, 'worker-a', '1 minute'))).acquired, true);

    const b = await onB.run(acquireCall(keyB, 'worker-b', '1 minute'));
    assert.equal(b.epoch, 1n, "key A's epochs do not count for key B");
    assert.equal((await onB.run(acquireCall(keyB, 'worker-b', '1 minute', '5 seconds'))).epoch, 1n);
    assert.equal((await onB.run(renewCall(keyB, 'worker-b', b.epoch, '1 minute'))).status, 'ok');
    assert.equal((await onB.run(inspectCall(keyA)))?.held, true);
    assert.equal(await onB.run(inspectCall(newKeyA)), undefined, 'uncommitted, never-leased');
    assert.equal((await onB.run(releaseCall(keyB, 'worker-b', b.epoch))).status, 'ok');
    assert.equal((await onB.run(acquireCall(keyB, 'worker-c', '1 minute'))).epoch, 3n);

    // The open transactions hold no advisory lock and no table lock beyond row-level modes.
    const { rows } = await iso.monitor.query<{ locktype: string; mode: string; relation: string | null }>(
      `SELECT locktype, mode, relation::regclass::text AS relation
         FROM pg_locks WHERE pid = ANY($1) AND granted`,
      [[onA.pid, onNewA.pid]],
    );
    for (const lock of rows) {
      assert.notEqual(lock.locktype, 'advisory', 'no advisory locks');
      if (lock.locktype === 'relation') {
        assert.ok(
          ['AccessShareLock', 'RowShareLock', 'RowExclusiveLock'].includes(lock.mode),
          `${lock.mode} on ${lock.relation} would block other keys`,
        );
      }
    }
    await onA.query('COMMIT');
    await onNewA.query('COMMIT');
  });

  test('a waiting acquire on key A does not block key B', async () => {
    await using iso = await Isolation.open(db.url, ['waiter', 'onB']);
    const { waiter, onB } = iso.named;
    const keyA = uniqueKey('waiting-A');
    const keyB = uniqueKey('waiting-B');
    await acquire(db.pool, keyA, 'worker-a', '1 minute');
    const waiting = waiter.start(acquireCall(keyA, 'worker-b', '1 minute', '3 seconds'));
    await iso.untilWaiting(waiting);
    const b = await onB.run(acquireCall(keyB, 'worker-b', '1 minute'));
    assert.equal(b.acquired, true);
    assert.equal((await onB.run(renewCall(keyB, 'worker-b', b.epoch, '1 minute'))).status, 'ok');
    assert.equal((await onB.run(releaseCall(keyB, 'worker-b', b.epoch))).status, 'ok');
    await assertAcquireTimedOut(waiting, keyA, '3 seconds');
  });

  test('operations on keys sharing a prefix or differing in case are independent', async () => {
    const base = uniqueKey('family');
    const keys = [base, `${base} `, `${base}x`, base.toUpperCase(), `${base}é`];
    const grants = await Promise.all(keys.map((key) => acquire(db.pool, key, `owner-${key}`, '1 minute')));
    for (const grant of grants) assert.deepEqual([grant.acquired, grant.epoch], [true, 1n]);
    await release(db.pool, keys[0]!, `owner-${keys[0]}`, 1n);
    for (const key of keys.slice(1)) assert.equal((await inspect(db.pool, key))?.owner, `owner-${key}`);
  });
});

describe('REPEATABLE READ and SERIALIZABLE never grant wrongly', { concurrency: true }, () => {
  for (const level of ['REPEATABLE READ', 'SERIALIZABLE'] as const) {
    for (const state of ['never-leased', 'released', 'lapsed'] as const) {
      test(`under ${level}, an acquire of a ${state} key granted to another after the snapshot is denied or fails with 40001`, async () => {
        await using iso = await Isolation.open(db.url, ['stale', 'other']);
        const { stale, other } = iso.named;
        const key = uniqueKey(`rr-${state}`);
        await prepare(db.pool, key, state);

        await stale.query(`BEGIN ISOLATION LEVEL ${level}`);
        const snapshotView = await stale.run(inspectCall(key));
        assert.ok(!snapshotView?.held, 'the snapshot sees the key acquirable');
        const winner = await other.run(acquireCall(key, 'worker-b', '1 minute'));
        assert.equal(winner.acquired, true);

        const attempt = stale.start(acquireCall(key, 'worker-a', '1 minute', '0'));
        try {
          const result = await attempt.result();
          assert.deepEqual(result, { acquired: false, epoch: null, expiresAt: null });
        } catch (error) {
          assert.equal((error as { code?: string }).code, '40001', String(error));
        }
        await stale.query('ROLLBACK');
        const seen = await inspect(db.pool, key);
        assert.equal(seen?.owner, 'worker-b');
        assert.equal(seen?.epoch, winner.epoch);
      });
    }

    test(`under ${level}, an acquire after a release it cannot see never reuses an epoch`, async () => {
      await using iso = await Isolation.open(db.url, ['stale', 'holder']);
      const { stale, holder } = iso.named;
      const key = uniqueKey('rr-release');
      const granted = await holder.run(acquireCall(key, 'worker-b', '1 minute'));

      await stale.query(`BEGIN ISOLATION LEVEL ${level}`);
      assert.equal((await stale.run(inspectCall(key)))?.held, true);
      assert.equal((await holder.run(releaseCall(key, 'worker-b', granted.epoch))).status, 'ok');
      const attempt = stale.start(acquireCall(key, 'worker-a', '1 minute', '0'));
      let committedGrant: bigint | undefined;
      try {
        const result = await attempt.result();
        if (result.acquired) {
          assert.ok(result.epoch! > granted.epoch! + 1n, `granted stale epoch ${result.epoch}`);
          committedGrant = result.epoch!;
        } else {
          assert.deepEqual(result, { acquired: false, epoch: null, expiresAt: null });
        }
        await stale.query('COMMIT');
      } catch (error) {
        assert.equal((error as { code?: string }).code, '40001', String(error));
        await stale.query('ROLLBACK');
      }
      const seen = await inspect(db.pool, key);
      if (committedGrant === undefined) assert.equal(seen?.held, false);
      else assert.deepEqual([seen?.owner, seen?.epoch], ['worker-a', committedGrant]);
    });

    test(`under ${level}, a renew after a takeover it cannot see never reports ok`, async () => {
      await using iso = await Isolation.open(db.url, ['stale', 'taker']);
      const { stale, taker } = iso.named;
      const key = uniqueKey('rr-renew');
      const old = await acquire(db.pool, key, 'worker-a', '300 milliseconds');
      await sleepPast(db.pool, old.expiresAt);

      await stale.query(`BEGIN ISOLATION LEVEL ${level}`);
      assert.equal((await stale.run(inspectCall(key)))?.held, false);
      assert.equal((await taker.run(acquireCall(key, 'worker-b', '1 minute'))).acquired, true);
      try {
        const result = await stale.run(renewCall(key, 'worker-a', old.epoch, '1 minute'));
        assert.notEqual(result.status, 'ok');
        assert.equal(result.expiresAt, null);
      } catch (error) {
        assert.equal((error as { code?: string }).code, '40001', String(error));
      }
      await stale.query('ROLLBACK');
      assert.equal((await inspect(db.pool, key))?.owner, 'worker-b');
    });
  }
});

describe('REPEATABLE READ and SERIALIZABLE: the outcome of each interleaving', { concurrency: true }, () => {
  test('under REPEATABLE READ, a key released after the snapshot is still seen held: denied, nothing changes', async () => {
    await using iso = await Isolation.open(db.url, ['stale', 'holder']);
    const { stale, holder } = iso.named;
    const key = uniqueKey('rr-denied');
    const granted = await holder.run(acquireCall(key, 'worker-a', '1 minute'));
    await stale.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
    assert.equal((await stale.run(inspectCall(key)))?.held, true);
    assert.equal((await holder.run(releaseCall(key, 'worker-a', granted.epoch))).status, 'ok');
    assert.deepEqual(await stale.run(acquireCall(key, 'worker-b', '1 minute', '0')), {
      acquired: false,
      epoch: null,
      expiresAt: null,
    });
    await stale.query('COMMIT');
    assert.deepEqual(await inspect(db.pool, key), {
      held: false,
      owner: null,
      epoch: granted.epoch! + 1n,
      expiresAt: null,
    });
  });

  test('under REPEATABLE READ, a released key granted to another after the snapshot fails the acquire with 40001', async () => {
    await using iso = await Isolation.open(db.url, ['stale', 'other']);
    const { stale, other } = iso.named;
    const key = uniqueKey('rr-40001');
    const expected = await prepare(db.pool, key, 'released');
    await stale.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
    assert.equal((await stale.run(inspectCall(key)))?.held, false);
    const winner = await other.run(acquireCall(key, 'worker-a', '1 minute'));
    assert.equal(winner.epoch, expected);
    const error = await stale.start(acquireCall(key, 'worker-b', '1 minute', '0')).error();
    assert.equal(error.code, '40001', error.message);
    await stale.query('ROLLBACK');
    assert.deepEqual(await inspect(db.pool, key), {
      held: true,
      owner: 'worker-a',
      epoch: expected,
      expiresAt: winner.expiresAt,
    });
  });

  for (const level of ['REPEATABLE READ', 'SERIALIZABLE'] as const) {
    test(`under ${level}, a same-owner acquire whose snapshot predates a release and a new grant fails with 40001`, async () => {
      await using iso = await Isolation.open(db.url, ['stale', 'other']);
      const { stale, other } = iso.named;
      const key = uniqueKey('rr-same-owner');
      const granted = await acquire(db.pool, key, 'worker-a', '1 minute');
      await stale.query(`BEGIN ISOLATION LEVEL ${level}`);
      assert.equal((await stale.run(inspectCall(key)))?.owner, 'worker-a');
      assert.equal((await other.run(releaseCall(key, 'worker-a', granted.epoch))).status, 'ok');
      const taken = await other.run(acquireCall(key, 'worker-b', '1 minute'));
      assert.equal(taken.epoch, granted.epoch! + 2n);
      const error = await stale.start(acquireCall(key, 'worker-a', '1 minute', '0')).error();
      assert.equal(error.code, '40001', error.message);
      await stale.query('ROLLBACK');
      assert.deepEqual(await inspect(db.pool, key), {
        held: true,
        owner: 'worker-b',
        epoch: taken.epoch,
        expiresAt: taken.expiresAt,
      });
    });
  }

  test('under REPEATABLE READ, a same-owner acquire with nothing changed since the snapshot confirms the grant', async () => {
    await using iso = await Isolation.open(db.url, ['reader']);
    const { reader } = iso.named;
    const key = uniqueKey('rr-same-owner-quiet');
    const granted = await acquire(db.pool, key, 'worker-a', '1 minute');
    await reader.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
    assert.equal((await reader.run(inspectCall(key)))?.owner, 'worker-a');
    assert.deepEqual(await reader.run(acquireCall(key, 'worker-a', '1 minute', '0')), granted);
    await reader.query('COMMIT');
    assert.deepEqual(await inspect(db.pool, key), {
      held: true,
      owner: 'worker-a',
      epoch: granted.epoch,
      expiresAt: granted.expiresAt,
    });
  });
});
