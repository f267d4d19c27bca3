/**
 * Found by a review of 0.3.0's counted keys and shared grants (SEMANTICS.md §13): each test
 * failed before its fix.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { fenceCall } from '../support/fence.js';
import { uniqueKey } from '../support/helpers.js';
import {
  acquire,
  acquireCall,
  acquireShared,
  acquireSharedCall,
  holders,
  releaseCall,
  run,
  setLimitCall,
  sleepPast,
} from '../support/lease-calls.js';
import { Isolation } from '../support/sessions.js';

let db: TestDatabase;
before(async () => {
  db = await createTestDatabase();
});
after(() => db.close());

describe('R1. a fenced, lapsed permit or shared grant stalls grants that do not need its place', () => {
  /*
   * The defect: lease._count_permits deleted every lapsed permit of the key before counting, and
   * a DELETE waits for the FOR SHARE lock a fencing transaction holds on a lapsed permit. So
   * every grant of the key, also one with room to spare, waited for the fenced holder's
   * transaction (or failed with 55P03 under a lock_timeout). Fixed: a grant sweeps only the
   * lapsed permits nobody holds, counts a held one as taken, and waits only when it needs its
   * place.
   * The contract: §13 "A permit", fence: the fenced permit's row is held "while the key's other
   * permits are granted, renewed and fenced as usual" and only "a grant that needs its place
   * waits"; §13 "Shared and exclusive": "a grant that needs a fenced lapsed holder's place waits
   * for its transaction" (a shared grant never needs one below 1000).
   */
  test('limit 3, one fenced lapsed permit and one live: a third owner is granted at once', async () => {
    await using iso = await Isolation.open(db.url, ['s1', 's2']);
    const { s1, s2 } = iso.named;
    const key = uniqueKey('review-fenced-room');
    await db.pool.query('SELECT lease.set_limit($1, 3)', [key]);
    await s1.query('BEGIN');
    const a = await acquire(db.pool, key, 'a', '2 seconds');
    await s1.run(fenceCall(key, a.epoch));
    await acquire(db.pool, key, 'b', '1 minute');
    await sleepPast(db.pool, a.expiresAt);
    try {
      // Even counting the fenced permit, 2 < 3: this grant needs nobody's place.
      const c = await s2.run(acquireCall(key, 'c', '1 minute'));
      assert.equal(c.acquired, true);
    } finally {
      await s1.query('ROLLBACK').catch(() => undefined);
    }
  });

  test('a fenced lapsed shared holder: another shared grant is made at once', async () => {
    await using iso = await Isolation.open(db.url, ['s1', 's2']);
    const { s1, s2 } = iso.named;
    const key = uniqueKey('review-fenced-shared');
    await s1.query('BEGIN');
    const a = await acquireShared(db.pool, key, 'a', '2 seconds');
    assert.equal(a.acquired, true);
    await s1.run(fenceCall(key, a.epoch));
    await sleepPast(db.pool, a.expiresAt);
    try {
      const b = await s2.run(acquireSharedCall(key, 'b', '1 minute'));
      assert.equal(b.acquired, true);
    } finally {
      await s1.query('ROLLBACK').catch(() => undefined);
    }
  });
});

describe('R2. an acquire that waits for set_limit(key, NULL) is denied a key that is FREE and was never held', () => {
  /*
   * The defect: lease.acquire sees a counted key (or a key in its shared phase) and goes to
   * lease._acquire_permit, whose grant waits for the key's row lock. When the lock holder was
   * set_limit(key, NULL) and commits, the key is exclusive and FREE; _acquire_permit then finds
   * "v_limit IS NULL" and denied, on both of its rounds, without going back to the exclusive
   * grant. acquire with wait = 0 answers (f, NULL, NULL) although at no instant of the call was
   * the key held by anyone: before the commit it was counted with every permit free (or in its
   * shared phase with no live shared grant), after it FREE. Fixed: lease.acquire then answers
   * by the exclusive grant's rules.
   * The contract: §4 acquire: FREE -> (t, c + 1, now + ttl); only "HELD by another owner"
   * denies. §5: concurrent operations are ordered by the row lock, and of concurrent acquires of
   * a free key exactly one wins (here none does). §13 calls a denial "(f, NULL, NULL)" at the
   * limit only ("At the limit"), and an exclusive acquire in the shared phase is denied only
   * while a shared grant is live.
   */
  for (const phase of ['counted', 'shared'] as const) {
    test(`${phase} key with nothing live, made exclusive in an open transaction: the waiting acquire is granted`, async () => {
      await using iso = await Isolation.open(db.url, ['s1', 's2']);
      const { s1, s2 } = iso.named;
      const key = uniqueKey(`review-flip-${phase}`);
      if (phase === 'counted') {
        await db.pool.query('SELECT lease.set_limit($1, 3)', [key]);
      } else {
        const r = await acquireShared(db.pool, key, 'r', '1 minute');
        assert.equal((await run(db.pool, releaseCall(key, 'r', r.epoch))).status, 'ok');
      }
      assert.deepEqual(await holders(db.pool, key), []);
      await s1.query('BEGIN');
      assert.deepEqual(await s1.run(setLimitCall(key, null)), { permit_limit: null, holders: 0 });
      const s2Acquire = s2.start(acquireCall(key, 'b', '1 minute'));
      await iso.untilBlocked(s2Acquire, s1);
      await s1.query('COMMIT');
      const got = await s2Acquire.result();
      assert.equal(got.acquired, true, 'the key was never held during the call');
      assert.deepEqual((await holders(db.pool, key)).map(([o]) => o), ['b']);
    });
  }
});
