/**
 * An adversarial pass over 0.3.0's counted keys and shared grants (SEMANTICS.md §13): each
 * describe block is one attack that found a defect, with the test that showed it; the fix is in
 * extension/src/objects (or extension/src/upgrade) and the contract in specs/SEMANTICS.md.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { PgCluster } from 'pg-lease-testing';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { uniqueKey } from '../support/helpers.js';
import {
  acquire,
  acquireCall,
  acquireShared as shared,
  acquireSharedCall as sharedCall,
  holders,
  setLimitCall,
  inspect,
  renewCall,
  sleepPast,
  type Acquired,
  pgError,
  type Queryable,
} from '../support/lease-calls.js';
import { CURRENT_VERSION, FIXTURE_0_2_2 } from '../support/releases.js';
import { createRole } from '../support/roles.js';
import { Isolation } from '../support/sessions.js';

let db: TestDatabase;
before(async () => {
  db = await createTestDatabase();
});
after(() => db.close());

describe('1. set_limit counts a permit renewed in an open transaction, as a grant does', { concurrency: true }, () => {
  /*
   * The attack: set_limit counted the key's live permits with a plain read (its snapshot),
   * without waiting for a renewal in progress. A permit renewed just before it lapses, in a
   * transaction still open, read as lapsed: set_limit(key, NULL) went on, its DELETE of every
   * permit waited for the renewal and then deleted the renewed permit, and the key became FREE.
   * The renewal committed 'ok' with a new expiry, yet an exclusive grant of the key was made
   * beside it at once, and the permit was gone (renew: not_owner, fence: PLF01). The same for a
   * shared grant (an exclusive holder beside a live shared one), and set_limit(key, N) made a
   * key with a live shared grant counted.
   */
  const cases = [
    { what: 'a permit, set_limit(key, NULL)', mode: 'permit', limit: null, message: 'still has live permits' },
    { what: 'a shared grant, set_limit(key, NULL)', mode: 'shared', limit: null, message: 'still has live permits' },
    { what: 'a shared grant, set_limit(key, 2)', mode: 'shared', limit: 2, message: 'has live shared grants' },
  ] as const;
  for (const c of cases) {
    test(`${c.what}: waits for the renew; refused (55006) on commit, done on rollback`, async () => {
      for (const outcome of ['COMMIT', 'ROLLBACK'] as const) {
        await using iso = await Isolation.open(db.url, ['s1', 's2']);
        const { s1, s2 } = iso.named;
        const key = uniqueKey(`limit-renew-${c.mode}`);
        let a: Acquired;
        if (c.mode === 'permit') await db.pool.query('SELECT lease.set_limit($1, 1)', [key]);
        // In its transaction before the grant: the renewal must come before the lapse.
        await s1.query('BEGIN');
        if (c.mode === 'permit') a = await acquire(db.pool, key, 'a', '2 seconds');
        else a = await shared(db.pool, key, 'a', '2 seconds');
        assert.equal(a.acquired, true);
        assert.equal((await s1.run(renewCall(key, 'a', a.epoch, '1 minute'))).status, 'ok');
        await sleepPast(db.pool, a.expiresAt);
        const s2Limit = s2.start(setLimitCall(key, c.limit));
        await iso.untilBlocked(s2Limit, s1);
        await s1.query(outcome);
        if (outcome === 'COMMIT') {
          const error = await s2Limit.error();
          assert.equal(error.code, '55006');
          assert.equal(error.message, `pg_lease: key "${key}" ${c.message}`);
          assert.deepEqual(await holders(db.pool, key), [['a', a.epoch]]);
          assert.equal((await acquire(db.pool, key, 'x', '1 minute')).acquired, false);
        } else {
          assert.deepEqual(await s2Limit.result(), { permit_limit: c.limit, holders: 0 });
          assert.deepEqual(await holders(db.pool, key), []);
        }
      }
    });
  }
});

describe('1b. under REPEATABLE READ, set_limit never answers from a snapshot that predates a renewal', () => {
  /*
   * The same attack from a REPEATABLE READ transaction whose snapshot predates a renewal of the
   * key's only shared grant (committed just before the grant's old expiry): its snapshot shows
   * no live shared grant. set_limit(key, 2) then made the key counted beside the live, renewed
   * shared grant; now its count deletes what its snapshot shows lapsed, which fails with 40001
   * on the renewed row.
   */
  test('set_limit(key, 2) of a key whose shared grant was renewed after the snapshot fails with 40001', async () => {
    await using iso = await Isolation.open(db.url, ['s1']);
    const { s1 } = iso.named;
    const key = uniqueKey('limit-rr');
    const a = await shared(db.pool, key, 'a', '2 seconds');
    await s1.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
    await s1.query('SELECT count(*) FROM lease.holders($1)', [key]);
    await db.pool.query('SELECT * FROM lease.renew($1, $2, $3, $4)', [
      key,
      'a',
      String(a.epoch),
      '1 minute',
    ]);
    await sleepPast(db.pool, a.expiresAt);
    const error = await pgError(s1.query(setLimitCall(key, 2).text, setLimitCall(key, 2).values));
    assert.equal(error.code, '40001');
    await s1.query('ROLLBACK');
    assert.deepEqual(await holders(db.pool, key), [['a', a.epoch]]);
    assert.equal((await acquire(db.pool, key, 'x', '1 minute')).acquired, false);
  });
});

describe('2. a role without privileges cannot block the update from 0.2.2', () => {
  /*
   * The attack of attack-pass.test.ts §3, on the update to 0.3.0: its step from 0.2.2 drops
   * lease._acquire_wait(text, text, interval, interval) (the signature changes), without
   * CASCADE. A role with no privilege on it, only CREATE in a schema of its own, makes a
   * function whose SQL-standard body calls it (no EXECUTE is needed for that); DROP FUNCTION
   * then fails with 2BP01 and the whole update rolls back, keeping the database on 0.2.2.
   * SEMANTICS.md §12 promises that no role can make an update fail by pinning a private helper
   * it removes.
   */
  let cluster: PgCluster;
  before(async () => {
    cluster = await PgCluster.start({ extraExtensionFiles: [FIXTURE_0_2_2] });
  });
  after(async () => {
    await cluster?.destroy();
  });

  test('a function of another role calling lease._acquire_wait does not stop the update', async () => {
    const url = await cluster.createDatabase(undefined, { extension: false });
    const admin = new pg.Client({ connectionString: url });
    await admin.connect();
    const role = 'attack_update_030';
    const helper = `lease._acquire_wait('k', 'o', '1 minute'::interval, '1 second'::interval)`;
    try {
      await admin.query(`CREATE EXTENSION pg_lease VERSION '0.2.2'`);
      await admin.query(`CREATE ROLE ${role} LOGIN`);
      await admin.query(`CREATE SCHEMA ${role} AUTHORIZATION ${role}`);
      const parsed = new URL(url);
      parsed.username = role;
      const attacker = new pg.Client({ connectionString: parsed.toString() });
      await attacker.connect();
      try {
        const denied = await pgError(attacker.query(`SELECT * FROM ${helper}`));
        assert.equal(denied.code, '42501', 'the role may not execute the helper');
        await attacker.query(
          `CREATE FUNCTION ${role}.pin() RETURNS SETOF record LANGUAGE sql
             BEGIN ATOMIC SELECT * FROM ${helper}; END`,
        );
      } finally {
        await attacker.end();
      }
      const outcome = await admin.query(`ALTER EXTENSION pg_lease UPDATE`).then(
        () => undefined,
        (error: pg.DatabaseError) => error,
      );
      assert.equal(
        outcome,
        undefined,
        `the update failed: ${outcome?.code} ${outcome?.message} (${outcome?.detail})`,
      );
      const { rows } = await admin.query(
        `SELECT extversion FROM pg_extension WHERE extname = 'pg_lease'`,
      );
      assert.equal(rows[0].extversion, CURRENT_VERSION);
    } finally {
      await admin.end();
    }
  });
});

/** Two keys, new to the database, whose hashtext() is the same: the no-starvation mark's pair. */
async function collidingKeys(q: Queryable): Promise<[string, string]> {
  const prefix = uniqueKey('collide');
  const { rows } = await q.query(
    `SELECT min(k) AS a, max(k) AS b
       FROM (SELECT $1 || i AS k FROM generate_series(1, 400000) AS i) AS s
      GROUP BY hashtext(k) HAVING count(*) > 1 LIMIT 1`,
    [prefix],
  );
  assert.equal(rows.length, 1, 'no two keys of 400000 collide: try another prefix');
  return [rows[0]!.a as string, rows[0]!.b as string];
}

async function untilMarked(q: Queryable, key: string): Promise<void> {
  for (let i = 0; i < 500; i++) {
    const { rows } = await q.query(
      `SELECT EXISTS (SELECT FROM pg_locks
                       WHERE locktype = 'advisory' AND classid = 1885826149
                         AND objid = hashtext($1)::oid AND objsubid = 2
                         AND mode = 'ExclusiveLock' AND granted) AS marked`,
      [key],
    );
    if (rows[0]!.marked) return;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  assert.fail(`no exclusive acquirer marked ${key}`);
}

describe('3. a shared grant denied by the writers mark writes nothing and keeps no lock', () => {
  /*
   * The attack: the mark of a waiting exclusive acquirer is an advisory lock on
   * hashtext(key), so an exclusive acquirer waiting for key A also denies shared grants of a
   * key B whose hash collides (§13: "A hash collision ... can only deny a shared grant"). But
   * acquire_shared on a key never granted first inserted B's row, in its shared phase, outside
   * the subtransaction of the grant, and then was denied by the mark: the denied call wrote a
   * row (which purge never deletes: a key in its shared phase) and, in an open transaction,
   * kept it uncommitted, so every other acquire of B waited for that transaction (§5: a denial
   * writes nothing and keeps no lock).
   */
  test('acquire_shared of a key never granted, denied while an exclusive acquirer waits for a colliding key', async () => {
    await using iso = await Isolation.open(db.url, ['waiter', 's1', 's2']);
    const { waiter, s1, s2 } = iso.named;
    const [a, b] = await collidingKeys(db.pool);
    const reader = await shared(db.pool, a, 'r', '1 minute');
    assert.equal(reader.acquired, true);
    const waiting = waiter.start(acquireCall(a, 'w', '1 minute', '20 seconds'));
    await untilMarked(db.pool, a);

    await s1.query('BEGIN');
    assert.deepEqual(await s1.run(sharedCall(b, 's', '1 minute')), {
      acquired: false,
      epoch: null,
      expiresAt: null,
    });
    // Nothing written, nothing locked: another owner's exclusive acquire of b goes through.
    const x = await s2.run(acquireCall(b, 'x', '1 minute'));
    assert.equal(x.acquired, true);
    await s1.query('COMMIT');
    assert.equal((await inspect(db.pool, b))?.owner, 'x');
    assert.deepEqual(await holders(db.pool, b), [['x', x.epoch]]);

    await db.pool.query('SELECT lease.release($1, $2, $3)', [a, 'r', String(reader.epoch)]);
    assert.equal((await waiting.result()).acquired, true);
  });

  test('and with nothing else there: the denied key reads as never granted', async () => {
    await using iso = await Isolation.open(db.url, ['waiter']);
    const { waiter } = iso.named;
    const [a, b] = await collidingKeys(db.pool);
    const reader = await shared(db.pool, a, 'r', '1 minute');
    const waiting = waiter.start(acquireCall(a, 'w', '1 minute', '20 seconds'));
    await untilMarked(db.pool, a);
    assert.equal((await shared(db.pool, b, 's', '1 minute')).acquired, false);
    assert.equal(await inspect(db.pool, b), undefined);
    await db.pool.query('SELECT lease.release($1, $2, $3)', [a, 'r', String(reader.epoch)]);
    assert.equal((await waiting.result()).acquired, true);
    assert.equal((await shared(db.pool, b, 's', '1 minute')).acquired, true);
  });
});

describe('4. with owners bound, a role cannot make the exclusive key of another role counted', () => {
  /*
   * The attack: with owners bound to roles (§11), a role may act only for its own owners, and
   * nobody can make another role's holder share its key. But lease.set_limit was anyone's on a
   * key not held: role I made key K counted with two permits while K was free. The next
   * lease.acquire(K, 'V/writer', ...) of role V, which uses K as an exclusive key, answered
   * acquired = true with an epoch, exactly as an exclusive grant, yet it was a permit: role I
   * then acquired K too, and both passed lease.fence with their epochs. Two holders of a key
   * that its user acquires exclusively, made by a role that may not act for it; V cannot even
   * release I's permit (42501). With owners bound, set_limit now belongs to who may change the
   * binding (superusers and members of the database owner's role), as bind_owners does.
   */
  test('set_limit by a role that is not the database owner is refused (42501) and changes nothing', async () => {
    const victim = await createRole(db);
    const intruder = await createRole(db);
    const key = uniqueKey('bound-limit');
    await db.pool.query('SELECT lease.bind_owners(true)');
    try {
      const i = await intruder.connect();
      const error = await pgError(i.query('SELECT * FROM lease.set_limit($1, 2)', [key]));
      assert.equal(error.code, '42501');
      assert.equal(
        error.message,
        'pg_lease: only the database owner may set limits while owners are bound to roles',
      );
      assert.equal(await inspect(db.pool, key), undefined);

      const v = await victim.connect();
      const writer = await acquire(v, key, `${victim.name}/writer`, '1 minute');
      assert.equal(writer.acquired, true);
      assert.equal((await acquire(i, key, `${intruder.name}/x`, '1 minute')).acquired, false);
      assert.deepEqual(await holders(db.pool, key), [[`${victim.name}/writer`, writer.epoch]]);

      // The database owner (here a superuser) still sets limits.
      const other = uniqueKey('bound-limit-admin');
      assert.deepEqual(await setLimitCall(other, 2).parse(await db.pool.query(setLimitCall(other, 2).text, setLimitCall(other, 2).values)), {
        permit_limit: 2,
        holders: 0,
      });
    } finally {
      await db.pool.query('SELECT lease.bind_owners(false)');
      await victim.drop();
      await intruder.drop();
    }
  });
});

describe('5. a key or owner with a double quote is shown with it doubled in every message', () => {
  /*
   * The attack: set_limit, acquire_shared and the owner binding named a key or owner in
   * double quotes without doubling a quote inside (fence and acquire's timeout did), so a key
   * such as `a" is held exclusively ... "b` could end its quotes early and make a message read
   * as one about another key. Every message now quotes through lease._quoted.
   */
  test('set_limit, acquire_shared, a stale permit fence, a timed-out acquire and the owner binding', async () => {
    const q = (text: string) => `"${text.replaceAll('"', '""')}"`;
    const held = `${uniqueKey('quote')}" is free, "x`;
    assert.equal((await acquire(db.pool, held, 'w', '1 minute')).acquired, true);
    let error = await pgError(db.pool.query('SELECT lease.set_limit($1, 2)', [held]));
    assert.equal(error.message, `pg_lease: key ${q(held)} is held exclusively`);
    error = await pgError(
      db.pool.query(`SELECT lease.acquire($1, 'x', '1 minute', '10 milliseconds')`, [held]),
    );
    assert.equal(error.detail, `key ${q(held)} was still held after waiting 00:00:00.01`);

    const counted = `${uniqueKey('quote')}"-counted`;
    await db.pool.query('SELECT lease.set_limit($1, 2)', [counted]);
    error = await pgError(shared(db.pool, counted, 'r', '1 minute'));
    assert.equal(error.message, `pg_lease: key ${q(counted)} is a counted key`);
    const permit = await acquire(db.pool, counted, 'p', '1 minute');
    error = await pgError(db.pool.query('SELECT lease.set_limit($1, NULL)', [counted]));
    assert.equal(error.message, `pg_lease: key ${q(counted)} still has live permits`);
    error = await pgError(db.pool.query('SELECT lease.fence($1, $2)', [counted, String(permit.epoch! + 5n)]));
    assert.ok(error.detail?.startsWith(`key ${q(counted)}: epoch`), error.detail);

    const role = await createRole(db);
    const owner = `no"body/${uniqueKey('quote')}`;
    await db.pool.query('SELECT lease.bind_owners(true)');
    try {
      const r = await role.connect();
      error = await pgError(acquire(r, uniqueKey('quote'), owner, '1 minute'));
      assert.equal(error.code, '42501');
      assert.equal(error.message, `pg_lease: owner ${q(owner)} is not bound to role ${role.name}`);
      assert.match(error.detail ?? '', /^Owners are bound to roles: owner "no""body\//);
    } finally {
      await db.pool.query('SELECT lease.bind_owners(false)');
      await role.drop();
    }
  });

  test("the batches' refusal of counted keys names each key quoted", async () => {
    // Two counted keys whose list, unquoted, would read as three keys.
    const a = `${uniqueKey('quote')}, x`;
    const b = `${uniqueKey('quote')}"-b`;
    await db.pool.query('SELECT lease.set_limit($1, 2)', [a]);
    await db.pool.query('SELECT lease.set_limit($1, 2)', [b]);
    const error = await pgError(
      db.pool.query('SELECT * FROM lease.acquire_many($1, $2, $3)', [[a, b], 'w', '1 minute']),
    );
    assert.equal(error.code, '0A000', error.message);
    const quoted = [a, b].sort().map((key) => `"${key.replaceAll('"', '""')}"`);
    assert.equal(error.detail, `Counted keys, or keys in their shared phase: ${quoted.join(', ')}.`);
  });
});

describe('kept from attacks that found nothing', () => {
  test('a waiting exclusive acquirer cancelled by statement_timeout and rolled back to a savepoint leaves no mark while its transaction stays open', async () => {
    await using iso = await Isolation.open(db.url, ['s1']);
    const { s1 } = iso.named;
    const key = uniqueKey('mark-savepoint');
    assert.equal((await shared(db.pool, key, 'r', '1 minute')).acquired, true);
    await s1.query('BEGIN');
    await s1.query('SAVEPOINT attempt');
    await s1.query(`SET LOCAL statement_timeout = '300ms'`);
    const error = await pgError(
      s1.query(acquireCall(key, 'w', '1 minute', '10 seconds').text, [key, 'w', '1 minute', '10 seconds']),
    );
    assert.equal(error.code, '57014');
    await s1.query('ROLLBACK TO SAVEPOINT attempt');
    const { rows } = await db.pool.query(
      `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND classid = 1885826149
          AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
    );
    assert.equal(rows[0].n, 0);
    assert.equal((await shared(db.pool, key, 'b', '1 minute')).acquired, true);
    await s1.query('COMMIT');
  });
});
