/**
 * SEMANTICS.md §13 counted keys: lease.set_limit, a permit's grant, renew, release and fence,
 * what inspect, list, holders and purge show of a counted key, the batches' refusal, and every
 * race of permits, isolationtester style (test/support/sessions.ts): a step expected to wait is
 * confirmed blocked by the server, a step that must go through fails when it is seen blocked.
 * The last part is a randomized history of permits checked for the rules of §13 (never more
 * than the limit live at any server instant, every epoch fresh), first shown to catch a
 * planted off-by-one in the limit check.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { assertStale, fenceCall } from '../support/fence.js';
import { uniqueKey } from '../support/helpers.js';
import { generator } from '../support/history-model.js';
import {
  acquire,
  acquireCall,
  holders,
  setLimitCall,
  inspect,
  pgError,
  release,
  releaseCall,
  renew,
  renewCall,
  run,
  sleepPast,
  type Queryable,
} from '../support/lease-calls.js';
import { Isolation } from '../support/sessions.js';

let db: TestDatabase;
before(async () => {
  db = await createTestDatabase();
});
after(() => db.close());

async function setLimit(
  q: Queryable,
  key: string,
  limit: number | null,
): Promise<{ limit: number | null; holders: number }> {
  const row = await run(q, setLimitCall(key, limit));
  return { limit: row.permit_limit, holders: row.holders };
}

describe('counted keys, one call at a time', () => {
  test('limit 3: three owners hold a permit each with fresh epochs, the fourth is denied, the same owner gets its permit back', async () => {
    const key = uniqueKey('permits');
    assert.deepEqual(await setLimit(db.pool, key, 3), { limit: 3, holders: 0 });
    const a = await acquire(db.pool, key, 'a', '1 minute');
    const b = await acquire(db.pool, key, 'b', '1 minute');
    const c = await acquire(db.pool, key, 'c', '1 minute');
    assert.ok(a.acquired && b.acquired && c.acquired);
    assert.ok(a.epoch! < b.epoch! && b.epoch! < c.epoch!, 'epochs increase');
    assert.deepEqual(await acquire(db.pool, key, 'd', '1 minute'), {
      acquired: false,
      epoch: null,
      expiresAt: null,
    });
    assert.deepEqual(await acquire(db.pool, key, 'b', '1 minute'), b);
    assert.deepEqual(await holders(db.pool, key), [
      ['a', a.epoch],
      ['b', b.epoch],
      ['c', c.epoch],
    ]);
    const seen = await inspect(db.pool, key);
    assert.deepEqual(seen, { held: true, owner: null, epoch: c.epoch, expiresAt: c.expiresAt });
    const { rows } = await db.pool.query(
      'SELECT held, owner, epoch::text FROM lease.list($1)',
      [key],
    );
    assert.deepEqual(rows, [{ held: true, owner: null, epoch: String(c.epoch) }]);
  });

  test('each permit is renewed and released on its own; a release frees one permit, whose next grant has a fresh epoch', async () => {
    const key = uniqueKey('permits-own');
    await setLimit(db.pool, key, 2);
    const a = await acquire(db.pool, key, 'a', '1 minute');
    const b = await acquire(db.pool, key, 'b', '1 minute');
    const renewed = await renew(db.pool, key, 'a', a.epoch, '2 minutes');
    assert.equal(renewed.status, 'ok');
    assert.ok(renewed.expiresAt! > a.expiresAt!);
    assert.equal((await renew(db.pool, key, 'a', b.epoch, '1 minute')).status, 'epoch_mismatch');
    assert.equal((await renew(db.pool, key, 'z', a.epoch, '1 minute')).status, 'not_owner');
    assert.equal((await release(db.pool, key, 'b', a.epoch)).status, 'epoch_mismatch');
    assert.equal((await release(db.pool, key, 'b', b.epoch)).status, 'ok');
    assert.equal((await release(db.pool, key, 'b', b.epoch)).status, 'not_owner');
    const c = await acquire(db.pool, key, 'c', '1 minute');
    assert.equal(c.acquired, true);
    assert.equal(c.epoch, b.epoch! + 1n);
    assert.deepEqual(await holders(db.pool, key), [
      ['a', a.epoch],
      ['c', c.epoch],
    ]);
  });

  test('a lapsed permit is refused by renew, release and fence while the other holder writes on', async () => {
    const key = uniqueKey('permits-lapse');
    await setLimit(db.pool, key, 2);
    const a = await acquire(db.pool, key, 'a', '200 milliseconds');
    const b = await acquire(db.pool, key, 'b', '1 minute');
    await sleepPast(db.pool, a.expiresAt);
    assert.equal((await renew(db.pool, key, 'a', a.epoch, '1 minute')).status, 'lapsed');
    assert.equal((await release(db.pool, key, 'a', a.epoch)).status, 'lapsed');
    assertStale(
      await pgError(db.pool.query(fenceCall(key, a.epoch).text, fenceCall(key, a.epoch).values)),
      key,
      a.epoch!,
      'the permit of that epoch lapsed',
    );
    await db.pool.query(fenceCall(key, b.epoch).text, fenceCall(key, b.epoch).values);
    // The lapsed permit's place goes to a new holder; a's epoch is never live again.
    const c = await acquire(db.pool, key, 'c', '1 minute');
    assert.equal(c.acquired, true);
    assertStale(
      await pgError(db.pool.query(fenceCall(key, a.epoch).text, fenceCall(key, a.epoch).values)),
      key,
      a.epoch!,
      'no permit or shared grant of the key has that epoch now',
    );
    assert.equal((await renew(db.pool, key, 'a', a.epoch, '1 minute')).status, 'not_owner');
    assert.equal((await renew(db.pool, key, 'b', b.epoch, '1 minute')).status, 'ok');
  });

  test('a limit shrunk below the holders keeps every permit and grants none until fewer than the new limit are live', async () => {
    const key = uniqueKey('permits-shrink');
    await setLimit(db.pool, key, 3);
    const grants = [];
    for (const owner of ['a', 'b', 'c']) grants.push(await acquire(db.pool, key, owner, '1 minute'));
    assert.deepEqual(await setLimit(db.pool, key, 1), { limit: 1, holders: 3 });
    for (const [i, owner] of ['a', 'b', 'c'].entries())
      assert.equal((await renew(db.pool, key, owner, grants[i]!.epoch, '1 minute')).status, 'ok');
    assert.equal((await acquire(db.pool, key, 'd', '1 minute')).acquired, false);
    await release(db.pool, key, 'a', grants[0]!.epoch);
    await release(db.pool, key, 'b', grants[1]!.epoch);
    assert.equal((await acquire(db.pool, key, 'd', '1 minute')).acquired, false);
    await release(db.pool, key, 'c', grants[2]!.epoch);
    const d = await acquire(db.pool, key, 'd', '1 minute');
    assert.equal(d.acquired, true);
    assert.equal(d.epoch, grants[2]!.epoch! + 1n);
    // Growing takes effect at once.
    assert.deepEqual(await setLimit(db.pool, key, 2), { limit: 2, holders: 1 });
    assert.equal((await acquire(db.pool, key, 'e', '1 minute')).acquired, true);
  });

  test('switching kinds: not under a live grant or permit (55006); back to exclusive, the next grant is past every permit', async () => {
    const key = uniqueKey('permits-kind');
    const x = await acquire(db.pool, key, 'x', '1 minute');
    const held = await pgError(setLimit(db.pool, key, 2));
    assert.equal(held.code, '55006');
    assert.equal(held.message, `pg_lease: key "${key}" is held exclusively`);
    await release(db.pool, key, 'x', x.epoch);
    await setLimit(db.pool, key, 2);
    const p = await acquire(db.pool, key, 'p', '1 minute');
    assert.ok(p.epoch! > x.epoch!);
    const live = await pgError(setLimit(db.pool, key, null));
    assert.equal(live.code, '55006');
    assert.equal(live.message, `pg_lease: key "${key}" still has live permits`);
    await release(db.pool, key, 'p', p.epoch);
    assert.deepEqual(await setLimit(db.pool, key, null), { limit: null, holders: 0 });
    const y = await acquire(db.pool, key, 'y', '1 minute');
    assert.equal(y.acquired, true);
    assert.ok(y.epoch! > p.epoch!);
    assert.equal((await inspect(db.pool, key))?.owner, 'y');
  });

  test('bad input changes nothing and says why (22023); a read-only transaction is refused (25006)', async () => {
    const key = uniqueKey('permits-bad');
    await setLimit(db.pool, key, 2);
    const before = await inspect(db.pool, key);
    for (const [k, limit, detail] of [
      [key, 0, 'limit must be NULL or from 1 to 1000'],
      [key, 1001, 'limit must be NULL or from 1 to 1000'],
      ['', 2, 'key must be a non-empty string'],
    ] as const) {
      const error = await pgError(setLimit(db.pool, k, limit));
      assert.equal(error.code, '22023');
      assert.equal(error.message, 'pg_lease: invalid input');
      assert.equal(error.detail, detail);
      assert.match(error.hint ?? '', /limit is NULL \(an exclusive key\) or a number of permits from 1 to 1000/);
    }
    const client = await db.pool.connect();
    try {
      await client.query('BEGIN READ ONLY');
      assert.equal((await pgError(setLimit(client, key, 1))).code, '25006');
      await client.query('ROLLBACK');
    } finally {
      client.release();
    }
    assert.deepEqual(await inspect(db.pool, key), before);
    assert.equal((await acquire(db.pool, key, 'a', '1 minute')).acquired, true);
    assert.equal((await acquire(db.pool, key, 'b', '1 minute')).acquired, true);
  });

  test('the batches refuse counted keys (0A000) and change nothing, also for the exclusive keys beside them', async () => {
    const counted = uniqueKey('permits-batch');
    const plain = uniqueKey('plain-batch');
    await setLimit(db.pool, counted, 2);
    const p = await acquire(db.pool, counted, 'a', '1 minute');
    for (const [sql, values] of [
      ['SELECT * FROM lease.acquire_many($1, $2, $3)', [[plain, counted], 'a', '1 minute']],
      ['SELECT * FROM lease.renew_many($1, $2, $3, $4)', [[counted], 'a', [String(p.epoch)], '1 minute']],
      ['SELECT * FROM lease.release_many($1, $2, $3)', [[counted], 'a', [String(p.epoch)]]],
    ] as const) {
      const error = await pgError(db.pool.query(sql, [...values] as unknown[]));
      assert.equal(error.code, '0A000', error.message);
      assert.match(
        error.message,
        /^pg_lease: (acquire|renew|release)_many does not take counted or shared keys$/,
      );
      assert.equal(error.detail, `Counted keys, or keys in their shared phase: "${counted}".`);
    }
    assert.equal(await inspect(db.pool, plain), undefined);
    assert.deepEqual(await holders(db.pool, counted), [['a', p.epoch]]);
  });

  test('purge never deletes a counted key, even when its permits lapsed long ago', async () => {
    const key = uniqueKey('permits-purge');
    await setLimit(db.pool, key, 1);
    const a = await acquire(db.pool, key, 'a', '100 milliseconds');
    await sleepPast(db.pool, a.expiresAt);
    await db.pool.query(`SELECT lease.purge('0')`);
    assert.equal((await inspect(db.pool, key))?.epoch, a.epoch);
    const b = await acquire(db.pool, key, 'b', '1 minute');
    assert.equal(b.epoch, a.epoch! + 1n);
  });

  test('nobody but the functions reads or writes lease.permits', async () => {
    const { rows } = await db.pool.query(
      `SELECT has_table_privilege('public', 'lease.permits', 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE') AS any`,
    );
    assert.equal(rows[0].any, false);
  });
});

describe('races of permits', { concurrency: true }, () => {
  test('N+1 concurrent acquires of an N-permit key: the one that finds it full waits for the uncommitted grant and is denied; granted if that rolls back', async () => {
    for (const outcome of ['COMMIT', 'ROLLBACK'] as const) {
      await using iso = await Isolation.open(db.url, ['s1', 's2', 's3']);
      const { s1, s2, s3 } = iso.named;
      const key = uniqueKey('permits-race');
      await setLimit(db.pool, key, 2);
      assert.equal((await s1.run(acquireCall(key, 'a', '1 minute'))).acquired, true);
      await s2.query('BEGIN');
      const b = await s2.run(acquireCall(key, 'b', '1 minute'));
      assert.equal(b.acquired, true);
      const s3Acquire = s3.start(acquireCall(key, 'c', '1 minute'));
      await iso.untilBlocked(s3Acquire, s2);
      await s2.query(outcome);
      const c = await s3Acquire.result();
      assert.equal(c.acquired, outcome === 'ROLLBACK');
      if (c.acquired) assert.equal(c.epoch, b.epoch, 'the rolled-back epoch was never handed out');
      assert.equal((await holders(db.pool, key)).length, 2);
    }
  });

  test('many concurrent acquires of a 3-permit key: exactly 3 granted, epochs distinct', async () => {
    for (let round = 0; round < 10; round++) {
      const key = uniqueKey('permits-storm');
      await setLimit(db.pool, key, 3);
      const results = await Promise.all(
        Array.from({ length: 8 }, (_, i) => acquire(db.pool, key, `w${i}`, '1 minute')),
      );
      const won = results.filter((r) => r.acquired);
      assert.equal(won.length, 3);
      assert.equal(new Set(won.map((r) => r.epoch)).size, 3);
    }
  });

  test('a permit renewed in an open transaction just before it lapses is counted: the grant waits for the renew, denied on commit, granted on rollback', async () => {
    for (const outcome of ['COMMIT', 'ROLLBACK'] as const) {
      await using iso = await Isolation.open(db.url, ['s1', 's2']);
      const { s1, s2 } = iso.named;
      const key = uniqueKey('permits-renew-race');
      await setLimit(db.pool, key, 1);
      // In its transaction before the grant: the renewal must come before the lapse.
      await s1.query('BEGIN');
      const a = await acquire(db.pool, key, 'a', '2 seconds');
      assert.equal((await s1.run(renewCall(key, 'a', a.epoch, '1 minute'))).status, 'ok');
      await sleepPast(db.pool, a.expiresAt);
      const s2Acquire = s2.start(acquireCall(key, 'b', '1 minute'));
      await iso.untilBlocked(s2Acquire, s1);
      await s1.query(outcome);
      assert.equal((await s2Acquire.result()).acquired, outcome === 'ROLLBACK');
      assert.equal((await holders(db.pool, key)).length, 1);
    }
  });

  test('a fenced permit that lapses holds back the grant that would take its place, while the other permit holder fences and writes on', async () => {
    await using iso = await Isolation.open(db.url, ['s1', 's2', 's3']);
    const { s1, s2, s3 } = iso.named;
    const key = uniqueKey('permits-fence');
    await setLimit(db.pool, key, 2);
    const b = await acquire(db.pool, key, 'b', '1 minute');
    // In its transaction before the grant: the fence must come before the lapse.
    await s1.query('BEGIN');
    const a = await acquire(db.pool, key, 'a', '2 seconds');
    await s1.run(fenceCall(key, a.epoch));
    await sleepPast(db.pool, a.expiresAt);
    await s3.query('BEGIN');
    await s3.run(fenceCall(key, b.epoch));
    const s2Acquire = s2.start(acquireCall(key, 'c', '1 minute'));
    await iso.untilBlocked(s2Acquire, s1);
    await s3.query('COMMIT');
    await s1.query('COMMIT');
    assert.equal((await s2Acquire.result()).acquired, true);
  });

  test('a limit shrinking under holders in an open transaction: a racing acquire waits for it and is then denied', async () => {
    await using iso = await Isolation.open(db.url, ['s1', 's2']);
    const { s1, s2 } = iso.named;
    const key = uniqueKey('permits-shrink-race');
    await setLimit(db.pool, key, 3);
    await acquire(db.pool, key, 'a', '1 minute');
    await acquire(db.pool, key, 'b', '1 minute');
    await s1.query('BEGIN');
    assert.deepEqual(await s1.run(setLimitCall(key, 2)), { permit_limit: 2, holders: 2 });
    const s2Acquire = s2.start(acquireCall(key, 'c', '1 minute'));
    await iso.untilBlocked(s2Acquire, s1);
    await s1.query('COMMIT');
    assert.equal((await s2Acquire.result()).acquired, false);
  });

  test('a denied acquire keeps no lock: renew, release and set_limit of the key go through while its transaction stays open', async () => {
    await using iso = await Isolation.open(db.url, ['s1', 's2']);
    const { s1, s2 } = iso.named;
    const key = uniqueKey('permits-denied');
    await setLimit(db.pool, key, 1);
    const a = await acquire(db.pool, key, 'a', '1 minute');
    await s1.query('BEGIN');
    assert.equal((await s1.run(acquireCall(key, 'b', '1 minute'))).acquired, false);
    assert.equal((await s2.run(renewCall(key, 'a', a.epoch, '1 minute'))).status, 'ok');
    await s2.run(setLimitCall(key, 2));
    assert.equal((await s2.run(releaseCall(key, 'a', a.epoch))).status, 'ok');
    await s1.query('COMMIT');
  });

  test('purge against permits: an open purge holds up no permit call, and a free key it deleted comes back counted with a fresh epoch', async () => {
    await using iso = await Isolation.open(db.url, ['s1', 's2']);
    const { s1, s2 } = iso.named;
    const counted = uniqueKey('permits-purge-race');
    const free = uniqueKey('permits-purged');
    await setLimit(db.pool, counted, 1);
    const held = await acquire(db.pool, counted, 'a', '100 milliseconds');
    const x = await acquire(db.pool, free, 'x', '1 minute');
    await release(db.pool, free, 'x', x.epoch);
    await sleepPast(db.pool, held.expiresAt);
    await s1.query('BEGIN');
    await s1.query(`SELECT lease.purge('0')`);
    const b = await s2.run(acquireCall(counted, 'b', '1 minute'));
    assert.equal(b.acquired, true);
    assert.equal((await s2.run(renewCall(counted, 'b', b.epoch, '1 minute'))).status, 'ok');
    const s2Limit = s2.start(setLimitCall(free, 2));
    await iso.untilBlocked(s2Limit, s1);
    await s1.query('COMMIT');
    await s2Limit.result();
    const p = await acquire(db.pool, free, 'p', '1 minute');
    assert.equal(p.acquired, true);
    assert.ok(p.epoch! > x.epoch! + 1n, `${p.epoch} must be past ${x.epoch! + 1n}`);
  });
});

/**
 * A randomized history of permits. Sessions acquire, renew and release permits of a few counted
 * keys with short ttls, each call with `clock_timestamp()` read in its own statement after the
 * call returned (t1). A permit is then held at least over [grant's t1, end), end being its
 * release's t1 or its last expiry: the grant counted the key's permits before t1, and a release
 * committed only after its t1; so any instant where more than the limit of these intervals
 * overlap is a real violation, in every commit order. Epochs of a key must be distinct.
 */
interface Permit {
  key: string;
  epoch: bigint;
  start: bigint;
  end: bigint;
}

async function permitHistory(url: string, seed: number, ops: number): Promise<string[]> {
  const random = generator(seed);
  const keys = ['h1', 'h2'].map((k) => uniqueKey(`hist-${k}`));
  const limit = 2;
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  for (const key of keys) await admin.query('SELECT lease.set_limit($1, $2)', [key, limit]);
  const permits: Permit[] = [];
  const sessions = 5;
  const worker = async (s: number) => {
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    const mine = new Map<string, Permit>();
    try {
      for (let i = 0; i < ops / sessions; i++) {
        const key = keys[Math.floor(random() * keys.length)]!;
        const owner = `s${s}`;
        const held = mine.get(key);
        const ttl = `${20 + Math.floor(random() * 80)} milliseconds`;
        if (!held || random() < 0.2) {
          const { rows } = await client.query(
            `SELECT a.acquired, a.epoch::text, (extract(epoch FROM a.expires_at) * 1e6)::bigint::text AS e,
                    (extract(epoch FROM clock_timestamp()) * 1e6)::bigint::text AS t1
               FROM lease.acquire($1, $2, $3) AS a`,
            [key, owner, ttl],
          );
          const r = rows[0];
          if (r.acquired && (!held || BigInt(r.epoch) !== held.epoch)) {
            const p = { key, epoch: BigInt(r.epoch), start: BigInt(r.t1), end: BigInt(r.e) };
            permits.push(p);
            mine.set(key, p);
          }
        } else if (random() < 0.6) {
          const { rows } = await client.query(
            `SELECT r.status, (extract(epoch FROM r.expires_at) * 1e6)::bigint::text AS e
               FROM lease.renew($1, $2, $3, $4) AS r`,
            [key, owner, String(held.epoch), ttl],
          );
          if (rows[0].status === 'ok') held.end = BigInt(rows[0].e);
          else mine.delete(key);
        } else {
          const { rows } = await client.query(
            `SELECT r.status, (extract(epoch FROM clock_timestamp()) * 1e6)::bigint::text AS t1
               FROM lease.release($1, $2, $3) AS r`,
            [key, owner, String(held.epoch)],
          );
          if (rows[0].status === 'ok' && BigInt(rows[0].t1) < held.end) held.end = BigInt(rows[0].t1);
          mine.delete(key);
        }
        if (random() < 0.1) await new Promise((resolve) => setTimeout(resolve, 30));
      }
    } finally {
      await client.end();
    }
  };
  await Promise.all(Array.from({ length: sessions }, (_, s) => worker(s)));
  await admin.end();

  const violations: string[] = [];
  for (const key of keys) {
    const mineK = permits.filter((p) => p.key === key);
    const epochs = mineK.map((p) => p.epoch);
    if (new Set(epochs).size !== epochs.length) violations.push(`${key}: an epoch handed out twice`);
    const events = mineK
      .filter((p) => p.start < p.end)
      .flatMap((p) => [
        { t: p.start, d: 1 },
        { t: p.end, d: -1 },
      ])
      .sort((x, y) => (x.t === y.t ? x.d - y.d : x.t < y.t ? -1 : 1));
    let live = 0;
    for (const e of events) {
      live += e.d;
      if (live > limit) {
        violations.push(`${key}: ${live} permits live at ${e.t} (limit ${limit})`);
        break;
      }
    }
  }
  return violations;
}

describe('randomized history of permits', () => {
  test('the checker catches a planted off-by-one in the limit check', async () => {
    const planted = await createTestDatabase();
    try {
      const { rows } = await planted.pool.query(
        `SELECT pg_get_functiondef('lease._acquire_permit(text, text, interval, boolean)'::regprocedure) AS def`,
      );
      const def = rows[0].def as string;
      const broken = def
        .replaceAll('v_count >= GREATEST(v_limit, 1)', 'v_count > GREATEST(v_limit, 1)')
        .replaceAll('v_count >= v_room', 'v_count > v_room');
      assert.notEqual(broken, def, 'the limit check to plant the defect in');
      await planted.pool.query(broken);
      const seed = Date.now() >>> 0;
      const violations = await permitHistory(planted.url, seed, 600);
      assert.ok(violations.length > 0, `seed ${seed}: the planted defect went unnoticed`);
    } finally {
      await planted.close();
    }
  });

  test('the extension passes the same history', async () => {
    const seed = Number(process.env.PG_LEASE_HISTORY_SEED ?? Date.now() >>> 0);
    const violations = await permitHistory(db.url, seed, 1500);
    assert.deepEqual(violations, [], `seed ${seed}`);
  });
});
