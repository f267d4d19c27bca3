/**
 * SEMANTICS.md §10 Fence and I12: `lease.fence(key, epoch)` passes only for the key's live
 * grant and then holds the key's row until the transaction ends; `lease.fence_row` applies it
 * to every inserted or updated row. This file is the only home of the fence races (the
 * isolation specs `fence-*` were ported here and removed, so they run on every supported
 * major): a step expected to wait is confirmed blocked by the server (`pg_blocking_pids`), and
 * a step that must go through fails the test when the server shows it blocked.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import {
  assertStale,
  createFencedTable,
  fence,
  fenceCall,
  rowLockedByCurrentTransaction,
} from '../support/fence.js';
import {
  acquire,
  acquireCall,
  allRows,
  inspect,
  pgError,
  release,
  releaseCall,
  renewCall,
  sleepPast,
  type Queryable,
} from '../support/lease-calls.js';
import { uniqueKey } from '../support/helpers.js';
import { createRole, type TestRole } from '../support/roles.js';
import { Isolation, StepBlockedError } from '../support/sessions.js';

let db: TestDatabase;
before(async () => {
  db = await createTestDatabase();
  await db.pool.query('CREATE TABLE fenced_writes (id serial PRIMARY KEY, key text, epoch bigint)');
});
after(() => db.close());

const write = (session: Queryable, key: string, epoch: bigint) =>
  session.query('INSERT INTO fenced_writes (key, epoch) VALUES ($1, $2)', [key, String(epoch)]);

async function writes(key: string): Promise<bigint[]> {
  const { rows } = await db.pool.query<{ epoch: string }>(
    'SELECT epoch::text FROM fenced_writes WHERE key = $1 ORDER BY id',
    [key],
  );
  return rows.map((row) => BigInt(row.epoch));
}

/** A key whose grant of epoch 1 was released (watermark 2) and that is held again at epoch 3. */
async function regranted(key: string): Promise<void> {
  const first = await acquire(db.pool, key, 'worker-a', '1 minute');
  assert.equal((await release(db.pool, key, 'worker-a', first.epoch)).status, 'ok');
  assert.equal((await acquire(db.pool, key, 'worker-b', '1 minute')).epoch, 3n);
}

describe('fence: what it accepts and refuses', { concurrency: true }, () => {
  test('a fence of the live grant passes and keeps the row locked by its transaction', async () => {
    const key = uniqueKey('fence-live');
    const granted = await acquire(db.pool, key, 'worker-a', '1 minute');
    const client = await db.pool.connect();
    try {
      await client.query('BEGIN');
      await fence(client, key, granted.epoch);
      assert.equal(await rowLockedByCurrentTransaction(client, key), true);
      await client.query('COMMIT');
    } finally {
      client.release();
    }
  });

  test('a fence refuses every epoch but the live one with PLF01 naming what stands now', async () => {
    const held = uniqueKey('fence-held');
    const free = uniqueKey('fence-free');
    const lapsed = uniqueKey('fence-lapsed');
    const never = uniqueKey('fence-never "quoted"');
    await regranted(held);
    const freed = await acquire(db.pool, free, 'worker-a', '1 minute');
    assert.equal((await release(db.pool, free, 'worker-a', freed.epoch)).status, 'ok');
    const short = await acquire(db.pool, lapsed, 'worker-a', '200 milliseconds');
    await sleepPast(db.pool, short.expiresAt);
    // The other tests of this describe run at the same time: compare this test's rows only.
    const mine = [held, free, lapsed, never];
    const before = await allRows(db.pool, mine);

    const cases: [string, bigint, string][] = [
      [held, 1n, 'the key is held under epoch 3'],
      [held, 2n, 'the key is held under epoch 3'],
      [held, 4n, 'the key is held under epoch 3'],
      [held, 0n, 'the key is held under epoch 3'],
      [held, -3n, 'the key is held under epoch 3'],
      [free, 1n, 'the key is free with watermark 2'],
      [free, 2n, 'the key is free with watermark 2'],
      [lapsed, 1n, 'the key lapsed (epoch 1)'],
      [lapsed, 2n, 'the key lapsed (epoch 1)'],
      [never, 1n, 'the key was never granted'],
    ];
    for (const [key, epoch, standing] of cases)
      assertStale(await pgError(fence(db.pool, key, epoch)), key, epoch, standing);
    assert.deepEqual(await allRows(db.pool, mine), before, 'a refused fence changes nothing');
  });

  test('a fence with invalid input raises 22023 naming every violation', async () => {
    const cases: [string | null, bigint | null, string][] = [
      [null, 1n, 'key must be a non-empty string'],
      ['', 1n, 'key must be a non-empty string'],
      ['k'.repeat(1001), 1n, 'key must be at most 1000 bytes'],
      ['é'.repeat(501), 1n, 'key must be at most 1000 bytes'],
      ['k', null, 'epoch must not be null'],
      [null, null, 'key must be a non-empty string; epoch must not be null'],
    ];
    for (const [key, epoch, detail] of cases) {
      const error = await pgError(fence(db.pool, key, epoch));
      assert.equal(error.code, '22023', `${key?.slice(0, 10)}: ${error.message}`);
      assert.equal(error.message, 'pg_lease: invalid input');
      assert.equal(error.detail, detail);
    }
  });

  test('a grant that lapsed a moment before the fence is refused', async () => {
    const key = uniqueKey('fence-just-lapsed');
    const client = await db.pool.connect();
    try {
      // One statement: the grant and the fence read the clock microseconds apart.
      const error = await pgError(
        client.query(
          `SELECT lease.fence($1, a.epoch)
             FROM lease.acquire($1, 'worker-a', interval '1 microsecond') AS a`,
          [key],
        ),
      );
      assertStale(error, key, 1n, 'the key lapsed (epoch 1)');
    } finally {
      client.release();
    }
  });

  test('a fence that waited past the expiry for another transaction decides with the clock after the wait', async () => {
    await using iso = await Isolation.open(db.url, ['fencer', 'holder']);
    const { fencer, holder } = iso.named;
    const key = uniqueKey('fence-clock-after-lock');
    const granted = await acquire(db.pool, key, 'worker-a', '2 seconds');
    await holder.query('BEGIN');
    assert.equal((await holder.run(releaseCall(key, 'worker-a', granted.epoch))).status, 'ok');
    await fencer.query('BEGIN');
    const fenced = fencer.start(fenceCall(key, granted.epoch));
    await iso.untilBlocked(fenced, holder);
    await sleepPast(db.pool, granted.expiresAt);
    await holder.query('ROLLBACK'); // the grant stands again, but it has lapsed meanwhile
    assertStale(await fenced.error(), key, granted.epoch!, `the key lapsed (epoch ${granted.epoch})`);
    await fencer.query('ROLLBACK');
  });
});

describe('fence races', { concurrency: true }, () => {
  test('a takeover at expiry waits for the open fenced transaction, whose write commits first', async () => {
    await using iso = await Isolation.open(db.url, ['old', 'taker']);
    const { old, taker } = iso.named;
    const key = uniqueKey('fence-vs-takeover');
    const granted = await acquire(db.pool, key, 'worker-old', '2 seconds');
    await old.query('BEGIN');
    await old.run(fenceCall(key, granted.epoch));
    await sleepPast(db.pool, granted.expiresAt);

    const takeover = taker.start(acquireCall(key, 'worker-new', '1 minute'));
    await iso.untilBlocked(takeover, old);
    await write(old.client, key, granted.epoch!);
    await old.query('COMMIT');
    const taken = await takeover.result();
    assert.equal(taken.acquired, true);
    assert.equal(taken.epoch, granted.epoch! + 1n);
    assert.deepEqual(await writes(key), [granted.epoch]);
    assertStale(
      await pgError(fence(db.pool, key, granted.epoch)),
      key,
      granted.epoch!,
      `the key is held under epoch ${taken.epoch}`,
    );
    await fence(db.pool, key, taken.epoch);
  });

  test('a fence after a takeover, committed or not, is refused without waiting for it', async () => {
    await using iso = await Isolation.open(db.url, ['old', 'taker']);
    const { old, taker } = iso.named;
    const key = uniqueKey('fence-after-takeover');
    const granted = await acquire(db.pool, key, 'worker-old', '200 milliseconds');
    await sleepPast(db.pool, granted.expiresAt);

    await taker.query('BEGIN');
    assert.equal((await taker.run(acquireCall(key, 'worker-new', '1 minute'))).acquired, true);
    await old.query('BEGIN');
    // query() fails with StepBlockedError if the fence waits for the uncommitted takeover.
    const uncommitted = await old.query(fenceCall(key, granted.epoch).text, fenceCall(key, granted.epoch).values).catch((error: unknown) => error);
    assert.ok(!(uncommitted instanceof StepBlockedError), 'the fence waited for the takeover');
    assertStale(uncommitted, key, granted.epoch!, `the key lapsed (epoch ${granted.epoch})`);
    await old.query('ROLLBACK');
    await taker.query('COMMIT');
    assertStale(
      await pgError(fence(old.client, key, granted.epoch)),
      key,
      granted.epoch!,
      `the key is held under epoch ${granted.epoch! + 1n}`,
    );
  });

  test('a fence after a takeover that rolled back is still refused: the grant stays lapsed', async () => {
    await using iso = await Isolation.open(db.url, ['old', 'taker']);
    const { old, taker } = iso.named;
    const key = uniqueKey('fence-after-takeover-rollback');
    const granted = await acquire(db.pool, key, 'worker-old', '200 milliseconds');
    await sleepPast(db.pool, granted.expiresAt);
    await taker.query('BEGIN');
    assert.equal((await taker.run(acquireCall(key, 'worker-new', '1 minute'))).epoch, granted.epoch! + 1n);
    await taker.query('ROLLBACK');
    await old.query('BEGIN');
    const refused = await old
      .query(fenceCall(key, granted.epoch).text, fenceCall(key, granted.epoch).values)
      .catch((error: unknown) => error);
    assert.ok(!(refused instanceof StepBlockedError), 'the fence waited');
    assertStale(refused, key, granted.epoch!, `the key lapsed (epoch ${granted.epoch})`);
    await old.query('ROLLBACK');
    assert.deepEqual(await inspect(db.pool, key), {
      held: false,
      owner: null,
      epoch: granted.epoch,
      expiresAt: null,
    });
  });

  test("the holder's release waits for an open fenced transaction, then frees the key", async () => {
    await using iso = await Isolation.open(db.url, ['fencer', 'holder']);
    const { fencer, holder } = iso.named;
    const key = uniqueKey('fence-vs-release');
    const granted = await acquire(db.pool, key, 'worker-a', '1 minute');
    await fencer.query('BEGIN');
    await fencer.run(fenceCall(key, granted.epoch));
    const released = holder.start(releaseCall(key, 'worker-a', granted.epoch));
    await iso.untilBlocked(released, fencer);
    await write(fencer.client, key, granted.epoch!);
    await fencer.query('COMMIT');
    assert.deepEqual(await released.result(), { status: 'ok' });
    assert.deepEqual(await writes(key), [granted.epoch]);
    assertStale(
      await pgError(fence(db.pool, key, granted.epoch)),
      key,
      granted.epoch!,
      `the key is free with watermark ${granted.epoch! + 1n}`,
    );
  });

  test("the holder's release waits for a fenced transaction that rolls back: nothing written, the key is freed", async () => {
    await using iso = await Isolation.open(db.url, ['fencer', 'holder']);
    const { fencer, holder } = iso.named;
    const key = uniqueKey('fence-rollback-vs-release');
    const granted = await acquire(db.pool, key, 'worker-a', '1 minute');
    await fencer.query('BEGIN');
    await fencer.run(fenceCall(key, granted.epoch));
    await write(fencer.client, key, granted.epoch!);
    const released = holder.start(releaseCall(key, 'worker-a', granted.epoch));
    await iso.untilBlocked(released, fencer);
    await fencer.query('ROLLBACK');
    assert.deepEqual(await released.result(), { status: 'ok' });
    assert.deepEqual(await writes(key), []);
    assert.deepEqual(await inspect(db.pool, key), {
      held: false,
      owner: null,
      epoch: granted.epoch! + 1n,
      expiresAt: null,
    });
  });

  test('a fence waits for a release in progress; refused once it commits, it holds no lock', async () => {
    await using iso = await Isolation.open(db.url, ['fencer', 'holder', 'next']);
    const { fencer, holder, next } = iso.named;
    const key = uniqueKey('release-vs-fence');
    const granted = await acquire(db.pool, key, 'worker-a', '1 minute');
    await holder.query('BEGIN');
    assert.equal((await holder.run(releaseCall(key, 'worker-a', granted.epoch))).status, 'ok');
    await fencer.query('BEGIN');
    const fenced = fencer.start(fenceCall(key, granted.epoch));
    await iso.untilBlocked(fenced, holder);
    await holder.query('COMMIT');
    assertStale(await fenced.error(), key, granted.epoch!, `the key is free with watermark ${granted.epoch! + 1n}`);
    // The fencer's transaction is still open (aborted): a lock kept from the wait would block this.
    const taken = await next.run(acquireCall(key, 'worker-c', '1 minute'));
    assert.equal(taken.epoch, granted.epoch! + 2n);
    assert.equal((await next.run(renewCall(key, 'worker-c', taken.epoch, '2 minutes'))).status, 'ok');
    await fencer.query('ROLLBACK');
  });

  test('a fence waits for a release in progress that rolls back, then passes and holds the row', async () => {
    await using iso = await Isolation.open(db.url, ['fencer', 'holder']);
    const { fencer, holder } = iso.named;
    const key = uniqueKey('release-rollback-vs-fence');
    const granted = await acquire(db.pool, key, 'worker-a', '1 minute');
    await holder.query('BEGIN');
    assert.equal((await holder.run(releaseCall(key, 'worker-a', granted.epoch))).status, 'ok');
    await fencer.query('BEGIN');
    const fenced = fencer.start(fenceCall(key, granted.epoch));
    await iso.untilBlocked(fenced, holder);
    await holder.query('ROLLBACK');
    await fenced.result();
    const second = holder.start(releaseCall(key, 'worker-a', granted.epoch));
    await iso.untilBlocked(second, fencer);
    await fencer.query('COMMIT');
    assert.deepEqual(await second.result(), { status: 'ok' });
  });

  for (const end of ['COMMIT', 'ROLLBACK'] as const) {
    test(`the holder's renew waits for an open fenced transaction until its ${end}, then succeeds`, async () => {
      await using iso = await Isolation.open(db.url, ['fencer', 'holder']);
      const { fencer, holder } = iso.named;
      const key = uniqueKey(`fence-vs-renew-${end}`);
      const granted = await acquire(db.pool, key, 'worker-a', '1 minute');
      await fencer.query('BEGIN');
      await fencer.run(fenceCall(key, granted.epoch));
      const renewed = holder.start(renewCall(key, 'worker-a', granted.epoch, '2 minutes'));
      await iso.untilBlocked(renewed, fencer);
      await fencer.query(end);
      const result = await renewed.result();
      assert.equal(result.status, 'ok');
      assert.ok(result.expiresAt! > granted.expiresAt!);
      assert.equal((await inspect(db.pool, key))?.epoch, granted.epoch);
    });

    test(`a fence waits for a renew in progress and passes after its ${end}`, async () => {
      await using iso = await Isolation.open(db.url, ['fencer', 'holder']);
      const { fencer, holder } = iso.named;
      const key = uniqueKey(`renew-vs-fence-${end}`);
      const granted = await acquire(db.pool, key, 'worker-a', '1 minute');
      await holder.query('BEGIN');
      assert.equal((await holder.run(renewCall(key, 'worker-a', granted.epoch, '2 minutes'))).status, 'ok');
      await fencer.query('BEGIN');
      const fenced = fencer.start(fenceCall(key, granted.epoch));
      await iso.untilBlocked(fenced, holder);
      await holder.query(end);
      await fenced.result();
      // It holds the row now (taken in a subtransaction, so xmax is not the top-level xid).
      const released = holder.start(releaseCall(key, 'worker-a', granted.epoch));
      await iso.untilBlocked(released, fencer);
      await fencer.query('COMMIT');
      assert.deepEqual(await released.result(), { status: 'ok' });
    });
  }

  test('a stale writer is refused at once while the holder is fenced, and holds no lock afterwards', async () => {
    await using iso = await Isolation.open(db.url, ['stale', 'holder']);
    const { stale, holder } = iso.named;
    const key = uniqueKey('two-writers');
    await regranted(key);
    await holder.query('BEGIN');
    await holder.run(fenceCall(key, 3n));
    await stale.query('BEGIN');
    const refused = await stale
      .query(fenceCall(key, 1n).text, fenceCall(key, 1n).values)
      .catch((error: unknown) => error);
    assert.ok(!(refused instanceof StepBlockedError), 'the stale fence waited');
    assertStale(refused, key, 1n, 'the key is held under epoch 3');
    await write(holder.client, key, 3n);
    await holder.query('COMMIT');
    // stale's transaction stays open and aborted: the holder's renew must not wait for it.
    assert.equal((await holder.run(renewCall(key, 'worker-b', 3n, '2 minutes'))).status, 'ok');
    await holder.query('BEGIN');
    await holder.run(fenceCall(key, 3n));
    await holder.query('COMMIT');
    await stale.query('ROLLBACK');
    assert.deepEqual(await writes(key), [3n]);
  });

  test('fenced writers under the live epoch do not wait for each other', async () => {
    const names = ['w0', 'w1', 'w2', 'w3'];
    await using iso = await Isolation.open(db.url, names);
    const key = uniqueKey('same-epoch-writers');
    const granted = await acquire(db.pool, key, 'worker-a', '1 minute');
    for (const session of iso.sessions) {
      await session.query('BEGIN');
      await session.run(fenceCall(key, granted.epoch));
      await write(session.client, key, granted.epoch!);
    }
    for (const session of iso.sessions) await session.query('COMMIT');
    assert.equal((await writes(key)).length, names.length);
  });

  for (const level of ['REPEATABLE READ', 'SERIALIZABLE'] as const) {
    test(`under ${level} a grant that ended after the snapshot is never accepted`, async () => {
      await using iso = await Isolation.open(db.url, ['reader', 'other']);
      const { reader, other } = iso.named;
      const scenarios: { name: string; change(key: string): Promise<void>; codes: string[] }[] = [
        {
          name: 'released and granted again',
          change: async (key) => {
            assert.equal((await other.run(releaseCall(key, 'worker-a', 1n))).status, 'ok');
            assert.equal((await other.run(acquireCall(key, 'worker-b', '1 minute'))).epoch, 3n);
          },
          codes: ['40001'],
        },
        {
          name: 'released',
          change: async (key) => {
            assert.equal((await other.run(releaseCall(key, 'worker-a', 1n))).status, 'ok');
          },
          codes: ['40001'],
        },
        {
          name: 'renewed (a serialization failure, which is allowed)',
          change: async (key) => {
            assert.equal((await other.run(renewCall(key, 'worker-a', 1n, '2 minutes'))).status, 'ok');
          },
          codes: ['40001'],
        },
      ];
      for (const scenario of scenarios) {
        const key = uniqueKey(`fence-${level}`);
        await acquire(db.pool, key, 'worker-a', '1 minute');
        await reader.query(`BEGIN ISOLATION LEVEL ${level}`);
        await reader.query('SELECT count(*) FROM lease.inspect($1)', [key]); // takes the snapshot
        await scenario.change(key);
        const error = await pgError(reader.run(fenceCall(key, 1n)));
        assert.ok(scenario.codes.includes(error.code!), `${scenario.name}: ${error.code} ${error.message}`);
        await reader.query('ROLLBACK');
      }

      // The new grant came after the snapshot: refused from the snapshot.
      const key = uniqueKey(`fence-${level}-new`);
      await regranted(key);
      await reader.query(`BEGIN ISOLATION LEVEL ${level}`);
      await reader.query('SELECT 1');
      assert.equal((await other.run(releaseCall(key, 'worker-b', 3n))).status, 'ok');
      assert.equal((await other.run(acquireCall(key, 'worker-c', '1 minute'))).epoch, 5n);
      const error = await pgError(reader.run(fenceCall(key, 5n)));
      assert.equal(error.code, 'PLF01');
      await reader.query('ROLLBACK');

      // Nothing changed since the snapshot: the fence passes and holds the row.
      const quiet = uniqueKey(`fence-${level}-quiet`);
      await acquire(db.pool, quiet, 'worker-a', '1 minute');
      await reader.query(`BEGIN ISOLATION LEVEL ${level}`);
      await reader.query('SELECT count(*) FROM lease.inspect($1)', [quiet]);
      await reader.run(fenceCall(quiet, 1n));
      const released = other.start(releaseCall(quiet, 'worker-a', 1n));
      await iso.untilBlocked(released, reader);
      await reader.query('COMMIT');
      assert.deepEqual(await released.result(), { status: 'ok' });
    });
  }

  test('under REPEATABLE READ a fence that waited for a release in progress fails with 40001 once it commits', async () => {
    await using iso = await Isolation.open(db.url, ['reader', 'holder']);
    const { reader, holder } = iso.named;
    const key = uniqueKey('fence-rr-release-in-progress');
    const granted = await acquire(db.pool, key, 'worker-a', '1 minute');
    await reader.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
    await reader.query('SELECT count(*) FROM lease.inspect($1)', [key]); // takes the snapshot
    await holder.query('BEGIN');
    assert.equal((await holder.run(releaseCall(key, 'worker-a', granted.epoch))).status, 'ok');
    const fenced = reader.start(fenceCall(key, granted.epoch));
    await iso.untilBlocked(fenced, holder);
    await holder.query('COMMIT');
    const error = await fenced.error();
    assert.equal(error.code, '40001', error.message);
    await reader.query('ROLLBACK');
    assert.deepEqual(await inspect(db.pool, key), {
      held: false,
      owner: null,
      epoch: granted.epoch! + 1n,
      expiresAt: null,
    });
  });

  test('a fenced transaction that rolls back leaves nothing and lets the waiting takeover through', async () => {
    await using iso = await Isolation.open(db.url, ['fencer', 'taker']);
    const { fencer, taker } = iso.named;
    const key = uniqueKey('fence-rollback');
    const granted = await acquire(db.pool, key, 'worker-a', '2 seconds');
    await fencer.query('BEGIN');
    await fencer.run(fenceCall(key, granted.epoch));
    await write(fencer.client, key, granted.epoch!);
    await sleepPast(db.pool, granted.expiresAt);
    const takeover = taker.start(acquireCall(key, 'worker-b', '1 minute'));
    await iso.untilBlocked(takeover, fencer);
    await fencer.query('ROLLBACK');
    assert.equal((await takeover.result()).epoch, granted.epoch! + 1n);
    assert.deepEqual(await writes(key), []);
  });

  test('rolling back to a savepoint taken before the fence releases its lock', async () => {
    await using iso = await Isolation.open(db.url, ['fencer', 'holder']);
    const { fencer, holder } = iso.named;
    const key = uniqueKey('fence-savepoint');
    const granted = await acquire(db.pool, key, 'worker-a', '1 minute');
    await fencer.query('BEGIN');
    await fencer.query('SAVEPOINT before_fence');
    await fencer.run(fenceCall(key, granted.epoch));
    const renewed = holder.start(renewCall(key, 'worker-a', granted.epoch, '2 minutes'));
    await iso.untilBlocked(renewed, fencer);
    await fencer.query('ROLLBACK TO SAVEPOINT before_fence');
    assert.equal((await renewed.result()).status, 'ok');
    // The fencer's transaction is still open, and no longer fenced.
    assert.deepEqual(await holder.run(releaseCall(key, 'worker-a', granted.epoch)), { status: 'ok' });
    await fencer.query('COMMIT');
  });
});

describe('fence_row trigger', { concurrency: true }, () => {
  let owner: TestRole;
  let writer: TestRole;
  let ownerClient: pg.Client;
  before(async () => {
    owner = await createRole(db, 'CREATE SCHEMA fence_app AUTHORIZATION %I');
    writer = await createRole(db);
    ownerClient = await owner.connect();
    await createFencedTable(ownerClient, 'fence_app.jobs');
    await ownerClient.query(`GRANT USAGE ON SCHEMA fence_app TO ${writer.name}`);
    await ownerClient.query(`GRANT SELECT, INSERT, UPDATE, DELETE ON fence_app.jobs TO ${writer.name}`);
  });
  after(async () => {
    await writer.drop();
    await owner.drop();
  });

  test('the table owner is no superuser and cannot read the lease table', async () => {
    const { rows } = await ownerClient.query('SELECT rolsuper FROM pg_roles WHERE rolname = current_user');
    assert.deepEqual(rows, [{ rolsuper: false }]);
    assert.equal((await pgError(ownerClient.query('SELECT * FROM lease.leases'))).code, '42501');
  });

  test('every inserted or updated row is fenced by its own key and epoch, for any writing role', async () => {
    const key = uniqueKey('fence-row');
    await regranted(key);
    const writerClient = await writer.connect();
    for (const client of [ownerClient, writerClient]) {
      const id = client === ownerClient ? 1 : 2;
      await client.query('INSERT INTO fence_app.jobs VALUES ($1, $2, 3, $3)', [id, key, 'ok']);
      assertStale(
        await pgError(client.query('INSERT INTO fence_app.jobs VALUES ($1, $2, 1, $3)', [id + 10, key, 'stale'])),
        key,
        1n,
        'the key is held under epoch 3',
      );
      assertStale(
        await pgError(client.query('UPDATE fence_app.jobs SET lease_epoch = 2 WHERE id = $1', [id])),
        key,
        2n,
        'the key is held under epoch 3',
      );
      await client.query("UPDATE fence_app.jobs SET note = 'updated' WHERE id = $1", [id]);
    }
    const { rows } = await ownerClient.query(
      'SELECT id, lease_epoch::text AS epoch, note FROM fence_app.jobs WHERE lease_key = $1 ORDER BY id',
      [key],
    );
    assert.deepEqual(rows, [
      { id: 1, epoch: '3', note: 'updated' },
      { id: 2, epoch: '3', note: 'updated' },
    ]);
  });

  test('once the grant lapses, the rows written under it cannot be updated under it', async () => {
    const key = uniqueKey('fence-row-lapse');
    const granted = await acquire(db.pool, key, 'worker-a', '500 milliseconds');
    await ownerClient.query('INSERT INTO fence_app.jobs VALUES (100, $1, $2, $3)', [key, String(granted.epoch), 'first']);
    await sleepPast(db.pool, granted.expiresAt);
    assertStale(
      await pgError(ownerClient.query("UPDATE fence_app.jobs SET note = 'late' WHERE id = 100")),
      key,
      granted.epoch!,
      `the key lapsed (epoch ${granted.epoch})`,
    );
    const taken = await acquire(db.pool, key, 'worker-b', '1 minute');
    await ownerClient.query('UPDATE fence_app.jobs SET lease_epoch = $1, note = $2 WHERE id = 100', [String(taken.epoch), 'redone']);
  });

  test('a statement writing several rows fences each; one stale row fails it whole', async () => {
    const live = uniqueKey('fence-row-multi');
    const dead = uniqueKey('fence-row-multi-dead');
    const granted = await acquire(db.pool, live, 'worker-a', '1 minute');
    const error = await pgError(
      ownerClient.query(
        `INSERT INTO fence_app.jobs VALUES (200, $1, $2, 'a'), (201, $1, $2, 'b'), (202, $3, 1, 'c')`,
        [live, String(granted.epoch), dead],
      ),
    );
    assertStale(error, dead, 1n, 'the key was never granted');
    await ownerClient.query(
      `INSERT INTO fence_app.jobs VALUES (200, $1, $2, 'a'), (201, $1, $2, 'b')`,
      [live, String(granted.epoch)],
    );
    const { rows } = await ownerClient.query('SELECT count(*)::int AS n FROM fence_app.jobs WHERE lease_key = $1', [live]);
    assert.deepEqual(rows, [{ n: 2 }]);
  });

  test('a row with a NULL key or epoch is rejected as invalid input', async () => {
    const key = uniqueKey('fence-row-null');
    await acquire(db.pool, key, 'worker-a', '1 minute');
    for (const [values, detail] of [
      [[300, null, 1], 'key must be a non-empty string'],
      [[301, key, null], 'epoch must not be null'],
      [[302, '', null], 'key must be a non-empty string; epoch must not be null'],
    ] as const) {
      const error = await pgError(ownerClient.query('INSERT INTO fence_app.jobs VALUES ($1, $2, $3)', [...values]));
      assert.equal(error.code, '22023');
      assert.equal(error.detail, detail);
    }
  });

  test('a fence_row trigger holds the key like lease.fence until the writing transaction ends', async () => {
    await using iso = await Isolation.open(db.url, ['holder']);
    const { holder } = iso.named;
    const key = uniqueKey('fence-row-lock');
    const granted = await acquire(db.pool, key, 'worker-a', '1 minute');
    const writerClient = await writer.connect();
    await writerClient.query('BEGIN');
    await writerClient.query('INSERT INTO fence_app.jobs VALUES (400, $1, $2)', [key, String(granted.epoch)]);
    const renewed = holder.start(renewCall(key, 'worker-a', granted.epoch, '2 minutes'));
    await iso.blockedOrSettled(renewed);
    assert.equal(renewed.settled, false, 'the renew went through while the fenced insert was open');
    await writerClient.query('COMMIT');
    assert.equal((await renewed.result()).status, 'ok');
  });

  test('two writers through fence_row: the stale one is refused at once and holds no lock; writers under the live epoch never wait', async () => {
    await using iso = await Isolation.open(db.url, ['stale', 'holder', 'peer']);
    const { stale, holder, peer } = iso.named;
    const key = uniqueKey('fence-row-writers');
    await regranted(key); // epoch 1 is stale, 3 is live
    const insert = 'INSERT INTO fence_app.jobs (id, lease_key, lease_epoch) VALUES ($1, $2, $3)';
    // The holder's fenced transaction is open: the stale write is refused without waiting.
    await holder.query('BEGIN');
    await holder.query(insert, [500, key, 3]);
    await stale.query('BEGIN');
    const refused = await stale.query(insert, [501, key, 1]).catch((error: unknown) => error);
    assert.ok(!(refused instanceof StepBlockedError), 'the stale write waited');
    assertStale(refused, key, 1n, 'the key is held under epoch 3');
    await holder.query('UPDATE fence_app.jobs SET lease_epoch = 3 WHERE id = 500');
    await holder.query('COMMIT');
    // The refused transaction stays open: the holder's renew and next fenced write go through.
    assert.equal((await holder.run(renewCall(key, 'worker-b', 3n, '2 minutes'))).status, 'ok');
    await holder.query('BEGIN');
    await holder.query(insert, [502, key, 3]);
    // A second writer under the live epoch does not wait for the first.
    await peer.query('BEGIN');
    await peer.query(insert, [503, key, 3]);
    await peer.query('COMMIT');
    await holder.query('COMMIT');
    await stale.query('ROLLBACK');
    const { rows } = await db.pool.query(
      'SELECT id, lease_epoch::int AS epoch FROM fence_app.jobs WHERE lease_key = $1 ORDER BY id',
      [key],
    );
    assert.deepEqual(rows, [
      { id: 500, epoch: 3 },
      { id: 502, epoch: 3 },
      { id: 503, epoch: 3 },
    ]);
  });

  test('DELETE, statement-level use and bad arguments give clear errors', async () => {
    await ownerClient.query(
      'CREATE TABLE fence_app.odd (id int, k text, e bigint, n int, v varchar, u uuid)',
    );
    const cases: { args: string; on?: string; level?: string; write: string; code: string; message: RegExp }[] = [
      { args: "'k', 'e'", on: 'DELETE', write: 'DELETE FROM fence_app.odd', code: '39P01', message: /inserted and updated rows only/ },
      { args: "'k', 'e'", level: 'STATEMENT', write: 'INSERT INTO fence_app.odd (id) VALUES (1)', code: '39P01', message: /inserted and updated rows only/ },
      { args: "'k'", write: 'INSERT INTO fence_app.odd (id) VALUES (1)', code: '39P01', message: /needs two arguments/ },
      { args: "'k', 'e', 'n'", write: 'INSERT INTO fence_app.odd (id) VALUES (1)', code: '39P01', message: /needs two arguments/ },
      { args: "'missing', 'e'", write: 'INSERT INTO fence_app.odd (id) VALUES (1)', code: '42703', message: /column "missing" of relation fence_app\.odd does not exist/ },
      { args: "'k', 'Missing'", write: 'INSERT INTO fence_app.odd (id) VALUES (1)', code: '42703', message: /column "Missing"/ },
      { args: "'k', 'n'", write: 'INSERT INTO fence_app.odd (id) VALUES (1)', code: '42804', message: /epoch column bigint/ },
      { args: "'u', 'e'", write: 'INSERT INTO fence_app.odd (id) VALUES (1)', code: '42804', message: /key column must be text or varchar/ },
    ];
    for (const c of cases) {
      await ownerClient.query('INSERT INTO fence_app.odd (id) VALUES (0)'); // something to delete
      await ownerClient.query(
        `CREATE TRIGGER t BEFORE ${c.on ?? 'INSERT OR UPDATE'} ON fence_app.odd
           FOR EACH ${c.level ?? 'ROW'} EXECUTE FUNCTION lease.fence_row(${c.args})`,
      );
      const error = await pgError(ownerClient.query(c.write));
      assert.equal(error.code, c.code, `${c.args} ${c.on ?? ''} ${c.level ?? ''}: ${error.message}`);
      assert.match(error.message, c.message);
      await ownerClient.query('DROP TRIGGER t ON fence_app.odd');
    }
    // A varchar key column works.
    const key = uniqueKey('fence-row-varchar');
    await acquire(db.pool, key, 'worker-a', '1 minute');
    await ownerClient.query(
      `CREATE TRIGGER t BEFORE INSERT ON fence_app.odd FOR EACH ROW EXECUTE FUNCTION lease.fence_row('v', 'e')`,
    );
    await ownerClient.query('INSERT INTO fence_app.odd (id, v, e) VALUES (1, $1, 1)', [key]);
    assert.equal((await pgError(ownerClient.query('INSERT INTO fence_app.odd (id, v, e) VALUES (2, $1, 2)', [key]))).code, 'PLF01');
  });
});
