/**
 * SEMANTICS.md §13 shared and exclusive: lease.acquire_shared, the shared phase of a key, what
 * renew, release, fence, inspect, list, watch, holders, purge and the batches do with shared
 * grants, and every race of shared against exclusive grants, isolationtester style
 * (test/support/sessions.ts), with the no-starvation rule's one home here. The last part is a
 * randomized history of shared and exclusive grants checked for "never a shared grant beside an
 * exclusive one", first shown to catch a planted defect.
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
  acquireShared as shared,
  acquireSharedCall as sharedCall,
  holders,
  inspect,
  micros,
  pgError,
  release,
  releaseCall,
  renew,
  renewCall,
  sleepPast,
} from '../support/lease-calls.js';
import { Isolation } from '../support/sessions.js';

let db: TestDatabase;
before(async () => {
  db = await createTestDatabase();
});
after(() => db.close());

const denied = { acquired: false, epoch: null, expiresAt: null };

describe('shared and exclusive, one call at a time', () => {
  test('many owners hold a key shared with fresh epochs; an exclusive acquire is denied until the last shared grant is released, then gets an epoch past all of them', async () => {
    const key = uniqueKey('shared');
    const a = await shared(db.pool, key, 'a', '1 minute');
    const b = await shared(db.pool, key, 'b', '1 minute');
    const c = await shared(db.pool, key, 'c', '2 minutes');
    assert.ok(a.acquired && b.acquired && c.acquired);
    assert.ok(a.epoch! < b.epoch! && b.epoch! < c.epoch!, 'epochs increase');
    assert.deepEqual(await shared(db.pool, key, 'b', '1 minute'), b, 'the same owner gets its grant back');
    assert.deepEqual(await acquire(db.pool, key, 'w', '1 minute'), denied);
    assert.deepEqual(await holders(db.pool, key), [
      ['a', a.epoch],
      ['b', b.epoch],
      ['c', c.epoch],
    ]);
    // inspect, list and watch show a shared key as a counted one: held, no one owner, the
    // key's epoch, the latest expiry of its live grants.
    assert.deepEqual(await inspect(db.pool, key), {
      held: true,
      owner: null,
      epoch: c.epoch,
      expiresAt: c.expiresAt,
    });
    const listed = await db.pool.query(
      `SELECT held, owner, epoch::text, ${micros('expires_at')} AS e FROM lease.list($1)`,
      [key],
    );
    assert.deepEqual(listed.rows, [
      { held: true, owner: null, epoch: String(c.epoch), e: String(c.expiresAt) },
    ]);
    const watched = await db.pool.query(
      `SELECT held, owner, ${micros('expires_at')} AS e FROM lease.watch($1, '1 second')`,
      [key],
    );
    assert.deepEqual(watched.rows, [{ held: true, owner: null, e: String(c.expiresAt) }]);

    for (const g of [a, b, c]) {
      const owner = g === a ? 'a' : g === b ? 'b' : 'c';
      assert.equal((await release(db.pool, key, owner, g.epoch)).status, 'ok');
    }
    assert.equal((await inspect(db.pool, key))?.held, false);
    const w = await acquire(db.pool, key, 'w', '1 minute');
    assert.equal(w.acquired, true);
    assert.equal(w.epoch, c.epoch! + 1n);
    assert.deepEqual(await inspect(db.pool, key), {
      held: true,
      owner: 'w',
      epoch: w.epoch,
      expiresAt: w.expiresAt,
    });
  });

  test('a live exclusive grant denies shared grants; once it is released or lapsed a shared grant gets a fresh epoch and the lapsed holder is refused', async () => {
    const key = uniqueKey('shared-after-exclusive');
    const w = await acquire(db.pool, key, 'w', '200 milliseconds');
    assert.deepEqual(await shared(db.pool, key, 'a', '1 minute'), denied);
    assert.deepEqual(await shared(db.pool, key, 'w', '1 minute'), denied, 'no downgrade');
    await sleepPast(db.pool, w.expiresAt);
    const a = await shared(db.pool, key, 'a', '1 minute');
    assert.equal(a.acquired, true);
    assert.equal(a.epoch, w.epoch! + 1n);
    assert.equal((await renew(db.pool, key, 'w', w.epoch, '1 minute')).status, 'not_owner');
    assertStale(
      await pgError(db.pool.query(fenceCall(key, w.epoch).text, fenceCall(key, w.epoch).values)),
      key,
      w.epoch!,
      'no permit or shared grant of the key has that epoch now',
    );
  });

  test('a shared holder renews, releases and fences its own grant; a lapsed shared holder is refused by renew, release and fence while another fences and writes on', async () => {
    const key = uniqueKey('shared-lapse');
    const a = await shared(db.pool, key, 'a', '200 milliseconds');
    const b = await shared(db.pool, key, 'b', '1 minute');
    const renewed = await renew(db.pool, key, 'b', b.epoch, '2 minutes');
    assert.equal(renewed.status, 'ok');
    assert.ok(renewed.expiresAt! > b.expiresAt!);
    assert.equal((await renew(db.pool, key, 'b', a.epoch, '1 minute')).status, 'epoch_mismatch');
    await sleepPast(db.pool, a.expiresAt);
    assert.equal((await renew(db.pool, key, 'a', a.epoch, '1 minute')).status, 'lapsed');
    assert.equal((await release(db.pool, key, 'a', a.epoch)).status, 'lapsed');
    assertStale(
      await pgError(db.pool.query(fenceCall(key, a.epoch).text, fenceCall(key, a.epoch).values)),
      key,
      a.epoch!,
      'the permit of that epoch lapsed',
    );
    const client = await db.pool.connect();
    try {
      await client.query('BEGIN');
      await client.query(fenceCall(key, b.epoch).text, fenceCall(key, b.epoch).values);
      await client.query('COMMIT');
    } finally {
      client.release();
    }
    assert.deepEqual(await acquire(db.pool, key, 'w', '1 minute'), denied);
    assert.equal((await release(db.pool, key, 'b', b.epoch)).status, 'ok');
    assert.equal((await acquire(db.pool, key, 'w', '1 minute')).acquired, true);
  });

  test('acquire_shared with wait > 0 waits out an exclusive grant and is granted at its lapse; it times out with 57014 like acquire', async () => {
    const key = uniqueKey('shared-wait');
    const w = await acquire(db.pool, key, 'w', '300 milliseconds');
    const a = await shared(db.pool, key, 'a', '1 minute', '10 seconds');
    assert.equal(a.acquired, true);
    assert.ok(a.epoch! > w.epoch!);
    const held = uniqueKey('shared-wait-held');
    assert.equal((await acquire(db.pool, held, 'w', '1 minute')).acquired, true);
    const error = await pgError(shared(db.pool, held, 'b', '1 minute', '200 milliseconds'));
    assert.equal(error.code, '57014');
    assert.equal(error.message, 'pg_lease: acquire timed out');
  });

  test('no upgrade: a shared holder that asks for the key exclusively is denied, its grant untouched', async () => {
    const key = uniqueKey('shared-upgrade');
    const a = await shared(db.pool, key, 'a', '1 minute');
    assert.deepEqual(await acquire(db.pool, key, 'a', '1 minute'), denied);
    assert.deepEqual(await holders(db.pool, key), [['a', a.epoch]]);
  });

  test('counted keys take no shared grants (0A000); set_limit refuses a key with live shared grants (55006) and takes it once they are gone', async () => {
    const counted = uniqueKey('shared-counted');
    await db.pool.query('SELECT lease.set_limit($1, 2)', [counted]);
    const error = await pgError(shared(db.pool, counted, 'a', '1 minute'));
    assert.equal(error.code, '0A000');
    assert.equal(error.message, `pg_lease: key "${counted}" is a counted key`);

    const key = uniqueKey('shared-set-limit');
    const a = await shared(db.pool, key, 'a', '1 minute');
    for (const limit of [2, null]) {
      const busy = await pgError(db.pool.query('SELECT lease.set_limit($1, $2)', [key, limit]));
      assert.equal(busy.code, '55006', busy.message);
    }
    assert.equal((await release(db.pool, key, 'a', a.epoch)).status, 'ok');
    await db.pool.query('SELECT lease.set_limit($1, 2)', [key]);
    const p = await acquire(db.pool, key, 'p', '1 minute');
    assert.equal(p.epoch, a.epoch! + 1n);
  });

  test('the batches refuse keys in their shared phase (0A000) and change nothing', async () => {
    const key = uniqueKey('shared-batch');
    const plain = uniqueKey('plain-batch');
    const a = await shared(db.pool, key, 'a', '1 minute');
    for (const [sql, values] of [
      ['SELECT * FROM lease.acquire_many($1, $2, $3)', [[plain, key], 'a', '1 minute']],
      ['SELECT * FROM lease.renew_many($1, $2, $3, $4)', [[key], 'a', [String(a.epoch)], '1 minute']],
      ['SELECT * FROM lease.release_many($1, $2, $3)', [[key], 'a', [String(a.epoch)]]],
    ] as const) {
      const error = await pgError(db.pool.query(sql, [...values] as unknown[]));
      assert.equal(error.code, '0A000', error.message);
      assert.match(error.message, /does not take counted or shared keys$/);
      assert.equal(error.detail, `Counted keys, or keys in their shared phase: "${key}".`);
    }
    assert.equal(await inspect(db.pool, plain), undefined);
    assert.deepEqual(await holders(db.pool, key), [['a', a.epoch]]);
  });

  test('purge never deletes a key in its shared phase; made exclusive again it is purgeable', async () => {
    const key = uniqueKey('shared-purge');
    const a = await shared(db.pool, key, 'a', '100 milliseconds');
    await sleepPast(db.pool, a.expiresAt);
    await db.pool.query(`SELECT lease.purge('0')`);
    assert.equal((await inspect(db.pool, key))?.epoch, a.epoch);
    await db.pool.query('SELECT lease.set_limit($1, NULL)', [key]);
    await db.pool.query(`SELECT lease.purge('0')`);
    assert.equal(await inspect(db.pool, key), undefined);
    const b = await shared(db.pool, key, 'b', '1 minute');
    assert.ok(b.epoch! > a.epoch!, 'a purged key comes back past its old epochs');
  });

  test('bad input is refused (22023) and a read-only transaction too (25006)', async () => {
    for (const [key, owner, ttl] of [
      ['', 'a', '1 minute'],
      ['k', '', '1 minute'],
      ['k', 'a', '0'],
    ] as const) {
      assert.equal((await pgError(shared(db.pool, key, owner, ttl))).code, '22023');
    }
    const client = await db.pool.connect();
    try {
      await client.query('BEGIN READ ONLY');
      assert.equal((await pgError(shared(client, uniqueKey('ro'), 'a', '1 minute'))).code, '25006');
      await client.query('ROLLBACK');
    } finally {
      client.release();
    }
  });
});

/** Polls a wait=0 shared acquire of a fresh owner until it is denied, within a bound. */
async function untilSharedDenied(key: string): Promise<void> {
  for (let i = 0; i < 200; i++) {
    const r = await shared(db.pool, key, `probe${i}`, '1 minute');
    if (!r.acquired) return;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  assert.fail('shared grants went on while an exclusive acquirer waited');
}

describe('races of shared and exclusive grants', { concurrency: true }, () => {
  test('no starvation: an exclusive acquirer waiting on shared holders stops new shared grants, and gets the key when the holders leave', async () => {
    await using iso = await Isolation.open(db.url, ['s1', 's2']);
    const { s1 } = iso.named;
    const key = uniqueKey('shared-starve');
    const a = await shared(db.pool, key, 'a', '1 minute');
    const waiter = s1.start(acquireCall(key, 'w', '1 minute', '30 seconds'));
    // Shared grants made before the waiter marked the key are its holders too.
    await untilSharedDenied(key);
    const before = await holders(db.pool, key);
    for (const [owner, epoch] of before) {
      assert.equal((await release(db.pool, key, owner, epoch)).status, 'ok');
    }
    const w = await waiter.result();
    assert.equal(w.acquired, true);
    assert.ok(w.epoch! > a.epoch!);
    assert.deepEqual(await shared(db.pool, key, 'b', '1 minute'), denied);
    assert.equal((await release(db.pool, key, 'w', w.epoch)).status, 'ok');
    assert.equal((await shared(db.pool, key, 'b', '1 minute')).acquired, true);
  });

  test('a waiter that gives up leaves no mark: shared grants resume at once', async () => {
    const key = uniqueKey('shared-gave-up');
    await shared(db.pool, key, 'a', '1 minute');
    const error = await pgError(acquire(db.pool, key, 'w', '1 minute', '300 milliseconds'));
    assert.equal(error.code, '57014');
    assert.equal((await shared(db.pool, key, 'b', '1 minute')).acquired, true);
  });

  test('no starvation by readers whose transactions overlap: a waiter marks the key although some reader always has its grant transaction open, and gets the key', async () => {
    const key = uniqueKey('shared-stream');
    const readers = await Promise.all(
      Array.from({ length: 3 }, async () => {
        const client = new pg.Client({ connectionString: db.url });
        await client.connect();
        return client;
      }),
    );
    let stop = false;
    // Each reader keeps its grant's transaction open for 60 ms, and the three are staggered,
    // so at every instant one of them holds the writers' mark in share mode.
    const loops = readers.map(async (client, i) => {
      await new Promise((resolve) => setTimeout(resolve, i * 20));
      for (let n = 0; !stop; n++) {
        await client.query('BEGIN');
        const r = await shared(client, key, `r${i}-${n}`, '2 seconds');
        await client.query('SELECT pg_sleep(0.06)');
        await client.query('COMMIT');
        if (r.acquired) await release(client, key, `r${i}-${n}`, r.epoch);
      }
    });
    await new Promise((resolve) => setTimeout(resolve, 200));
    try {
      const w = await acquire(db.pool, key, 'w', '1 minute', '20 seconds');
      assert.equal(w.acquired, true);
    } finally {
      stop = true;
      await Promise.all(loops);
      await Promise.all(readers.map((client) => client.end()));
    }
  });

  test('without an exclusive waiter, shared grants go on beside each other', async () => {
    const key = uniqueKey('shared-no-waiter');
    const results = await Promise.all(
      Array.from({ length: 8 }, (_, i) => shared(db.pool, key, `r${i}`, '1 minute')),
    );
    assert.equal(results.filter((r) => r.acquired).length, 8);
    assert.equal(new Set(results.map((r) => r.epoch)).size, 8);
  });

  test('shared and exclusive acquires racing on one key: either only shared grants or exactly one exclusive', async () => {
    for (let round = 0; round < 10; round++) {
      const key = uniqueKey('shared-storm');
      const calls = Array.from({ length: 8 }, (_, i) =>
        i % 3 === 0
          ? acquire(db.pool, key, `x${i}`, '1 minute').then((r) => ({ mode: 'x', ...r }))
          : shared(db.pool, key, `r${i}`, '1 minute').then((r) => ({ mode: 's', ...r })),
      );
      const won = (await Promise.all(calls)).filter((r) => r.acquired);
      const exclusive = won.filter((r) => r.mode === 'x');
      assert.ok(won.length > 0);
      if (exclusive.length > 0) assert.equal(won.length, 1, JSON.stringify(won, (_, v) => String(v)));
      assert.equal(new Set(won.map((r) => r.epoch)).size, won.length);
      assert.equal((await holders(db.pool, key)).length, won.length);
    }
  });

  test('a shared grant renewed in an open transaction just before it lapses is counted: the exclusive acquire waits for the renew, denied on commit, granted on rollback', async () => {
    for (const outcome of ['COMMIT', 'ROLLBACK'] as const) {
      await using iso = await Isolation.open(db.url, ['s1', 's2']);
      const { s1, s2 } = iso.named;
      const key = uniqueKey('shared-renew-race');
      // The renewal must come before the lapse: the session is open and in its transaction
      // before the grant, so one round trip lies between them (at load 16 opening the
      // sessions after the grant took longer than a 1.2 s ttl).
      await s1.query('BEGIN');
      const a = await shared(db.pool, key, 'a', '2 seconds');
      assert.equal((await s1.run(renewCall(key, 'a', a.epoch, '1 minute'))).status, 'ok');
      await sleepPast(db.pool, a.expiresAt);
      const s2Acquire = s2.start(acquireCall(key, 'w', '1 minute'));
      await iso.untilBlocked(s2Acquire, s1);
      await s1.query(outcome);
      assert.equal((await s2Acquire.result()).acquired, outcome === 'ROLLBACK');
      assert.equal((await holders(db.pool, key)).length, 1);
    }
  });

  test('a shared holder lapses while another renews in an open transaction: the lapsed one is refused, the other writes on, and nothing exclusive is granted', async () => {
    await using iso = await Isolation.open(db.url, ['s1', 's2']);
    const { s1, s2 } = iso.named;
    const key = uniqueKey('shared-lapse-race');
    const a = await shared(db.pool, key, 'a', '1200 milliseconds');
    const b = await shared(db.pool, key, 'b', '1 minute');
    await s1.query('BEGIN');
    assert.equal((await s1.run(renewCall(key, 'b', b.epoch, '1 minute'))).status, 'ok');
    await s1.run(fenceCall(key, b.epoch));
    await sleepPast(db.pool, a.expiresAt);
    assert.equal((await s2.run(renewCall(key, 'a', a.epoch, '1 minute'))).status, 'lapsed');
    assertStale(
      await pgError(s2.run(fenceCall(key, a.epoch))),
      key,
      a.epoch!,
      'the permit of that epoch lapsed',
    );
    const s2Acquire = s2.start(acquireCall(key, 'w', '1 minute'));
    const seen = await iso.blockedOrSettled(s2Acquire, s1);
    await s1.query('COMMIT');
    assert.equal((await s2Acquire.result()).acquired, false, `exclusive granted (${seen})`);
    assert.deepEqual(await holders(db.pool, key), [['b', b.epoch]]);
  });

  test('purge against shared holders: an open purge holds up no shared call, and a key it deleted comes back shared with a fresh epoch', async () => {
    await using iso = await Isolation.open(db.url, ['s1', 's2']);
    const { s1, s2 } = iso.named;
    const key = uniqueKey('shared-purge-race');
    const free = uniqueKey('shared-purged');
    const a = await shared(db.pool, key, 'a', '1 minute');
    const x = await acquire(db.pool, free, 'x', '1 minute');
    await release(db.pool, free, 'x', x.epoch);
    await s1.query('BEGIN');
    await s1.query(`SELECT lease.purge('0')`);
    const b = await s2.run(sharedCall(key, 'b', '1 minute'));
    assert.equal(b.acquired, true);
    assert.equal((await s2.run(renewCall(key, 'a', a.epoch, '1 minute'))).status, 'ok');
    assert.equal((await s2.run(releaseCall(key, 'b', b.epoch))).status, 'ok');
    const s2Shared = s2.start(sharedCall(free, 'p', '1 minute'));
    await iso.untilBlocked(s2Shared, s1);
    await s1.query('COMMIT');
    const p = await s2Shared.result();
    assert.equal(p.acquired, true);
    assert.ok(p.epoch! > x.epoch! + 1n, `${p.epoch} must be past ${x.epoch! + 1n}`);
  });
});

/**
 * A randomized history of shared and exclusive grants on a few keys, with short ttls. Each grant
 * is held at least over [t1 of its grant, end), end being its release's t1 or its last expiry
 * (as in permits.test.ts); an instant where an exclusive interval overlaps any other interval
 * of the same key is a real violation in every commit order. Epochs of a key must be distinct.
 */
interface Grant {
  key: string;
  exclusive: boolean;
  epoch: bigint;
  start: bigint;
  end: bigint;
}

async function sharedHistory(url: string, seed: number, ops: number): Promise<string[]> {
  const random = generator(seed);
  const keys = ['h1', 'h2'].map((k) => uniqueKey(`shist-${k}`));
  const grants: Grant[] = [];
  const sessions = 5;
  const t1 = micros('clock_timestamp()');
  const worker = async (s: number) => {
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    const mine = new Map<string, Grant>();
    try {
      for (let i = 0; i < ops / sessions; i++) {
        const key = keys[Math.floor(random() * keys.length)]!;
        const owner = `s${s}`;
        const held = mine.get(key);
        const ttl = `${20 + Math.floor(random() * 80)} milliseconds`;
        if (!held) {
          const exclusive = random() < 0.3;
          const { rows } = await client.query(
            `SELECT a.acquired, a.epoch::text, ${micros('a.expires_at')} AS e, ${t1} AS t1
               FROM lease.${exclusive ? 'acquire' : 'acquire_shared'}($1, $2, $3) AS a`,
            [key, owner, ttl],
          );
          const r = rows[0];
          if (r.acquired) {
            const g = { key, exclusive, epoch: BigInt(r.epoch), start: BigInt(r.t1), end: BigInt(r.e) };
            grants.push(g);
            mine.set(key, g);
          }
        } else if (random() < 0.6) {
          const { rows } = await client.query(
            `SELECT r.status, ${micros('r.expires_at')} AS e FROM lease.renew($1, $2, $3, $4) AS r`,
            [key, owner, String(held.epoch), ttl],
          );
          if (rows[0].status === 'ok') held.end = BigInt(rows[0].e);
          else mine.delete(key);
        } else {
          const { rows } = await client.query(
            `SELECT r.status, ${t1} AS t1 FROM lease.release($1, $2, $3) AS r`,
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

  const violations: string[] = [];
  for (const key of keys) {
    const mineK = grants.filter((g) => g.key === key);
    const epochs = mineK.map((g) => g.epoch);
    if (new Set(epochs).size !== epochs.length) violations.push(`${key}: an epoch handed out twice`);
    for (const x of mineK.filter((g) => g.exclusive && g.start < g.end)) {
      const beside = mineK.find(
        (g) => g !== x && g.start < g.end && g.start < x.end && x.start < g.end,
      );
      if (beside) {
        violations.push(
          `${key}: exclusive epoch ${x.epoch} beside ${beside.exclusive ? 'exclusive' : 'shared'} epoch ${beside.epoch}`,
        );
      }
    }
  }
  return violations;
}

describe('randomized history of shared and exclusive grants', () => {
  test('the checker catches a planted defect: an exclusive grant made beside one shared grant', async () => {
    const planted = await createTestDatabase();
    try {
      const { rows } = await planted.pool.query(
        `SELECT pg_get_functiondef('lease._acquire_permit(text, text, interval, boolean)'::regprocedure) AS def`,
      );
      const def = rows[0].def as string;
      const broken = def
        .replaceAll('GREATEST(v_limit, 1)', 'GREATEST(v_limit, 2)')
        .replaceAll('WHEN NOT p_shared AND v_limit = 0 THEN 1', 'WHEN NOT p_shared AND v_limit = 0 THEN 2');
      assert.equal(
        def.split('WHEN NOT p_shared AND v_limit = 0 THEN 1').length,
        2,
        'the check to plant the defect in',
      );
      await planted.pool.query(broken);
      const seed = Date.now() >>> 0;
      const violations = await sharedHistory(planted.url, seed, 600);
      assert.ok(violations.length > 0, `seed ${seed}: the planted defect went unnoticed`);
    } finally {
      await planted.close();
    }
  });

  test('the extension passes the same history', async () => {
    const seed = Number(process.env.PG_LEASE_HISTORY_SEED ?? Date.now() >>> 0);
    const violations = await sharedHistory(db.url, seed, 1500);
    assert.deepEqual(violations, [], `seed ${seed}`);
  });
});
