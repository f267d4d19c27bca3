/**
 * The client's batches: acquireMany, the shared keep-alive that renews every handle of a
 * client with one lease.renew_many per owner and ttl, and prepared statements (named, on by
 * default; off for poolers in transaction mode).
 */
import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import {
  LeaseClient,
  LeaseLostError,
  subscribeLeaseEvents,
  type AcquireLateEvent,
  type Lease,
} from '../../src/index.js';
import { MAX_BATCH_KEYS } from '../../src/sql/statements.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { abortReason, uniqueKey, waitFor } from '../support/helpers.js';

let db: TestDatabase;
before(async () => {
  db = await createTestDatabase();
});
after(() => db.close());

/** A pool whose connections record the text of every statement they send. */
function recordingPool(): { pool: pg.Pool; sent: string[]; sentAt: number[] } {
  const sent: string[] = [];
  const sentAt: number[] = [];
  class RecordingClient extends pg.Client {
    override query(...args: unknown[]): never {
      const first = args[0] as string | { text?: string };
      sent.push(typeof first === 'string' ? first : (first.text ?? ''));
      sentAt.push(performance.now());
      return (super.query as (...a: unknown[]) => never)(...args);
    }
  }
  const pool = new pg.Pool({ connectionString: db.url, max: 4, Client: RecordingClient });
  pool.on('error', () => undefined);
  return { pool, sent, sentAt };
}

const renewsIn = (sent: string[]) => ({
  single: sent.filter((t) => t.includes('lease.renew(')).length,
  batched: sent.filter((t) => t.includes('lease.renew_many(')).length,
});

describe('acquireMany', () => {
  test('grants free keys, denies held ones, in the order given, each handle on its own', async () => {
    const client = new LeaseClient(db.pool);
    const keys = [uniqueKey('m'), uniqueKey('m'), uniqueKey('m')];
    const other = await client.acquire(keys[1]!, { ttl: '1 min', owner: 'someone-else' });
    const leases = await client.acquireMany(keys, { ttl: '1 min', owner: 'worker-7' });
    assert.deepEqual(
      leases.map((l) => l?.key ?? null),
      [keys[0], null, keys[2]],
    );
    assert.deepEqual(
      leases.map((l) => l?.epoch ?? null),
      [1n, null, 1n],
    );
    assert.equal(leases[0]!.owner, 'worker-7');
    // Each handle renews and releases for itself.
    await leases[0]!.renew();
    assert.equal(await leases[0]!.release(), 'ok');
    assert.equal(leases[2]!.signal.aborted, false);
    assert.equal((await client.inspect(keys[2]!))?.owner, 'worker-7');
    assert.equal(await leases[2]!.release(), 'ok');
    await other!.release();
  });

  /** 10001 keys, two statements; the second waits on the last key's row, which `blocker` inserts uncommitted. */
  async function blockedSecondStatement(prefix: string) {
    const keys = Array.from({ length: 10_001 }, (_, i) => `${uniqueKey(prefix)}-${i}`);
    const blocker = await db.pool.connect();
    await blocker.query('BEGIN');
    await blocker.query("SELECT lease.acquire($1, 'blocker', '1 hour')", [keys[10_000]]);
    return { keys, blocker };
  }

  test('the first statement’s handles are kept alive while a later one of the same call waits', async () => {
    const client = new LeaseClient(db.pool);
    const { keys, blocker } = await blockedSecondStatement('early');
    const expiry = async () =>
      (
        await db.pool.query<{ at: Date | null }>(
          "SELECT expires_at AS at FROM lease.leases WHERE key = $1 AND owner = 'early'",
          [keys[0]],
        )
      ).rows[0]?.at?.getTime();
    try {
      const acquiring = client.acquireMany(keys, {
        ttl: '1 min',
        owner: 'early',
        keepAlive: { interval: '300ms' },
      });
      await waitFor(
        'the first statement granted its keys',
        async () => (await expiry()) !== undefined,
      );
      const granted = (await expiry())!;
      // The second statement still waits on the blocker's row; the first keys renew meanwhile.
      await waitFor('a renewal of the first keys', async () => (await expiry())! > granted);
      await blocker.query('COMMIT');
      const leases = await acquiring;
      assert.equal(leases[10_000], null, 'the blocker committed the last key first');
      const lost = leases.slice(0, 10_000).filter((lease) => lease === null || lease.lost);
      assert.equal(lost.length, 0, String(lost[0]?.lost));
      const statuses = await Promise.all(leases.slice(0, 10_000).map((lease) => lease!.release()));
      assert.ok(statuses.every((status) => status === 'ok'));
    } finally {
      await blocker.query('ROLLBACK').catch(() => undefined);
      blocker.release();
    }
  });

  test('when a later statement fails, the keys granted before it are released and the error is thrown', async () => {
    // lock_timeout fails the second statement, which waits on a row; the first waits on none.
    const pool = new pg.Pool({ connectionString: db.url, max: 2, options: '-c lock_timeout=300' });
    const client = new LeaseClient(pool);
    const { keys, blocker } = await blockedSecondStatement('fails');
    try {
      await assert.rejects(client.acquireMany(keys, { ttl: '1 hour', owner: 'fails' }), {
        code: '55P03',
      });
      for (const key of [keys[0]!, keys[9_999]!]) {
        const state = await client.inspect(key);
        assert.deepEqual([state?.held, state?.epoch], [false, 2n], `${key} released`);
      }
    } finally {
      await blocker.query('ROLLBACK');
      blocker.release();
      await pool.end();
    }
  });

  test('the options are checked as acquire checks them, also for an empty list of keys', async () => {
    const client = new LeaseClient(db.pool);
    const key = uniqueKey('opts');
    await assert.rejects(client.acquireMany([key], { ttl: '1s', keepAlive: { interval: '5s' } }), {
      name: 'LeaseInvalidInputError',
      detail: /keepAlive.interval must be shorter than the ttl/,
    });
    await assert.rejects(client.acquireMany([], { ttl: 'soon' }), {
      name: 'LeaseInvalidInputError',
      detail: /ttl "soon" is not a duration/,
    });
    await assert.rejects(client.acquireMany([key, ''], { ttl: '1s' }), {
      name: 'LeaseInvalidInputError',
      detail: /key must be a non-empty string/,
    });
    assert.equal(await client.inspect(key), null);
  });

  test('a repeated key is invalid input and grants nothing', async () => {
    const client = new LeaseClient(db.pool);
    const key = uniqueKey('dup');
    await assert.rejects(client.acquireMany([key, key], { ttl: '1 min' }), {
      name: 'LeaseInvalidInputError',
    });
    assert.equal(await client.inspect(key), null);
  });
});

describe('acquireMany answered late', () => {
  /**
   * `count` keys whose byte order is their order here; `blocker` inserts the one at `blocked`
   * (default: the last) in an open transaction, so acquire_many grants the keys before it,
   * then waits for it, then grants the rest. The blocked key's grant counts from the clock
   * reading its acquire made before the wait (SEMANTICS §4 batches).
   */
  async function keyBlocked(prefix: string, count: number, blocked = count - 1) {
    const base = uniqueKey(prefix);
    const keys = Array.from({ length: count }, (_, i) => `${base}-${String(i).padStart(3, '0')}`);
    const blocker = await db.pool.connect();
    await blocker.query('BEGIN');
    await blocker.query("SELECT lease.acquire($1, 'blocker', '1 hour')", [keys[blocked]]);
    return { keys, blocker };
  }

  const waitingForTheBlocker = () =>
    waitFor('acquire_many waits for the blocker’s row', async () => {
      const { rows } = await db.pool.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM pg_stat_activity
          WHERE datname = current_database() AND wait_event_type = 'Lock'
            AND query LIKE '%lease.acquire_many(%'`,
      );
      return rows[0]!.n > 0;
    });

  /** Records acquireLate events of `owner`, and whether the call had resolved when each came. */
  function lateEvents(owner: string) {
    const seen: { event: AcquireLateEvent; afterReturn: boolean }[] = [];
    let returned = false;
    const stop = subscribeLeaseEvents({
      acquireLate: (event) => {
        if (event.owner === owner) seen.push({ event, afterReturn: returned });
      },
    });
    return {
      seen,
      returned: () => {
        returned = true;
        stop();
      },
    };
  }

  const heldBy = async (owner: string, keys: string[]) =>
    (
      await db.pool.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM lease.leases
          WHERE key = ANY($1) AND owner = $2 AND expires_at > clock_timestamp()`,
        [keys, owner],
      )
    ).rows[0]!.n;

  test('a grant that ran out before the answer arrived is not handed back: null, released, and the caller is told', async () => {
    const client = new LeaseClient(db.pool);
    const owner = `late-${uniqueKey('o')}`;
    const { keys, blocker } = await keyBlocked('late', 20);
    const late = lateEvents(owner);
    try {
      const acquiring = client.acquireMany(keys, { ttl: '1s', owner });
      await waitingForTheBlocker();
      // The first grants' 1 s ttl runs out more than twice over while the statement waits.
      await sleep(2_500);
      await blocker.query('ROLLBACK');
      const leases = await acquiring;
      late.returned();
      const lost = leases.filter((lease) => lease?.lost);
      assert.equal(lost.length, 0, `handed back lost: ${String(lost[0]?.lost)}`);
      // Every handle of the statement counts from its earliest grant, which ran out.
      assert.deepEqual(leases, Array(20).fill(null));
      assert.equal(late.seen.length, 1, 'one acquireLate event');
      const { event, afterReturn } = late.seen[0]!;
      assert.equal(afterReturn, false, 'told before the call returned');
      assert.equal(event.renewed, false);
      assert.ok(event.remainingMs <= 0, `remainingMs ${event.remainingMs}`);
      assert.deepEqual([...event.expired].sort(), keys);
      // Nothing is left held: whatever the server still listed was released.
      assert.equal(await heldBy(owner, keys), 0);
      assert.equal((await client.inspect(keys[19]!))?.held, false);
    } finally {
      late.returned();
      await blocker.query('ROLLBACK').catch(() => undefined);
      blocker.release();
    }
  });

  test('with keepAlive, grants at risk are renewed before the call returns, and the caller is told', async () => {
    const client = new LeaseClient(db.pool);
    const owner = `risk-${uniqueKey('o')}`;
    const { keys, blocker } = await keyBlocked('risk', 20);
    const late = lateEvents(owner);
    let leases: (Lease | null)[] = [];
    try {
      const acquiring = client.acquireMany(keys, { ttl: '6s', owner, keepAlive: true });
      await waitingForTheBlocker();
      // Over half of the first grants' ttl passes: their keep-alive renewal (a third) is due.
      await sleep(3_500);
      await blocker.query('ROLLBACK');
      leases = await acquiring;
      late.returned();
      assert.equal(late.seen.length, 1, 'one acquireLate event');
      const { event, afterReturn } = late.seen[0]!;
      assert.equal(afterReturn, false, 'told before the call returned');
      assert.equal(event.renewed, true);
      assert.ok(event.remainingMs < 4_000, `remainingMs ${event.remainingMs}`);
      assert.deepEqual(event.expired, []);
      for (const lease of leases) {
        assert.ok(lease, 'every key granted');
        assert.equal(lease.lost, undefined, String(lease.lost));
        // Renewed from a fresh send: more is left now than the statement's grants had.
        assert.ok(lease.remainingMs() > event.remainingMs, `${lease.remainingMs()} ms left`);
      }
      assert.equal(await heldBy(owner, keys), 20);
    } finally {
      late.returned();
      await blocker.query('ROLLBACK').catch(() => undefined);
      blocker.release();
      await Promise.all(leases.map((lease) => lease?.release()));
    }
  });

  test('with keepAlive, the renewal before the call returns finds which grants ran out: those are null, the rest held', async () => {
    const client = new LeaseClient(db.pool);
    const owner = `lapsed-${uniqueKey('o')}`;
    const { keys, blocker } = await keyBlocked('lapsed', 20, 9);
    const late = lateEvents(owner);
    let leases: (Lease | null)[] = [];
    try {
      const acquiring = client.acquireMany(keys, { ttl: '2s', owner, keepAlive: true });
      await waitingForTheBlocker();
      // The first ten grants run out on the server; the last ten are granted after the wait.
      await sleep(4_500);
      await blocker.query('ROLLBACK');
      leases = await acquiring;
      late.returned();
      const lost = leases.filter((lease) => lease?.lost);
      assert.equal(lost.length, 0, `handed back lost: ${String(lost[0]?.lost)}`);
      assert.deepEqual(
        leases.map((lease) => lease?.key ?? null),
        [...Array(10).fill(null), ...keys.slice(10)],
      );
      const { event, afterReturn } = late.seen[0]!;
      assert.equal(afterReturn, false, 'told before the call returned');
      assert.equal(event.renewed, true);
      assert.deepEqual([...event.expired].sort(), keys.slice(0, 10));
      assert.equal(await heldBy(owner, keys), 10);
    } finally {
      late.returned();
      await blocker.query('ROLLBACK').catch(() => undefined);
      blocker.release();
      await Promise.all(leases.map((lease) => lease?.release()));
    }
  });

  test('an answer in good time publishes no acquireLate event', async () => {
    const client = new LeaseClient(db.pool);
    const owner = `prompt-${uniqueKey('o')}`;
    const late = lateEvents(owner);
    const keys = Array.from({ length: 5 }, () => uniqueKey('prompt'));
    const leases = await client.acquireMany(keys, { ttl: '1 min', owner, keepAlive: true });
    late.returned();
    assert.equal(late.seen.length, 0);
    await Promise.all(leases.map((lease) => lease?.release()));
  });
});

describe('releaseMany', () => {
  const statementsIn = (sent: string[]) => ({
    batched: sent.filter((t) => t.includes('lease.release_many(')).length,
    single: sent.filter((t) => t.includes('lease.release(')).length,
  });

  test('more handles than one statement takes: one release_many per chunk, every status in order', async () => {
    const { pool, sent } = recordingPool();
    const client = new LeaseClient(pool);
    try {
      const keys = Array.from({ length: MAX_BATCH_KEYS + 5 }, () => uniqueKey('rm'));
      const leases = (await client.acquireMany(keys, {
        ttl: '1 min',
        owner: 'worker-rm',
        keepAlive: true,
      })) as Lease[];
      sent.length = 0;
      const statuses = await client.releaseMany(leases);
      assert.equal(statuses.length, keys.length);
      assert.ok(
        statuses.every((status) => status === 'ok'),
        String(statuses.find((s) => s !== 'ok')),
      );
      assert.deepEqual(statementsIn(sent), { batched: 2, single: 0 });
      for (const lease of [leases[0]!, leases.at(-1)!])
        assert.equal((lease.signal.reason as { code?: string }).code, 'lease_released');
      const { rows } = await db.pool.query<{ n: number }>(
        'SELECT count(*)::int AS n FROM lease.leases WHERE key = ANY($1) AND owner IS NOT NULL',
        [keys],
      );
      assert.equal(rows[0]!.n, 0);
      // Released already: the handle answers its release again without a statement.
      sent.length = 0;
      assert.equal(await leases[7]!.release(), 'ok');
      assert.deepEqual(statementsIn(sent), { batched: 0, single: 0 });
    } finally {
      await pool.end();
    }
  });

  test('mixed owners, lost and released handles: one statement per owner, each handle’s own answer, keep-alive stopped', async () => {
    const { pool, sent } = recordingPool();
    const client = new LeaseClient(pool);
    try {
      const keepAlive = { interval: '200ms' };
      const [a1, a2, a3, stolen] = (await client.acquireMany(
        Array.from({ length: 4 }, () => uniqueKey('mix-a')),
        { ttl: '1 min', owner: 'owner-a', keepAlive },
      )) as Lease[];
      const [b1, b2, released] = (await client.acquireMany(
        Array.from({ length: 3 }, () => uniqueKey('mix-b')),
        { ttl: '1 min', owner: 'owner-b', keepAlive },
      )) as Lease[];
      assert.equal(await released!.release(), 'ok');
      // Lapsed: a 200 ms grant without keep-alive, well past its expiry.
      const lapsed = (await client.acquire(uniqueKey('mix-a'), {
        ttl: '200ms',
        owner: 'owner-a',
      }))!;
      await abortReason(lapsed.signal);
      await sleep(400);
      // Taken over: released behind the handle's back and granted to someone else.
      await db.pool.query('SELECT lease.release($1, $2, $3)', [
        stolen!.key,
        stolen!.owner,
        stolen!.epoch.toString(),
      ]);
      await db.pool.query("SELECT lease.acquire($1, 'thief', '1 min')", [stolen!.key]);

      sent.length = 0;
      const statuses = await client.releaseMany([
        a1!,
        b1!,
        lapsed,
        a2!,
        released!,
        b2!,
        stolen!,
        a3!,
      ]);
      assert.deepEqual(statuses, ['ok', 'ok', 'lapsed', 'ok', 'ok', 'ok', 'not_owner', 'ok']);
      // owner-a: a1, lapsed, a2, stolen, a3; owner-b: b1, b2 (released sends nothing again).
      assert.deepEqual(statementsIn(sent), { batched: 2, single: 0 });
      sent.length = 0;
      await sleep(700); // several keep-alive intervals
      assert.equal(sent.filter((t) => /lease\.renew/.test(t)).length, 0, 'keep-alive stopped');
      assert.equal((await client.inspect(stolen!.key))?.owner, 'thief');
    } finally {
      await pool.end();
    }
  });

  test('a handle of another client, a repeated handle or a non-handle is invalid input and changes nothing', async () => {
    const { pool, sent } = recordingPool();
    const client = new LeaseClient(pool);
    const other = new LeaseClient(db.pool);
    try {
      const [mine, alsoMine] = (await client.acquireMany([uniqueKey('bad'), uniqueKey('bad')], {
        ttl: '1 min',
        owner: 'worker-bad',
        keepAlive: true,
      })) as Lease[];
      const theirs = (await other.acquire(uniqueKey('bad'), { ttl: '1 min' }))!;
      sent.length = 0;
      await assert.rejects(client.releaseMany([mine!, theirs]), {
        name: 'LeaseInvalidInputError',
        detail: 'each entry must be a lease handle of this client: leases[1]',
      });
      await assert.rejects(client.releaseMany([mine!, alsoMine!, mine!]), {
        name: 'LeaseInvalidInputError',
        detail: 'leases must be distinct: leases[2] repeats leases[0]',
      });
      await assert.rejects(
        client.releaseMany([
          mine!,
          { key: mine!.key } as unknown as Lease,
          null as unknown as Lease,
        ]),
        {
          name: 'LeaseInvalidInputError',
          detail: 'each entry must be a lease handle of this client: leases[1], leases[2]',
        },
      );
      assert.deepEqual(sent, [], 'nothing sent');
      for (const lease of [mine!, alsoMine!, theirs]) {
        assert.equal(lease.signal.aborted, false);
        assert.equal(
          (
            await db.pool.query(
              'SELECT 1 FROM lease.leases WHERE key = $1 AND owner = $2 AND expires_at > clock_timestamp()',
              [lease.key, lease.owner],
            )
          ).rowCount,
          1,
        );
      }
      assert.deepEqual(await client.releaseMany([]), []);
      assert.deepEqual(await client.releaseMany([alsoMine!, mine!]), ['ok', 'ok']);
      assert.equal(await theirs.release(), 'ok');
    } finally {
      await pool.end();
    }
  });
});

describe('shared keep-alive', () => {
  test('renews all live handles of one owner and ttl with renew_many, past several ttls', async () => {
    const { pool, sent } = recordingPool();
    const client = new LeaseClient(pool);
    try {
      const keys = Array.from({ length: 25 }, () => uniqueKey('ka'));
      const leases = (await client.acquireMany(keys, {
        ttl: '1500ms',
        owner: 'worker-ka',
        keepAlive: true,
      })) as Lease[];
      sent.length = 0;
      await sleep(4_000); // more than two ttls: without renewals every lease would be lost
      for (const lease of leases) assert.equal(lease.signal.aborted, false, String(lease.lost));
      const { single, batched } = renewsIn(sent);
      assert.ok(batched >= 2, `renew_many statements: ${batched}`);
      assert.equal(single, 0, 'no handle renewed on its own');
      const { rows } = await db.pool.query(
        `SELECT count(*)::int AS n FROM lease.leases
          WHERE key = ANY($1) AND owner = 'worker-ka' AND expires_at > clock_timestamp()`,
        [keys],
      );
      assert.equal(rows[0].n, 25);
      await Promise.all(leases.map((l) => l.release()));
    } finally {
      await pool.end();
    }
  });

  test('renews once per interval, a sixteenth early: not a third more often', async () => {
    const { pool, sent, sentAt } = recordingPool();
    const client = new LeaseClient(pool);
    try {
      const keys = Array.from({ length: 20 }, () => uniqueKey('cadence'));
      const leases = (await client.acquireMany(keys, {
        ttl: '1 min',
        owner: 'worker-cadence',
        keepAlive: { interval: '400ms' },
      })) as Lease[];
      sent.length = 0;
      sentAt.length = 0;
      await sleep(4_500);
      const at = sentAt.filter((_, i) => sent[i]!.includes('lease.renew_many('));
      assert.equal(renewsIn(sent).single, 0);
      const gaps = at.slice(1).map((t, i) => t - at[i]!);
      const median = gaps.sort((a, b) => a - b)[Math.floor(gaps.length / 2)]!;
      // 375 ms (15/16 of 400) in steady state, counted from the server's clock reading of each
      // renewal, which comes before its answer by the statement's own run time (since 0.2.1 a
      // batch renews its keys one after the other, 20 of them taking tens of ms on a loaded
      // machine); late timers only add to it. A third more often would be 267 ms.
      assert.ok(gaps.length >= 5, `${gaps.length + 1} renewals`);
      assert.ok(median >= 290 && median <= 450, `median gap ${median.toFixed(0)} ms`);
      await Promise.all(leases.map((l) => l.release()));
    } finally {
      await pool.end();
    }
  });

  test('a handle whose renewal is still out sends no other: nothing piles up behind a blocked one', async () => {
    const { pool, sent, sentAt } = recordingPool();
    const client = new LeaseClient(pool);
    const blocker = await db.pool.connect();
    try {
      const keys = Array.from({ length: 5 }, () => uniqueKey('inflight'));
      const leases = (await client.acquireMany(keys, {
        ttl: '1 min',
        owner: 'worker-inflight',
        keepAlive: { interval: '200ms' },
      })) as Lease[];
      // Another transaction holds one key's row, through about seven intervals. The group's
      // renew_many skips it (skip_locked), and renews that key alone with lease.renew, which
      // waits for the row; the others renew on meanwhile.
      sent.length = 0;
      sentAt.length = 0;
      await blocker.query('BEGIN');
      await blocker.query('SELECT 1 FROM lease.leases WHERE key = $1 FOR UPDATE', [keys[2]]);
      await sleep(1_500);
      const { single, batched } = renewsIn(sent);
      assert.ok(single <= 1, `${single} single renews sent while the key was locked`);
      assert.ok(batched >= 3, `${batched} renew_many statements while one key was locked`);
      sent.length = 0;
      sentAt.length = 0;
      const unblockedAt = performance.now();
      await blocker.query('ROLLBACK');
      await sleep(150);
      const burst = sent.filter(
        (text, i) => sentAt[i]! - unblockedAt < 150 && text.includes('lease.renew('),
      );
      // Queued renewals of the blocked key would all go out now, one per missed tick.
      assert.ok(burst.length <= 1, `${burst.length} single renews right after the unblock`);
      await sleep(600);
      assert.ok(renewsIn(sent).batched >= 2, 'the group renews on, an interval after the answer');
      for (const lease of leases) assert.equal(lease.lost, undefined, String(lease.lost));
      await Promise.all(leases.map((l) => l.release()));
    } finally {
      await blocker.query('ROLLBACK');
      blocker.release();
      await pool.end();
    }
  });

  test('renewals answered slower than the interval follow each other at once, and the leases hold', async () => {
    // Every renew_many is held back 450 ms before it is sent: longer than 15/16 of the 400 ms
    // interval, so each renewal is still out when the next falls due. Counted from the send,
    // waiting another interval after the answer would lapse the 1.2 s ttl.
    class SlowClient extends pg.Client {
      override query(...args: unknown[]): never {
        const first = args[0] as string | { text?: string };
        const text = typeof first === 'string' ? first : (first.text ?? '');
        const send = () => (super.query as (...a: unknown[]) => never)(...args);
        if (!text.includes('lease.renew_many(')) return send();
        return new Promise((resolve) => setTimeout(resolve, 450)).then(send) as never;
      }
    }
    const pool = new pg.Pool({ connectionString: db.url, max: 4, Client: SlowClient });
    pool.on('error', () => undefined);
    const client = new LeaseClient(pool);
    try {
      const keys = Array.from({ length: 3 }, () => uniqueKey('slow'));
      const leases = (await client.acquireMany(keys, {
        ttl: '1200ms',
        owner: 'worker-slow',
        keepAlive: true,
      })) as Lease[];
      await sleep(4_000);
      for (const lease of leases) assert.equal(lease.lost, undefined, String(lease.lost));
      await Promise.all(leases.map((l) => l.release()));
    } finally {
      await pool.end();
    }
  });

  test('a key taken over loses only its own handle; the others keep renewing', async () => {
    const client = new LeaseClient(db.pool);
    const keys = Array.from({ length: 5 }, () => uniqueKey('lose'));
    const leases = (await client.acquireMany(keys, {
      ttl: '1200ms',
      owner: 'worker-lose',
      keepAlive: true,
    })) as Lease[];
    const victim = leases[2]!;
    // Another process of the same owner releases it and someone else takes the key.
    await db.pool.query('SELECT lease.release($1, $2, $3)', [
      victim.key,
      victim.owner,
      victim.epoch.toString(),
    ]);
    await db.pool.query("SELECT lease.acquire($1, 'thief', '1 min')", [victim.key]);
    const reason = await abortReason(victim.signal);
    assert.ok(reason instanceof LeaseLostError);
    assert.equal(reason.status, 'not_owner');
    await sleep(2_500); // two ttls more
    for (const lease of leases)
      if (lease !== victim) assert.equal(lease.signal.aborted, false, String(lease.lost));
    await Promise.all(leases.map((l) => l.release()));
  });

  test('handles of different ttls and owners are renewed in their own groups', async () => {
    const { pool, sent } = recordingPool();
    const client = new LeaseClient(pool);
    try {
      const a = (await client.acquireMany([uniqueKey('g'), uniqueKey('g')], {
        ttl: '1200ms',
        owner: 'owner-a',
        keepAlive: true,
      })) as Lease[];
      const b = (await client.acquireMany([uniqueKey('g'), uniqueKey('g')], {
        ttl: '2400ms',
        owner: 'owner-b',
        keepAlive: true,
      })) as Lease[];
      sent.length = 0;
      await sleep(3_000);
      for (const lease of [...a, ...b]) assert.equal(lease.signal.aborted, false);
      assert.equal(renewsIn(sent).single, 0);
      await Promise.all([...a, ...b].map((l) => l.release()));
    } finally {
      await pool.end();
    }
  });
});

describe('prepared statements', () => {
  async function preparedNames(options: { preparedStatements?: boolean }): Promise<string[]> {
    const connection = new pg.Client({ connectionString: db.url });
    await connection.connect();
    try {
      const client = new LeaseClient(connection, options);
      const lease = (await client.acquire(uniqueKey('prep'), { ttl: '1 min' }))!;
      await lease.renew();
      await client.inspect(lease.key);
      await lease.release();
      const { rows } = await connection.query<{ name: string }>(
        'SELECT name FROM pg_prepared_statements ORDER BY name',
      );
      return rows.map((r) => r.name);
    } finally {
      await connection.end();
    }
  }

  test('every call is a named statement by default', async () => {
    const names = await preparedNames({});
    for (const call of ['acquire', 'renew', 'release', 'inspect'])
      assert.ok(
        names.some((n) => n.startsWith(`pg_lease_${call}_`)),
        `${call} in ${names.join(', ')}`,
      );
  });

  test('preparedStatements false sends unnamed statements only (for PgBouncer in transaction mode)', async () => {
    assert.deepEqual(await preparedNames({ preparedStatements: false }), []);
  });
});

describe('coalescing (opt-in)', () => {
  test('concurrent acquires and releases of one owner share statements; each caller gets its own answer', async () => {
    const { pool, sent } = recordingPool();
    const client = new LeaseClient(pool, { coalesce: true, owner: 'worker-co' });
    try {
      const held = uniqueKey('co-held');
      await db.pool.query("SELECT lease.acquire($1, 'someone-else', '1 min')", [held]);
      const keys = [...Array.from({ length: 9 }, () => uniqueKey('co')), held];
      sent.length = 0;
      const leases = await Promise.all(keys.map((key) => client.acquire(key, { ttl: '1 min' })));
      assert.equal(sent.filter((t) => t.includes('lease.acquire_many(')).length, 1);
      assert.equal(sent.filter((t) => t.includes('lease.acquire(')).length, 0);
      assert.deepEqual(
        leases.map((l) => l?.key ?? null),
        [...keys.slice(0, 9), null],
      );
      sent.length = 0;
      const statuses = await Promise.all(leases.slice(0, 9).map((l) => l!.release()));
      assert.deepEqual(statuses, Array(9).fill('ok'));
      assert.equal(sent.filter((t) => t.includes('lease.release_many(')).length, 1);
      assert.equal(sent.filter((t) => t.includes('lease.release(')).length, 0);
    } finally {
      await pool.end();
    }
  });

  test('two coalesced acquires of one key by one owner both report the one grant', async () => {
    const client = new LeaseClient(db.pool, { coalesce: true, owner: 'worker-twice' });
    const key = uniqueKey('co-twice');
    const [a, b] = await Promise.all([
      client.acquire(key, { ttl: '1 min' }),
      client.acquire(key, { ttl: '1 min' }),
    ]);
    assert.equal(a!.epoch, b!.epoch);
    assert.equal(await a!.release(), 'ok');
  });

  test('without coalesce, concurrent calls go out one statement each', async () => {
    const { pool, sent } = recordingPool();
    const client = new LeaseClient(pool, { owner: 'worker-single' });
    try {
      const keys = Array.from({ length: 4 }, () => uniqueKey('single'));
      sent.length = 0;
      const leases = await Promise.all(keys.map((key) => client.acquire(key, { ttl: '1 min' })));
      assert.equal(sent.filter((t) => t.includes('lease.acquire(')).length, 4);
      await Promise.all(leases.map((l) => l!.release()));
      assert.equal(sent.filter((t) => t.includes('lease.release(')).length, 4);
    } finally {
      await pool.end();
    }
  });
});
