/**
 * Counted and shared keys through the client (SEMANTICS §13): `acquire(key, { limit })` takes
 * one of a key's permits, `acquire(key, { shared: true })` a shared grant; their handles live,
 * renew, lapse and release on their own; a waiting acquire is woken by a permit's release (the
 * notification path) and at the earliest permit's expiry; and the batched paths never put
 * such a key into a statement the server refuses.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  LeaseAbortedError,
  LeaseClient,
  LeaseInvalidInputError,
  LeaseLostError,
  LeaseTimeoutError,
  type Lease,
  type LeaseClientOptions,
} from '../../src/index.js';
import { MAX_PERMITS } from '../../src/generated/sql.js';
import { STATEMENTS } from '../../src/sql/statements.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { abortReason, uniqueKey, waitFor } from '../support/helpers.js';

let db: TestDatabase;
let admin: LeaseClient;

before(async () => {
  db = await createTestDatabase();
  admin = new LeaseClient(db.pool);
});
after(async () => {
  await db.close();
});

/** A client on a pool of its own. */
function clientOf(options: LeaseClientOptions = {}): LeaseClient {
  return new LeaseClient(db.newPool(), options);
}

/** Whether a waiter has marked the key, so that a release of any of its permits notifies. */
async function watched(key: string): Promise<boolean> {
  const { rows } = await db.pool.query<{ watched: boolean }>(
    'SELECT watched_until > now() AS watched FROM lease.leases WHERE key = $1',
    [key],
  );
  return rows[0]?.watched === true;
}

/**
 * Whether an exclusive waiter marks the key now (§13): the transaction-level advisory lock
 * lease._mark_exclusive_wait takes, held by a waiting lease.acquire.
 */
async function marked(key: string): Promise<boolean> {
  const { rows } = await db.pool.query<{ marked: boolean }>(
    `SELECT EXISTS (SELECT 1 FROM pg_locks AS l
                     WHERE l.locktype = 'advisory' AND l.mode = 'ExclusiveLock' AND l.granted
                       AND l.classid = 1885826149 AND l.objsubid = 2
                       AND l.objid = pg_catalog.hashtext($1 COLLATE "C")::oid) AS marked`,
    [key],
  );
  return rows[0]!.marked;
}

/**
 * Readers that overlap, until `stop` aborts or `forMs` has passed: each acquires the key shared
 * before the one before it releases (two owners taking turns) and holds it about `holdMs`.
 * Counts its grants and denials; `running` is false once it has ended.
 */
function readerStream(
  client: LeaseClient,
  key: string,
  holdMs: number,
  forMs: number,
  stop: AbortSignal,
) {
  const stream = { granted: 0, denied: 0, running: true, done: Promise.resolve() };
  const endAt = performance.now() + forMs;
  stream.done = (async () => {
    let previous: Lease | null = null;
    try {
      for (let n = 0; !stop.aborted && performance.now() < endAt; n++) {
        const lease = await client.acquire(key, {
          ttl: '1 min',
          shared: true,
          owner: `${key}-reader-${n % 2}`,
        });
        if (lease) stream.granted++;
        else stream.denied++;
        await sleep(holdMs / 2);
        await previous?.release();
        previous = lease;
      }
    } finally {
      stream.running = false;
      await previous?.release();
    }
  })();
  return stream;
}

describe('counted keys through the client', { concurrency: true }, () => {
  test('N+1 concurrent acquires of an N-permit key grant exactly N permits', async () => {
    const key = uniqueKey('permits-n-plus-1');
    const n = 3;
    const clients = Array.from({ length: n + 1 }, () => clientOf());
    const results = await Promise.all(
      clients.map((client) => client.acquire(key, { ttl: '1 min', limit: n })),
    );
    const granted = results.filter((lease): lease is Lease => lease !== null);
    assert.equal(granted.length, n, 'exactly N permits granted');
    assert.equal(new Set(granted.map((lease) => lease.epoch)).size, n, 'each permit its own epoch');
    assert.equal(new Set(granted.map((lease) => lease.owner)).size, n);
    const holders = await admin.holders(key);
    assert.deepEqual(
      holders.map((h) => h.epoch),
      granted.map((lease) => lease.epoch).sort((a, b) => (a < b ? -1 : 1)),
    );
    const state = await admin.inspect(key);
    assert.equal(state?.held, true);
    assert.equal(state?.owner, null, 'a counted key has many holders');
    // One release makes room for exactly one more.
    assert.equal(await granted[0]!.release(), 'ok');
    const next = await clients[n]!.acquire(key, { ttl: '1 min', limit: n });
    assert.ok(next, 'a released permit is granted again');
    assert.ok(next.epoch > granted.reduce((m, l) => (l.epoch > m ? l.epoch : m), 0n));
    assert.equal(await clients[0]!.acquire(key, { ttl: '1 min', limit: n }), null);
    await Promise.all([...granted.slice(1), next].map((lease) => lease.release()));
    assert.deepEqual(await admin.holders(key), []);
  });

  test('a permit that lapses aborts its own handle while the others keep theirs', async () => {
    const key = uniqueKey('permits-lapse');
    const client = clientOf();
    // The same ttl for all: the kept-alive ones renew (one at a time, never renew_many).
    const kept = await Promise.all(
      [1, 2].map(() => client.acquire(key, { ttl: '1s', limit: 3, keepAlive: true })),
    );
    const lapsing = (await client.acquire(key, { ttl: '1s', limit: 3 }))!;
    assert.ok(lapsing && kept.every((lease) => lease !== null));
    const reason = await abortReason(lapsing.signal, 10_000);
    assert.ok(reason instanceof LeaseLostError, String(reason));
    // Well past the lapse: the others were renewed all along.
    await sleep(1_500);
    for (const lease of kept) {
      assert.equal(lease!.signal.aborted, false, String(lease!.signal.reason));
      assert.ok(lease!.expiresAt.getTime() > lapsing.expiresAt.getTime());
    }
    const holders = await admin.holders(key);
    assert.deepEqual(
      holders.map((h) => h.owner).sort(),
      kept.map((lease) => lease!.owner).sort(),
      'the lapsed permit is no longer listed',
    );
    assert.equal(await lapsing.release(), 'lapsed');
    // Its place is free again.
    const third = await clientOf().acquire(key, { ttl: '1 min', limit: 3 });
    assert.ok(third);
    await Promise.all([...kept, third].map((lease) => lease!.release()));
  });

  test("a waiting acquire is woken by a permit's release, not by its poll fallback", async () => {
    const key = uniqueKey('permits-wake');
    const holderClient = clientOf();
    const holders = await Promise.all(
      [1, 2].map(() => holderClient.acquire(key, { ttl: '2 min', limit: 2 })),
    );
    // Without a notification the waiter would sleep until its watch refresh (~20 s here) or
    // the permits' expiry (2 min).
    const waiter = clientOf({ pollInterval: '30s' });
    const waiting = waiter.acquire(key, { ttl: '1 min', limit: 2, wait: '40s' });
    waiting.catch(() => undefined);
    await waitFor('the waiter marks the counted key', () => watched(key));
    await sleep(300); // let it fall asleep
    const releasedAt = performance.now();
    assert.equal(await holders[1]!.release(), 'ok');
    const lease = await waiting;
    const wokenAfter = performance.now() - releasedAt;
    assert.ok(lease);
    assert.ok(wokenAfter < 8_000, `woken ${Math.round(wokenAfter)} ms after the release`);
    assert.ok(lease.epoch > holders[1]!.epoch);
    await Promise.all([lease.release(), holders[0]!.release()]);
  });

  test("a denied attempt reports the earliest permit's time left as it stood before the attempt, also when that permit lapses during the statement", async () => {
    // The statement a waiting client sends after its first denial, back to back around a
    // permit's lapse until it takes that place: now and then a denied attempt ends just after
    // the lapse. Read after the denial (as it once was), the earliest expiry then came from the
    // other permit, three minutes away, and the waiter slept until its poll. Each lapse is one
    // chance in a hundred or so to catch that; lanes of one waiter each give it five hundred (a
    // second waiter of a key could take the place after the statement's snapshot, which no
    // answer can show).
    const lanes = 16;
    const pool = db.newPool({ max: lanes });
    const holder = clientOf();
    const misreported: string[] = [];
    await Promise.all(
      Array.from({ length: lanes }, async () => {
        for (let round = 0; round < 32; round++) {
          const key = uniqueKey('permits-earliest-race');
          const long = await holder.acquire(key, { ttl: '3 min', limit: 2 });
          const short = await holder.acquire(key, { ttl: '150ms', limit: 2 });
          assert.ok(long && short);
          await sleep(Math.max(0, short.remainingMs() - 20));
          const deadline = performance.now() + 20_000;
          for (;;) {
            const { rows } = await pool.query<{
              acquired: boolean;
              epoch: string | null;
              holder: { earliest_us: number | null } | null;
            }>({ text: STATEMENTS.acquireInspecting.text, values: [key, 'waiter', 60e6] });
            const row = rows[0]!;
            if (row.acquired) {
              await pool.query('SELECT lease.release($1, $2, $3::bigint)', [
                key,
                'waiter',
                row.epoch,
              ]);
              break;
            }
            const earliestUs = row.holder?.earliest_us;
            if (!(earliestUs != null && earliestUs < 1e6))
              misreported.push(`${key}: ${earliestUs}`);
            assert.ok(performance.now() < deadline, 'the lapsed permit is taken');
          }
          await long.release();
        }
      }),
    );
    assert.deepEqual(misreported, []);
  });

  test("a waiting acquire takes the earliest permit's place when it lapses", async () => {
    const key = uniqueKey('permits-earliest');
    const holderClient = clientOf();
    const long = (await holderClient.acquire(key, { ttl: '3 min', limit: 2 }))!;
    const short = (await holderClient.acquire(key, { ttl: '2s', limit: 2 }))!;
    assert.ok(long && short);
    // Notifications cannot help (nobody releases); the poll is long: only the earliest expiry
    // among the permits wakes the waiter in time (the latest is 3 minutes away).
    const waiter = clientOf({ pollInterval: '30s' });
    const started = performance.now();
    const lease = await waiter.acquire(key, { ttl: '1 min', limit: 2, wait: '50s' });
    const waited = performance.now() - started;
    assert.ok(lease);
    assert.ok(waited < 12_000, `waited ${Math.round(waited)} ms for a permit lapsing after 2 s`);
    await Promise.all([lease.release(), long.release()]);
  });

  test("an exclusive waiter granted a counted key's permit after waiting in the server longer than its ttl holds it for its ttl", async () => {
    const key = uniqueKey('permits-server-wait-deadline');
    // The only permit lapses after 4 s; the waiter (no limit: it gets a permit, §13) finds the
    // key held by many and waits in the server, longer than its own ttl.
    const permit = await clientOf().acquire(key, { ttl: '4s', limit: 1 });
    assert.ok(permit);
    const lease = await clientOf().acquire(key, { ttl: '2s', wait: '30s' });
    assert.ok(lease);
    assert.equal(lease.signal.aborted, false, String(lease.signal.reason));
    assert.ok(lease.remainingMs() > 0, `remainingMs ${lease.remainingMs()}`);
    assert.deepEqual(
      (await admin.holders(key)).map((h) => h.epoch),
      [lease.epoch],
    );
    assert.equal(await lease.release(), 'ok');
  });

  test("an exclusive waiter that waits in the client takes a counted key's earliest permit's place when it lapses", async () => {
    const key = uniqueKey('permits-exclusive-earliest');
    const holderClient = clientOf();
    const long = (await holderClient.acquire(key, { ttl: '3 min', limit: 2 }))!;
    const short = (await holderClient.acquire(key, { ttl: '2s', limit: 2 }))!;
    assert.ok(long && short);
    // A pool of 2 leaves no connection to wait in the server: the waiter (no limit: it gets a
    // permit, §13) sleeps in the client, and only the earliest permit's expiry wakes it in time.
    const pool = db.newPool({ max: 2 });
    const waiter = new LeaseClient(pool, { pollInterval: '30s' });
    const started = performance.now();
    const lease = await waiter.acquire(key, { ttl: '1 min', wait: '50s' });
    const waited = performance.now() - started;
    assert.ok(lease);
    assert.ok(waited < 12_000, `waited ${Math.round(waited)} ms for a permit lapsing after 2 s`);
    await Promise.all([lease.release(), long.release()]);
  });

  test('limit sets the limit, the last caller wins, and shrinking takes no permit away', async () => {
    const key = uniqueKey('permits-limit');
    const client = clientOf();
    const a = (await client.acquire(key, { ttl: '1 min', limit: 2 }))!;
    const b = (await client.acquire(key, { ttl: '1 min', limit: 2 }))!;
    assert.ok(a && b);
    assert.equal(await client.acquire(key, { ttl: '1 min', limit: 2 }), null);
    // Growing admits one more.
    const c = await client.acquire(key, { ttl: '1 min', limit: 3 });
    assert.ok(c);
    // Shrinking keeps all three, grants nothing until fewer than 1 are live.
    assert.equal(await client.acquire(key, { ttl: '1 min', limit: 1 }), null);
    assert.equal((await admin.holders(key)).length, 3);
    assert.equal(await a.renew('1 min').then(() => 'ok'), 'ok');
    // A plain acquire of a counted key gets a permit too (limit as it stands: 1, full).
    assert.equal(await client.acquire(key, { ttl: '1 min' }), null);
    await Promise.all([a.release(), b.release(), c.release()]);
    const plain = await client.acquire(key, { ttl: '1 min' });
    assert.ok(plain, 'a plain acquire takes a permit of the counted key');
    assert.equal((await admin.inspect(key))?.owner, null, 'the key is still counted');
    await plain.release();
  });

  test('a fenced transaction under a permit commits while the permit is live', async () => {
    const key = uniqueKey('permits-fenced');
    const client = clientOf();
    const lease = (await client.acquire(key, { ttl: '1 min', limit: 2 }))!;
    const value = await client.fenced(lease, async (tx) => {
      const { rows } = await tx.query<{ one: number }>('SELECT 1 AS one');
      return rows[0]!.one;
    });
    assert.equal(value, 1);
    await lease.release();
    await assert.rejects(
      client.fenced(lease, () => undefined),
      (error: Error) => error.name === 'LeaseFencedError',
    );
  });
});

describe('shared grants through the client', { concurrency: true }, () => {
  test('shared holders go on beside each other and keep an exclusive acquirer out', async () => {
    const key = uniqueKey('shared-vs-exclusive');
    const client = clientOf();
    const readers = await Promise.all(
      [1, 2, 3].map(() => client.acquire(key, { ttl: '1 min', shared: true, keepAlive: true })),
    );
    assert.ok(
      readers.every((lease) => lease !== null),
      'every shared acquire is granted',
    );
    assert.equal(new Set(readers.map((lease) => lease!.epoch)).size, 3);
    assert.equal(await client.acquire(key, { ttl: '1 min' }), null, 'no writer beside readers');
    assert.equal((await admin.holders(key)).length, 3);

    // A writer waits; the last reader's release wakes it.
    const writerClient = clientOf({ pollInterval: '30s' });
    const writing = writerClient.acquire(key, { ttl: '1 min', wait: '40s' });
    writing.catch(() => undefined);
    await waitFor('the writer marks the key', () => watched(key));
    await readers[0]!.release();
    await readers[1]!.release();
    await sleep(300);
    const releasedAt = performance.now();
    await readers[2]!.release();
    const writer = await writing;
    assert.ok(writer);
    assert.ok(performance.now() - releasedAt < 8_000, 'the writer was woken by the release');
    assert.equal((await admin.inspect(key))?.owner, writer.owner, 'held exclusively');
    assert.equal(await client.acquire(key, { ttl: '1 min', shared: true }), null, 'no reader');

    // And a waiting reader is woken by the writer's release.
    const readerClient = clientOf({ pollInterval: '30s' });
    const reading = readerClient.acquire(key, { ttl: '1 min', shared: true, wait: '40s' });
    reading.catch(() => undefined);
    await waitFor('the reader marks the key', () => watched(key));
    await sleep(300);
    const writerReleasedAt = performance.now();
    await writer.release();
    const reader = await reading;
    assert.ok(reader);
    assert.ok(performance.now() - writerReleasedAt < 8_000);
    assert.ok(reader.epoch > writer.epoch);
    await reader.release();
  });

  test('a waiting writer is not starved by a stream of overlapping readers (§13)', async () => {
    const key = uniqueKey('shared-stream-writer');
    const stop = new AbortController();
    // Longer than the writer's wait: the stream alone never leaves the key free.
    const stream = readerStream(clientOf(), key, 300, 25_000, stop.signal);
    try {
      await waitFor('the readers hold the key', () => stream.granted >= 2);
      const writer = await clientOf().acquire(key, { ttl: '1 min', wait: '10s' });
      assert.ok(writer);
      assert.equal(stream.running, true, 'granted while the readers were still trying');
      const granted = stream.granted;
      const denied = stream.denied;
      await waitFor('the readers try again', () => stream.denied >= denied + 2);
      assert.equal(stream.granted, granted, 'no reader is granted beside the writer');
      assert.equal((await admin.inspect(key))?.owner, writer.owner, 'held exclusively');
      assert.equal(await writer.release(), 'ok');
    } finally {
      stop.abort();
      await stream.done;
    }
  });

  test('a writer that gives up while it waits in the server leaves no mark: a reader is granted right after', async () => {
    const key = uniqueKey('shared-writer-gives-up');
    const readerClient = clientOf();
    const first = await readerClient.acquire(key, { ttl: '1 min', shared: true, owner: 'r1' });
    assert.ok(first);
    const writerClient = clientOf();

    // Aborted while it waits in the server.
    const controller = new AbortController();
    const writing = writerClient.acquire(key, {
      ttl: '1 min',
      wait: '1 min',
      signal: controller.signal,
    });
    writing.catch(() => undefined);
    await waitFor('the writer marks the key', () => marked(key));
    assert.equal(
      await readerClient.acquire(key, { ttl: '1 min', shared: true, owner: 'r2' }),
      null,
    );
    controller.abort(new Error('given up'));
    await assert.rejects(writing, LeaseAbortedError);
    const second = await readerClient.acquire(key, { ttl: '1 min', shared: true, owner: 'r2' });
    assert.ok(second, 'a reader is granted right after the abort');
    assert.equal(await marked(key), false);

    // Timed out while it waits in the server.
    const timingOut = writerClient.acquire(key, { ttl: '1 min', wait: '2s' });
    timingOut.catch(() => undefined);
    await waitFor('the writer marks the key again', () => marked(key));
    await assert.rejects(timingOut, LeaseTimeoutError);
    const third = await readerClient.acquire(key, { ttl: '1 min', shared: true, owner: 'r3' });
    assert.ok(third, 'a reader is granted right after the timeout');
    assert.equal(await marked(key), false);
    await Promise.all([first, second, third].map((lease) => lease.release()));
  });

  test('writers waiting in the server leave the pool a connection for renewals: a keep-alive lease of the same client lives on', async () => {
    // A pool of 4: one connection listens, and at most one of the three left waits in the
    // server; the other writers wait in the client, so renewals always find a connection.
    const client = clientOf();
    const readers = clientOf();
    const keys = [1, 2, 3].map((i) => uniqueKey(`shared-busy-pool-${i}`));
    const held = await Promise.all(
      keys.map((key) => readers.acquire(key, { ttl: '1 min', shared: true })),
    );
    const lease = (await client.acquire(uniqueKey('busy-pool-lease'), {
      ttl: '2s',
      keepAlive: true,
    }))!;
    let mostMarked = 0;
    const writers = Promise.allSettled(
      keys.map((key) => client.acquire(key, { ttl: '1 min', wait: '5s' })),
    );
    let settled = false;
    void writers.then(() => (settled = true));
    while (!settled) {
      const marks = await Promise.all(keys.map((key) => marked(key)));
      mostMarked = Math.max(mostMarked, marks.filter(Boolean).length);
      await sleep(100);
    }
    for (const result of await writers)
      assert.ok(result.status === 'rejected' && result.reason instanceof LeaseTimeoutError);
    assert.equal(lease.signal.aborted, false, String(lease.signal.reason));
    assert.equal(mostMarked, 1, 'one writer at a time waits in the server');
    assert.equal(await lease.release(), 'ok');
    await Promise.all(held.map((grant) => grant!.release()));
  });

  test('writers of two clients on one pool waiting in the server leave it a connection for renewals', async () => {
    // Two clients on one pool of 4: each listens on one connection; if each let one writer
    // wait in the server, the four would all be taken and a renewal would find none.
    const pool = db.newPool();
    const [a, b] = [new LeaseClient(pool), new LeaseClient(pool)];
    const readers = clientOf();
    const keys = [1, 2].map((i) => uniqueKey(`shared-shared-pool-${i}`));
    const held = await Promise.all(
      keys.map((key) => readers.acquire(key, { ttl: '1 min', shared: true })),
    );
    const lease = (await a.acquire(uniqueKey('shared-pool-lease'), {
      ttl: '2s',
      keepAlive: true,
    }))!;
    const writers = await Promise.allSettled([
      a.acquire(keys[0]!, { ttl: '1 min', wait: '5s' }),
      b.acquire(keys[1]!, { ttl: '1 min', wait: '5s' }),
    ]);
    for (const result of writers)
      assert.ok(result.status === 'rejected' && result.reason instanceof LeaseTimeoutError);
    assert.equal(lease.signal.aborted, false, String(lease.signal.reason));
    assert.equal(await lease.release(), 'ok');
    await Promise.all(held.map((grant) => grant!.release()));
    await Promise.all([a.end(), b.end()]);
  });

  test('a shared holder asking exclusively is denied, its grant untouched', async () => {
    const key = uniqueKey('shared-no-upgrade');
    const client = clientOf();
    const reader = (await client.acquire(key, { ttl: '1 min', shared: true, owner: 'r1' }))!;
    assert.ok(reader);
    assert.equal(await client.acquire(key, { ttl: '1 min', owner: 'r1' }), null);
    const again = await client.acquire(key, { ttl: '1 min', shared: true, owner: 'r1' });
    assert.equal(again?.epoch, reader.epoch, 'the same shared grant comes back');
    assert.equal(await reader.release(), 'ok');
  });

  test('a counted key refuses shared acquires with the server error', async () => {
    const key = uniqueKey('shared-on-counted');
    const client = clientOf();
    const permit = (await client.acquire(key, { ttl: '1 min', limit: 2 }))!;
    await assert.rejects(client.acquire(key, { ttl: '1 min', shared: true }), {
      code: '0A000',
      message: /is a counted key/,
    });
    await permit.release();
  });
});

describe('input and the batched paths', { concurrency: true }, () => {
  test('limit with shared, and bad limits, are refused before anything is sent', async () => {
    const client = clientOf();
    for (const options of [
      { limit: 2, shared: true },
      { limit: 0 },
      { limit: 1.5 },
      { limit: 1001 },
      { limit: Number.NaN },
    ]) {
      const key = uniqueKey('permits-bad-input');
      await assert.rejects(
        client.acquire(key, { ttl: '1 min', ...options }),
        (error: unknown) =>
          error instanceof LeaseInvalidInputError &&
          /limit/.test(error.detail) &&
          (options.shared !== true || /cannot be combined/.test(error.detail)),
        JSON.stringify(options),
      );
      assert.equal(await admin.inspect(key), null, 'nothing was written');
    }
  });

  test("the largest limit is the server's: the client sends MAX_PERMITS and refuses one more, as the server does", async () => {
    const client = clientOf();
    const key = uniqueKey('permits-max');
    const permit = (await client.acquire(key, { ttl: '1 min', limit: MAX_PERMITS }))!;
    assert.equal((await admin.holders(key)).length, 1);
    await permit.release();
    await assert.rejects(client.acquire(key, { ttl: '1 min', limit: MAX_PERMITS + 1 }), {
      name: 'LeaseInvalidInputError',
      detail: `limit must be a whole number from 1 to ${MAX_PERMITS}, got ${MAX_PERMITS + 1}`,
    });
    await assert.rejects(
      db.pool.query('SELECT lease.set_limit($1, $2)', [uniqueKey('permits-max'), MAX_PERMITS + 1]),
      { code: '22023', detail: new RegExp(`limit must be NULL or from 1 to ${MAX_PERMITS}`) },
    );
  });

  test('a limit on a key held exclusively is refused by the server, nothing changed', async () => {
    const key = uniqueKey('permits-on-exclusive');
    const client = clientOf();
    const holder = (await client.acquire(key, { ttl: '1 min' }))!;
    await assert.rejects(client.acquire(key, { ttl: '1 min', limit: 3 }), {
      code: '55006',
      message: /is held exclusively/,
    });
    const state = await admin.inspect(key);
    assert.equal(state?.owner, holder.owner);
    assert.equal(state?.epoch, holder.epoch);
    await holder.release();
  });

  test('acquireMany refuses a counted key with the server error and grants nothing', async () => {
    const counted = uniqueKey('many-counted');
    const plain = uniqueKey('many-plain');
    const client = clientOf();
    const permit = (await client.acquire(counted, { ttl: '1 min', limit: 2 }))!;
    await assert.rejects(client.acquireMany([plain, counted], { ttl: '1 min' }), {
      code: '0A000',
      message: /acquire_many does not take counted or shared keys/,
    });
    assert.equal(await admin.inspect(plain), null);
    await permit.release();
  });

  test('with one owner and coalesce, permits, shared and exclusive grants renew and release side by side', async () => {
    const owner = `coalescing-${process.pid}`;
    const client = clientOf({ owner, coalesce: true });
    const counted = uniqueKey('coalesce-counted');
    const shared = uniqueKey('coalesce-shared');
    const plainKeys = [uniqueKey('coalesce-plain'), uniqueKey('coalesce-plain')];
    // The same tick: the exclusive ones share an acquire_many, the others go singly.
    const leases = await Promise.all([
      client.acquire(counted, { ttl: '1s', limit: 2, keepAlive: true }),
      client.acquire(shared, { ttl: '1s', shared: true, keepAlive: true }),
      ...plainKeys.map((key) => client.acquire(key, { ttl: '1s', keepAlive: true })),
    ]);
    assert.ok(leases.every((lease) => lease !== null));
    // A plain acquire of the counted key, coalesced with an exclusive one: the server refuses
    // the batch, and each is answered on its own (a second owner needed for a second permit).
    const other = clientOf({ owner: `${owner}-2`, coalesce: true });
    const plainAgain = uniqueKey('coalesce-plain');
    const [second, third] = await Promise.all([
      other.acquire(counted, { ttl: '1 min' }),
      other.acquire(plainAgain, { ttl: '1 min' }),
    ]);
    assert.ok(second && third, 'both calls of the refused batch answered singly');
    // Several ttls of renewals in one keep-alive group, all alive.
    await sleep(2_500);
    for (const lease of leases) assert.equal(lease!.signal.aborted, false, lease!.key);
    const statuses = await client.releaseMany(leases.map((lease) => lease!));
    assert.deepEqual(statuses, ['ok', 'ok', 'ok', 'ok']);
    assert.deepEqual(await Promise.all([second.release(), third.release()]), ['ok', 'ok']);
    assert.deepEqual(await admin.holders(counted), []);
  });

  test('holders lists the exclusive holder, and nothing for a free or unknown key', async () => {
    const key = uniqueKey('holders-exclusive');
    const client = clientOf();
    assert.deepEqual(await admin.holders(key), []);
    const lease = (await client.acquire(key, { ttl: '1 min' }))!;
    const holders = await admin.holders(key);
    assert.equal(holders.length, 1);
    assert.equal(holders[0]!.owner, lease.owner);
    assert.equal(holders[0]!.epoch, lease.epoch);
    assert.equal(holders[0]!.expiresAt.getTime(), lease.expiresAt.getTime());
    assert.ok(holders[0]!.remainingMs > 30_000);
    await lease.release();
    assert.deepEqual(await admin.holders(key), []);
    await assert.rejects(admin.holders(''), LeaseInvalidInputError);
  });
});
