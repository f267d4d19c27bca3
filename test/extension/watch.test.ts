/**
 * lease.watch and the release notification (SEMANTICS.md §4 watch, §10 Waiting): a release
 * notifies channel pg_lease only while a waiter's mark on the key lasts, marks are written
 * only for held keys and at most once per half mark; a mark lasts at most five minutes and
 * ends with the grant it was made against; with owners bound to roles only a role that may act
 * for the holder marks.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { uniqueKey } from '../support/helpers.js';
import { acquire, pgError, release } from '../support/lease-calls.js';
import { createRole, type TestRole } from '../support/roles.js';

let db: TestDatabase;
let listener: pg.Client;
const notified: string[] = [];

before(async () => {
  db = await createTestDatabase();
  listener = new pg.Client({ connectionString: db.url });
  await listener.connect();
  listener.on('notification', (message) => notified.push(message.payload ?? ''));
  await listener.query('LISTEN pg_lease');
});
after(async () => {
  await listener.end();
  await db.close();
});

async function watchedUntil(key: string): Promise<Date | null | undefined> {
  const { rows } = await db.pool.query<{ w: Date | null }>(
    'SELECT watched_until AS w FROM lease.leases WHERE key = $1',
    [key],
  );
  return rows[0]?.w;
}

/** Whether a notification for `key` arrives within a generous moment. */
async function notifiedOf(key: string): Promise<boolean> {
  for (let i = 0; i < 40; i++) {
    if (notified.includes(key)) return true;
    await sleep(25);
  }
  return false;
}

describe('lease.watch', { concurrency: false }, () => {
  test('a release of a key nobody watches sends no notification', async () => {
    const key = uniqueKey('unwatched');
    const grant = await acquire(db.pool, key, 'holder', '1 min');
    assert.equal((await release(db.pool, key, 'holder', grant.epoch)).status, 'ok');
    assert.equal(await notifiedOf(key), false);
  });

  test('a release of a watched key notifies pg_lease with the key, once it commits', async () => {
    const key = uniqueKey('watched');
    const grant = await acquire(db.pool, key, 'holder', '1 min');
    const { rows } = await db.pool.query('SELECT * FROM lease.watch($1, $2)', [key, '30 seconds']);
    assert.deepEqual([rows[0].held, rows[0].owner], [true, 'holder']);
    assert.ok((await watchedUntil(key))! > new Date());

    // Rolled back: nothing is sent.
    const session = await db.pool.connect();
    try {
      await session.query('BEGIN');
      await release(session, key, 'holder', grant.epoch);
      await session.query('ROLLBACK');
    } finally {
      session.release();
    }
    assert.equal(await notifiedOf(key), false);

    assert.equal((await release(db.pool, key, 'holder', grant.epoch)).status, 'ok');
    assert.equal(await notifiedOf(key), true);
  });

  test('release_many notifies each watched key it releases, and only those', async () => {
    const watched = uniqueKey('batch-watched');
    const unwatched = uniqueKey('batch-unwatched');
    const a = await acquire(db.pool, watched, 'holder', '1 min');
    const b = await acquire(db.pool, unwatched, 'holder', '1 min');
    await db.pool.query('SELECT * FROM lease.watch($1, $2)', [watched, '30 seconds']);
    const { rows } = await db.pool.query<{ key: string; status: string }>(
      'SELECT key, status FROM lease.release_many($1::text[], $2, $3::bigint[])',
      [[watched, unwatched], 'holder', [String(a.epoch), String(b.epoch)]],
    );
    assert.deepEqual(
      rows.map((row) => row.status),
      ['ok', 'ok'],
    );
    assert.equal(await notifiedOf(watched), true);
    assert.equal(notified.includes(unwatched), false);
  });

  test('watch never waits for a row lock: under a fenced transaction it marks nothing and says so', async () => {
    const key = uniqueKey('watch-fenced');
    const grant = await acquire(db.pool, key, 'holder', '1 min');
    const fenced = await db.pool.connect();
    try {
      await fenced.query('BEGIN');
      await fenced.query('SELECT lease.fence($1, $2)', [key, String(grant.epoch)]);
      const { rows } = await db.pool.query('SELECT * FROM lease.watch($1, $2)', [key, '30 seconds']);
      assert.deepEqual([rows[0].held, rows[0].notifies], [true, false]);
      assert.equal(await watchedUntil(key), null);
      await fenced.query('COMMIT');
      const again = await db.pool.query('SELECT * FROM lease.watch($1, $2)', [key, '30 seconds']);
      assert.deepEqual([again.rows[0].held, again.rows[0].notifies], [true, true]);
      assert.ok((await watchedUntil(key))! > new Date());
    } finally {
      await fenced.query('ROLLBACK').catch(() => undefined);
      fenced.release();
    }
    await release(db.pool, key, 'holder', grant.epoch);
  });

  test('a mark runs out: releases after it notify nobody', async () => {
    const key = uniqueKey('expired-mark');
    const grant = await acquire(db.pool, key, 'holder', '1 min');
    await db.pool.query('SELECT * FROM lease.watch($1, $2)', [key, '200 milliseconds']);
    await sleep(400);
    assert.equal((await release(db.pool, key, 'holder', grant.epoch)).status, 'ok');
    assert.equal(await notifiedOf(key), false);
  });

  test('a key that is not held is not marked, and watch says so', async () => {
    const key = uniqueKey('free');
    const grant = await acquire(db.pool, key, 'holder', '1 min');
    await release(db.pool, key, 'holder', grant.epoch);
    const { rows } = await db.pool.query('SELECT * FROM lease.watch($1, $2)', [key, '30 seconds']);
    assert.deepEqual(rows, [
      { held: false, owner: null, epoch: String(grant.epoch! + 1n), expires_at: null, notifies: false },
    ]);
    assert.equal(await watchedUntil(key), null);
    const never = await db.pool.query('SELECT * FROM lease.watch($1, $2)', [uniqueKey('never'), '1s']);
    assert.equal(never.rowCount, 0);
  });

  test('many waiters share a mark: it is written again only when half of it has passed', async () => {
    const key = uniqueKey('shared-mark');
    await acquire(db.pool, key, 'holder', '1 min');
    await db.pool.query('SELECT * FROM lease.watch($1, $2)', [key, '1 minute']);
    const first = await watchedUntil(key);
    for (let i = 0; i < 5; i++)
      await db.pool.query('SELECT * FROM lease.watch($1, $2)', [key, '1 minute']);
    assert.deepEqual(await watchedUntil(key), first);
  });

  test('watch rejects invalid input with 22023 and changes nothing', async () => {
    const error = await pgError(db.pool.query("SELECT * FROM lease.watch('', '-1 s')"));
    assert.equal(error.code, '22023');
    assert.match(error.detail ?? '', /key must be a non-empty string; wait must be a non-negative/);
  });

  test('with owners bound to roles, only a role that may act for the holder marks; others poll', async () => {
    const roles: TestRole[] = [];
    const strangerKey = uniqueKey('bound-stranger');
    try {
      const holder = await createRole(db);
      const stranger = await createRole(db);
      roles.push(holder, stranger);
      const ownKey = uniqueKey('bound-own');
      await acquire(db.pool, strangerKey, `${holder.name}/a`, '1 min');
      await acquire(db.pool, ownKey, `${holder.name}/b`, '1 min');
      await db.pool.query('SELECT lease.bind_owners(true)');

      // A role that may not act for the holder learns what inspect says and writes nothing:
      // a mark would hold the holder's row lock for as long as its transaction stays open.
      const asStranger = await stranger.connect();
      await asStranger.query('BEGIN');
      const seen = await asStranger.query('SELECT * FROM lease.watch($1, $2)', [strangerKey, '30 seconds']);
      assert.equal(seen.rows[0].held, true);
      assert.equal(seen.rows[0].notifies, false);
      // The holder renews at once although the stranger's transaction is still open.
      const renewed = await db.pool.query(
        `SELECT status FROM lease.renew($1, $2, 1, '1 min')`,
        [strangerKey, `${holder.name}/a`],
      );
      assert.equal(renewed.rows[0].status, 'ok');
      await asStranger.query('COMMIT');
      assert.equal(await watchedUntil(strangerKey), null);

      // The holder's own role marks its key.
      const asHolder = await holder.connect();
      const own = await asHolder.query('SELECT * FROM lease.watch($1, $2)', [ownKey, '30 seconds']);
      assert.equal(own.rows[0].notifies, true);
      assert.ok((await watchedUntil(ownKey))! > new Date());
    } finally {
      await db.pool.query('SELECT lease.bind_owners(false)');
      for (const role of roles) await role.drop();
    }
  });

  test('a mark lasts at most five minutes, whatever wait asks for', async () => {
    const key = uniqueKey('watch-cap');
    await acquire(db.pool, key, 'holder', '1 hour');
    const watched = await db.pool.query(`SELECT * FROM lease.watch($1, interval '1000 years')`, [key]);
    assert.equal(watched.rows[0].notifies, true);
    const { rows } = await db.pool.query<{ ok: boolean }>(
      `SELECT watched_until BETWEEN clock_timestamp() + interval '4 minutes'
                                AND clock_timestamp() + interval '5 minutes' AS ok
         FROM lease.leases WHERE key = $1`,
      [key],
    );
    assert.equal(rows[0]!.ok, true);
  });

  test('the next grant ends a mark: a later holder\'s release notifies nobody', async () => {
    const key = uniqueKey('watch-next-grant');
    const first = await acquire(db.pool, key, 'holder-a', '200 milliseconds');
    await db.pool.query(`SELECT * FROM lease.watch($1, '1 minute')`, [key]);
    assert.ok((await watchedUntil(key))! > new Date());
    await sleep(300);
    const second = await acquire(db.pool, key, 'holder-b', '1 min');
    assert.equal(second.acquired, true);
    assert.ok(second.epoch! > first.epoch!);
    assert.equal(await watchedUntil(key), null);
    notified.length = 0;
    await release(db.pool, key, 'holder-b', second.epoch!);
    assert.equal(await notifiedOf(key), false);
  });
});
