/**
 * SEMANTICS.md §2 and §4: every row of acquire's state table, inspect's three answers, lazy
 * server-time expiry (exclusive at expires_at) and the epoch sequence across grants.
 */
import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { after, before, describe, test } from 'node:test';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { acquire, inspect, intervalMicros, micros, pgError, release, renew, serverNow, sleepPast, storedRow } from '../support/lease-calls.js';
import { uniqueKey } from '../support/helpers.js';

const SECOND = 1_000_000n;

let db: TestDatabase;
before(async () => {
  db = await createTestDatabase();
});
after(() => db.close());

/** Asserts `expiresAt` is server now + ttl for some server instant within [before, after]. */
function assertExpiryWithin(
  expiresAt: bigint | null,
  before: bigint,
  after: bigint,
  ttl: bigint,
): void {
  assert.ok(expiresAt !== null, 'expected an expiry');
  assert.ok(
    expiresAt >= before + ttl && expiresAt <= after + ttl,
    `expires_at ${expiresAt} is not server now + ttl (now was between ${before} and ${after}, ttl ${ttl} us)`,
  );
}

describe('acquire, by the state the key is in', { concurrency: true }, () => {
  test('acquire of a never-leased key grants epoch 1 expiring at server now + ttl', async () => {
    const key = uniqueKey('never');
    const t0 = await serverNow(db.pool);
    const granted = await acquire(db.pool, key, 'worker-a', '30 seconds');
    const t1 = await serverNow(db.pool);
    assert.equal(granted.acquired, true);
    assert.equal(granted.epoch, 1n);
    assertExpiryWithin(granted.expiresAt, t0, t1, 30n * SECOND);
    assert.deepEqual(await inspect(db.pool, key), {
      held: true,
      owner: 'worker-a',
      epoch: 1n,
      expiresAt: granted.expiresAt,
    });
  });

  test('acquire without a wait argument uses wait 0', async () => {
    const key = uniqueKey('default-wait');
    assert.equal((await acquire(db.pool, key, 'worker-a', '30 seconds')).acquired, true);
    const started = performance.now();
    const denied = await acquire(db.pool, key, 'worker-b', '30 seconds');
    assert.deepEqual(denied, { acquired: false, epoch: null, expiresAt: null });
    assert.ok(performance.now() - started < 5_000, 'a wait-0 denial must not wait');
  });

  test('acquire of a released key grants the watermark epoch plus one', async () => {
    const key = uniqueKey('free');
    const first = await acquire(db.pool, key, 'worker-a', '30 seconds');
    assert.equal((await release(db.pool, key, 'worker-a', first.epoch)).status, 'ok');
    const watermark = (await inspect(db.pool, key))!.epoch;
    assert.equal(watermark, 2n);

    const t0 = await serverNow(db.pool);
    const granted = await acquire(db.pool, key, 'worker-b', '45 seconds');
    const t1 = await serverNow(db.pool);
    assert.equal(granted.acquired, true);
    assert.equal(granted.epoch, watermark + 1n);
    assertExpiryWithin(granted.expiresAt, t0, t1, 45n * SECOND);
  });

  test('acquire by the former holder of a released key also gets a new epoch', async () => {
    const key = uniqueKey('free-same-owner');
    const first = await acquire(db.pool, key, 'worker-a', '30 seconds');
    await release(db.pool, key, 'worker-a', first.epoch);
    const again = await acquire(db.pool, key, 'worker-a', '30 seconds');
    assert.equal(again.acquired, true);
    assert.equal(again.epoch, 3n);
  });

  test("acquire of another owner's lapsed lease grants epoch + 1 at server now + ttl", async () => {
    const key = uniqueKey('lapsed-other');
    const first = await acquire(db.pool, key, 'worker-a', '300 milliseconds');
    await sleepPast(db.pool, first.expiresAt);
    const t0 = await serverNow(db.pool);
    const granted = await acquire(db.pool, key, 'worker-b', '20 seconds');
    const t1 = await serverNow(db.pool);
    assert.equal(granted.acquired, true);
    assert.equal(granted.epoch, first.epoch! + 1n);
    assertExpiryWithin(granted.expiresAt, t0, t1, 20n * SECOND);
    assert.equal((await inspect(db.pool, key))!.owner, 'worker-b');
  });

  test("acquire of the caller's own lapsed lease grants a new epoch and a new expiry", async () => {
    const key = uniqueKey('lapsed-own');
    const first = await acquire(db.pool, key, 'worker-a', '300 milliseconds');
    await sleepPast(db.pool, first.expiresAt);
    const t0 = await serverNow(db.pool);
    const again = await acquire(db.pool, key, 'worker-a', '20 seconds');
    const t1 = await serverNow(db.pool);
    assert.equal(again.acquired, true);
    assert.equal(again.epoch, first.epoch! + 1n);
    assertExpiryWithin(again.expiresAt, t0, t1, 20n * SECOND);
    // The old grant is fenced even for its own owner.
    assert.equal((await renew(db.pool, key, 'worker-a', first.epoch, '1 minute')).status, 'epoch_mismatch');
  });

  test('re-acquire by the holder returns the same epoch and expiry and writes nothing', async () => {
    const key = uniqueKey('held-same');
    const first = await acquire(db.pool, key, 'worker-a', '30 seconds');
    const rowBefore = await storedRow(db.pool, key);
    // A different ttl and a wait do not matter: the grant is returned as it stands.
    const again = await acquire(db.pool, key, 'worker-a', '10 minutes', '5 seconds');
    assert.deepEqual(again, first);
    const rowAfter = await storedRow(db.pool, key);
    assert.deepEqual(rowAfter, rowBefore, 'a same-owner re-acquire must not write the row');
  });

  test('acquire of a key held by another with wait 0 returns (f, NULL, NULL) and changes nothing', async () => {
    const key = uniqueKey('held-other');
    const first = await acquire(db.pool, key, 'worker-a', '30 seconds');
    const rowBefore = await storedRow(db.pool, key);
    const denied = await acquire(db.pool, key, 'worker-b', '30 seconds', '0');
    assert.deepEqual(denied, { acquired: false, epoch: null, expiresAt: null });
    assert.deepEqual(await storedRow(db.pool, key), rowBefore);
    assert.deepEqual(await inspect(db.pool, key), {
      held: true,
      owner: 'worker-a',
      epoch: first.epoch,
      expiresAt: first.expiresAt,
    });
  });

  test('owners are compared exactly: case or trailing space make a different owner', async () => {
    const key = uniqueKey('owner-exact');
    await acquire(db.pool, key, 'worker-a', '30 seconds');
    for (const other of ['Worker-a', 'worker-a ', ' worker-a', 'worker-á']) {
      assert.equal((await acquire(db.pool, key, other, '30 seconds')).acquired, false, other);
    }
  });

  test('acquire with a wait on an acquirable key grants at once', async () => {
    const key = uniqueKey('wait-free');
    const started = performance.now();
    const granted = await acquire(db.pool, key, 'worker-a', '30 seconds', '30 seconds');
    assert.equal(granted.acquired, true);
    assert.equal(granted.epoch, 1n);
    assert.ok(performance.now() - started < 10_000, 'an acquirable key must not make it wait');
  });

  test('acquire still not acquirable when the wait has passed raises 57014 naming key and wait', async () => {
    const key = uniqueKey('wait-timeout');
    await acquire(db.pool, key, 'worker-a', '30 seconds');
    const rowBefore = await storedRow(db.pool, key);
    const t0 = await serverNow(db.pool);
    const started = performance.now();
    const error = await pgError(acquire(db.pool, key, 'worker-b', '30 seconds', '400 milliseconds'));
    const elapsed = performance.now() - started;
    const t1 = await serverNow(db.pool);
    assert.equal(error.code, '57014');
    assert.equal(error.message, 'pg_lease: acquire timed out');
    assert.ok(error.detail?.includes(key), `DETAIL must name the key: ${error.detail}`);
    const { rows } = await db.pool.query(`SELECT interval '400 milliseconds'::text AS wait`);
    assert.ok(
      error.detail?.includes(rows[0].wait),
      `DETAIL must name the wait (${rows[0].wait}): ${error.detail}`,
    );
    assert.ok(t1 - t0 >= 400_000n, `timed out within ${t1 - t0} us, before the 400 ms wait`);
    assert.ok(elapsed < 10_000, `a 400 ms wait took ${elapsed} ms`);
    assert.deepEqual(await storedRow(db.pool, key), rowBefore, 'a timed-out acquire changes nothing');
  });

  test('a waiting acquire is granted at the lapse of the lease, not before', async () => {
    const key = uniqueKey('wait-lapse');
    const first = await acquire(db.pool, key, 'worker-a', '800 milliseconds');
    const ttl = await intervalMicros(db.pool, '30 seconds');
    const granted = await acquire(db.pool, key, 'worker-b', '30 seconds', '20 seconds');
    assert.equal(granted.acquired, true);
    assert.equal(granted.epoch, first.epoch! + 1n);
    const grantedAt = granted.expiresAt! - ttl;
    assert.ok(
      grantedAt >= first.expiresAt!,
      `granted at ${grantedAt}, before the first lease expired at ${first.expiresAt}`,
    );
  });
});

describe('inspect', { concurrency: true }, () => {
  test('inspect of a never-leased key returns zero rows', async () => {
    const key = uniqueKey('inspect-never');
    const { rowCount } = await db.pool.query('SELECT * FROM lease.inspect($1)', [key]);
    assert.equal(rowCount, 0);
    // Failed renews and releases do not bring the key into existence.
    assert.equal((await renew(db.pool, key, 'worker-a', 1, '1 minute')).status, 'not_owner');
    assert.equal((await release(db.pool, key, 'worker-a', 1)).status, 'not_owner');
    assert.equal(await inspect(db.pool, key), undefined);
    assert.equal(await storedRow(db.pool, key), undefined);
  });

  test('inspect of a held key reports (t, owner, epoch, expires_at)', async () => {
    const key = uniqueKey('inspect-held');
    const granted = await acquire(db.pool, key, 'worker-a', '30 seconds');
    assert.deepEqual(await inspect(db.pool, key), {
      held: true,
      owner: 'worker-a',
      epoch: granted.epoch,
      expiresAt: granted.expiresAt,
    });
  });

  test('inspect of a released key reports (f, NULL, epoch + 1, NULL)', async () => {
    const key = uniqueKey('inspect-free');
    const granted = await acquire(db.pool, key, 'worker-a', '30 seconds');
    await release(db.pool, key, 'worker-a', granted.epoch);
    assert.deepEqual(await inspect(db.pool, key), {
      held: false,
      owner: null,
      epoch: granted.epoch! + 1n,
      expiresAt: null,
    });
    const row = await storedRow(db.pool, key);
    assert.equal(row?.owner, null, 'a released row has no owner');
    assert.equal(row?.expiresAt, null, 'a released row has no expiry');
  });

  test('inspect of a lapsed key reports it unowned with its epoch as the watermark', async () => {
    const key = uniqueKey('inspect-lapsed');
    const granted = await acquire(db.pool, key, 'worker-a', '300 milliseconds');
    await sleepPast(db.pool, granted.expiresAt);
    assert.deepEqual(await inspect(db.pool, key), {
      held: false,
      owner: null,
      epoch: granted.epoch,
      expiresAt: null,
    });
    // Expiry is lazy: the stored row still names the former owner.
    assert.equal((await storedRow(db.pool, key))?.owner, 'worker-a');
  });

  test('inspect is declared STABLE', async () => {
    const { rows } = await db.pool.query(
      `SELECT provolatile FROM pg_proc WHERE oid = 'lease.inspect(text)'::regprocedure`,
    );
    assert.equal(rows[0].provolatile, 's');
  });
});

describe('server-time expiry', { concurrency: true }, () => {
  test('a lease is held exactly while server time is before expires_at', async () => {
    let heldSeen = 0;
    let lapsedSeen = 0;
    // Both sides of the expiry must be observed; a machine too busy to observe the held side
    // within the ttl gets a longer one.
    for (let ttlMs = 600; heldSeen === 0 && ttlMs <= 10_000; ttlMs *= 2) {
      const key = uniqueKey('expiry-window');
      const granted = await acquire(db.pool, key, 'worker-a', `${ttlMs} milliseconds`);
      const expiresAt = granted.expiresAt!;
      const client = await db.pool.connect();
      try {
        const literal = client.escapeLiteral(key);
        // Three statements in one round trip: the clock before, inspect, the clock after.
        for (;;) {
          const results = (await client.query(
            `SELECT ${micros('clock_timestamp()')} AS t;
             SELECT held FROM lease.inspect(${literal});
             SELECT ${micros('clock_timestamp()')} AS t`,
          )) as unknown as { rows: Record<string, unknown>[] }[];
          const before = BigInt(results[0]!.rows[0]!.t as string);
          const held = results[1]!.rows[0]!.held as boolean;
          const after = BigInt(results[2]!.rows[0]!.t as string);
          if (after < expiresAt) {
            assert.equal(held, true, `inspect said not held, though server time < expires_at`);
            heldSeen++;
          }
          if (before >= expiresAt) {
            assert.equal(held, false, `inspect said held at or after expires_at`);
            lapsedSeen++;
          }
          if (before >= expiresAt + 50_000n) break;
        }
      } finally {
        client.release();
      }
    }
    assert.ok(heldSeen > 0 && lapsedSeen > 0, 'both sides of the expiry were observed');
  });

  /*
   * Exclusive expiry at the exact microsecond. No client can choose the server instant of a call,
   * so these tests make many grant-then-call pairs inside one statement (the second call of a
   * pair runs a few microseconds after the first), with a ttl tuned to that gap so that many
   * second calls land within a microsecond of expires_at. A call that reveals its own `now`
   * (a renew's or a grant's new expiry minus its ttl) then shows on which side of expires_at it
   * ran.
   */
  const PAIRS_PER_STATEMENT = 400;
  const SAMPLING_BUDGET_MS = 6_000;

  async function medianGap(prefix: string, firstTtl: string, second: string): Promise<bigint> {
    const { rows } = await db.pool.query(
      `SELECT ${micros('a.expires_at')} AS first_expiry, ${micros('b.expires_at')} AS second_expiry
         FROM generate_series(1, 200) AS i
         CROSS JOIN LATERAL lease.acquire($1 || ':' || i, 'worker-a', $2::interval) AS a
         CROSS JOIN LATERAL ${second} AS b`,
      [prefix, firstTtl],
    );
    const firstTtlUs = await intervalMicros(db.pool, firstTtl);
    const gaps = rows
      .filter((row) => row.second_expiry !== null)
      .map((row) => BigInt(row.second_expiry) - 60n * SECOND - (BigInt(row.first_expiry) - firstTtlUs))
      .sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    assert.ok(gaps.length > 0, 'calibration observed no second call');
    const median = gaps[gaps.length >> 1]!;
    return median > 0n ? median : 1n;
  }

  test('a renew at exactly expires_at reports lapsed (sampled at microsecond resolution)', async (t) => {
    // renew decides with a clock read once its row is locked (§10), a few microseconds after the
    // `now` its new expiry reveals; the ttls are spread over 32 us above the gap so that some of
    // those decisions still land before expires_at.
    const renewSecond = `lease.renew($1 || ':' || i, 'worker-a', a.epoch, interval '1 minute')`;
    const gap = await medianGap(uniqueKey('exact-renew-cal'), '1 minute', renewSecond);
    let oks = 0;
    let justBefore = 0;
    const started = performance.now();
    while (performance.now() - started < SAMPLING_BUDGET_MS && justBefore < 40) {
      const { rows } = await db.pool.query(
        `SELECT ${micros('a.expires_at')} AS x, b.status, ${micros('b.expires_at')} AS renewed
           FROM generate_series(1, ${PAIRS_PER_STATEMENT}) AS i
           CROSS JOIN LATERAL lease.acquire($1 || ':' || i, 'worker-a',
                                            $2::interval + (i % 32) * interval '1 microsecond') AS a
           CROSS JOIN LATERAL ${renewSecond} AS b`,
        [uniqueKey('exact-renew'), `${gap} microseconds`],
      );
      for (const row of rows) {
        if (row.status !== 'ok') {
          assert.equal(row.status, 'lapsed');
          continue;
        }
        oks++;
        const renewNow = BigInt(row.renewed) - 60n * SECOND;
        const x = BigInt(row.x);
        assert.ok(renewNow < x, `renew ran at ${renewNow}, not before expires_at ${x}, yet said ok`);
        if (renewNow === x - 1n) justBefore++;
      }
    }
    assert.ok(oks > 0, 'no renew landed before the expiry at all');
    t.diagnostic(`ttl ${gap} us; ${oks} ok renews, ${justBefore} of them 1 us before expires_at`);
  });

  test('a takeover at exactly expires_at is granted (sampled at microsecond resolution)', async (t) => {
    const takeoverSecond = `lease.acquire(CASE WHEN a.acquired THEN $1 || ':' || i END, 'worker-b', interval '1 minute')`;
    const gap = await medianGap(uniqueKey('exact-take-cal'), '1 microsecond', takeoverSecond);
    let atExpiry = 0;
    let justAfter = 0;
    const started = performance.now();
    while (performance.now() - started < SAMPLING_BUDGET_MS && atExpiry + justAfter < 40) {
      const { rows } = await db.pool.query(
        `SELECT ${micros('a.expires_at')} AS x, b.acquired, ${micros('b.expires_at')} AS granted
           FROM generate_series(1, ${PAIRS_PER_STATEMENT}) AS i
           CROSS JOIN LATERAL lease.acquire($1 || ':' || i, 'worker-a', $2::interval) AS a
           CROSS JOIN LATERAL ${takeoverSecond} AS b`,
        [uniqueKey('exact-take'), `${gap} microseconds`],
      );
      for (const row of rows) {
        if (!row.acquired) continue;
        const takeoverNow = BigInt(row.granted) - 60n * SECOND;
        const x = BigInt(row.x);
        assert.ok(takeoverNow >= x, `granted at ${takeoverNow} while held until ${x}`);
        if (takeoverNow === x) atExpiry++;
        if (takeoverNow === x + 1n) justAfter++;
      }
    }
    t.diagnostic(`ttl ${gap} us; takeovers at expires_at: ${atExpiry}, 1 us after: ${justAfter}`);
    // Landing exactly on expires_at is about as likely as landing 1 us later. If dozens of
    // takeovers came 1 us late and none on the instant itself, the instant counts as held.
    if (atExpiry + justAfter >= 40) {
      assert.ok(atExpiry > 0, `${justAfter} takeovers 1 us after expires_at, none at it`);
    }
  });

  test('a one-microsecond lease has lapsed by the next statement', async () => {
    const key = uniqueKey('expiry-1us');
    const granted = await acquire(db.pool, key, 'worker-a', '1 microsecond');
    assert.equal(granted.acquired, true);
    assert.equal((await inspect(db.pool, key))!.held, false);
    assert.deepEqual(await renew(db.pool, key, 'worker-a', granted.epoch, '1 minute'), {
      status: 'lapsed',
      expiresAt: null,
    });
    const taken = await acquire(db.pool, key, 'worker-b', '1 minute');
    assert.equal(taken.epoch, granted.epoch! + 1n);
  });

  test('expiry is read from the clock of each statement, not the transaction start', async () => {
    const key = uniqueKey('expiry-clock');
    const client = await db.pool.connect();
    try {
      await client.query('BEGIN');
      const granted = await acquire(client, key, 'worker-a', '300 milliseconds');
      await sleepPast(client, granted.expiresAt);
      // now() is still the transaction start, before the expiry; the lease has lapsed anyway.
      assert.equal((await inspect(client, key))!.held, false);
      assert.equal((await renew(client, key, 'worker-a', granted.epoch, '1 minute')).status, 'lapsed');
      const t0 = await serverNow(client);
      const taken = await acquire(client, key, 'worker-b', '1 minute');
      const t1 = await serverNow(client);
      assertExpiryWithin(taken.expiresAt, t0, t1, 60n * SECOND);
      await client.query('COMMIT');
    } finally {
      await client.query('ROLLBACK').catch(() => undefined);
      client.release();
    }
  });
});

describe('the epoch sequence of a key', { concurrency: true }, () => {
  test('epochs run 1, 3, 4, 4, 6 through acquire, release, lapse, takeover, re-acquire and release', async () => {
    const key = uniqueKey('sequence');
    const seen: bigint[] = [];
    const remember = (epoch: bigint | null) => {
      assert.ok(epoch !== null);
      seen.push(epoch);
      return epoch;
    };
    const freshGrant = (epoch: bigint | null) => {
      assert.ok(epoch !== null);
      for (const earlier of seen) assert.ok(epoch > earlier, `grant ${epoch} is not fresh`);
      return remember(epoch);
    };

    const e1 = freshGrant((await acquire(db.pool, key, 'worker-a', '30 seconds')).epoch);
    assert.equal(e1, 1n);
    await release(db.pool, key, 'worker-a', e1);
    assert.equal(remember((await inspect(db.pool, key))!.epoch), 2n);

    const short = await acquire(db.pool, key, 'worker-b', '300 milliseconds');
    assert.equal(freshGrant(short.epoch), 3n);
    await sleepPast(db.pool, short.expiresAt);
    assert.equal(remember((await inspect(db.pool, key))!.epoch), 3n, 'a lapse does not move the epoch');

    const takeover = await acquire(db.pool, key, 'worker-a', '30 seconds');
    assert.equal(freshGrant(takeover.epoch), 4n);
    const same = await acquire(db.pool, key, 'worker-a', '30 seconds');
    assert.equal(same.epoch, 4n, 'a same-owner re-acquire keeps the epoch');
    const renewed = await renew(db.pool, key, 'worker-a', 4n, '30 seconds');
    assert.equal(renewed.status, 'ok');
    assert.equal(remember((await inspect(db.pool, key))!.epoch), 4n, 'renew keeps the epoch');

    await release(db.pool, key, 'worker-a', 4n);
    assert.equal(remember((await inspect(db.pool, key))!.epoch), 5n);
    assert.equal(freshGrant((await acquire(db.pool, key, 'worker-b', '30 seconds')).epoch), 6n);
  });

  test('epochs keep full bigint precision beyond 2^53', async () => {
    const key = uniqueKey('big-epoch');
    const granted = await acquire(db.pool, key, 'worker-a', '30 seconds');
    await release(db.pool, key, 'worker-a', granted.epoch);
    // Set-up only: put the watermark where a double would round.
    const big = 9007199254740993n; // 2^53 + 1
    const { rows } = await db.pool.query(
      `SELECT c.oid::regclass::text AS t FROM pg_class c
        WHERE c.relnamespace = 'lease'::regnamespace AND c.relkind = 'r'`,
    );
    await db.pool.query(`UPDATE ${rows[0].t} SET epoch = $2 WHERE key = $1`, [key, String(big)]);
    const next = await acquire(db.pool, key, 'worker-b', '30 seconds');
    assert.equal(next.epoch, big + 1n);
    assert.equal((await release(db.pool, key, 'worker-b', big + 1n)).status, 'ok');
    assert.equal((await inspect(db.pool, key))!.epoch, big + 2n);
  });
});
