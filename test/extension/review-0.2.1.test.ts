/**
 * Adversarial review of pg_lease 0.2.1 (SEMANTICS.md §4, §10, §12). Every test in this file
 * pins a behaviour the review found broken on the 0.2.1 SQL as committed, and fails on it:
 *
 *   1. watch reports `notifies = true` for a grant that carries no mark, so that grant's
 *      release wakes nobody (contract: §4 watch "notifies: whether such a release will notify";
 *      a regression of §12 "the next grant ends a mark");
 *   2. fence_row attached AFTER ROW (which §11 item 17 offers) on a partitioned table lets an
 *      UPDATE move a row to another key (contract: §12 "fence_row refuses key moves");
 *   3. a renew or release that answers `lapsed` after waiting for the row lock keeps that lock
 *      until its transaction ends, holding off the takeover (weakness: a refusal that behaves
 *      like a write; §5 makes that promise for acquire only);
 *   4. two concurrent bind_owners calls: the second fails with the internal XX000 "tuple
 *      concurrently updated" (weakness);
 *   5. a transaction that was open when bind_owners(true) committed keeps renewing for an
 *      owner whose role it may not act for, in new statements (contract, read plainly: §12
 *      "in an open transaction from its next statement that plans");
 *   6. ALTER EXTENSION UPDATE from 0.2.0 keeps 0.2.0's unbounded watch marks, including
 *      marks made against an earlier grant (weakness against §12 "a mark lasts at most five
 *      minutes ... a mark never makes a later holder's releases notify");
 *   7. a caller's standard_conforming_strings = off reaches the PL/pgSQL bodies, which then
 *      parse one literal differently and warn the caller from inside pg_lease (weakness).
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
  releaseCall,
  renewCall,
  sleepPast,
} from '../support/lease-calls.js';
import { FIXTURE_0_2_0 } from '../support/releases.js';
import { createRole, type TestRole } from '../support/roles.js';
import { Isolation, StepBlockedError } from '../support/sessions.js';

let db: TestDatabase;
before(async () => {
  db = await createTestDatabase();
});
after(() => db.close());

describe('1. watch says notifies = true only for a grant whose release will notify', () => {
  /*
   * The attack: watch reads the key's row twice. The first SELECT decides whether a mark
   * stands ("fresh": skip the write); the second, with a new READ COMMITTED snapshot, reports
   * the holder, and notifies := held AND fresh. Since 0.2.1 every grant clears the mark. When
   * a handover (release by A and grant to B) commits between the two SELECTs, watch saw A's
   * mark, reports B's grant, and says notifies = true; but B's grant has no mark, so B's
   * release sends nothing and the waiter sleeps until its poll (the TypeScript client: up to
   * half a watch, 30 s) instead of being woken. In 0.2.0 the mark survived the grant, so the
   * answer was true.
   *
   * Two backends race without round trips: a procedure that calls watch (each call its own
   * transaction, as a client outside a transaction does) and logs every epoch it was told
   * will notify; and a procedure that hands the key from owner to owner, each handover one
   * transaction, logging for every epoch it releases whether the row carried a live mark at
   * that moment (read under the row lock, so no mark can be added between the read and the
   * release). A watch answer (epoch e, notifies = true) with no mark on e at its release is a
   * lost wake-up. No false positive is possible: a mark a watch wrote is committed before the
   * handover can lock the row, and a mark it found fresh lasts a minute unless a grant ends it.
   */
  test('no epoch watch promised a notification for is released unmarked', async () => {
    const key = uniqueKey('watch-race');
    const lit = pg.escapeLiteral(key);
    await db.pool.query(`CREATE TABLE review_watch_promised (epoch bigint)`);
    await db.pool.query(`CREATE TABLE review_released (epoch bigint, marked boolean)`);
    await db.pool.query(`
      CREATE PROCEDURE review_watcher(p_key text, p_until timestamptz) LANGUAGE plpgsql AS $$
      DECLARE r record;
      BEGIN
        WHILE clock_timestamp() < p_until LOOP
          SELECT * INTO r FROM lease.watch(p_key, interval '1 minute');
          IF r.notifies THEN INSERT INTO review_watch_promised VALUES (r.epoch); END IF;
          COMMIT;
        END LOOP;
      END $$`);
    await db.pool.query(`
      CREATE PROCEDURE review_handover(p_key text, p_until timestamptz) LANGUAGE plpgsql AS $$
      DECLARE o text; e bigint; m boolean; s text;
      BEGIN
        WHILE clock_timestamp() < p_until LOOP
          SELECT l.owner, l.epoch, coalesce(l.watched_until > clock_timestamp(), false)
            INTO o, e, m FROM lease.leases AS l WHERE l.key = p_key FOR UPDATE;
          SELECT r.status INTO s FROM lease.release(p_key, o, e) AS r;
          IF s <> 'ok' THEN RAISE EXCEPTION 'release of epoch % said %', e, s; END IF;
          PERFORM lease.acquire(p_key, CASE WHEN o = 'a' THEN 'b' ELSE 'a' END, interval '1 hour');
          INSERT INTO review_released VALUES (e, m);
          COMMIT;
        END LOOP;
      END $$`);
    await acquire(db.pool, key, 'a', '1 hour');
    const watcher = await db.pool.connect();
    const handover = await db.pool.connect();
    try {
      let lost = 0;
      let promised = 0;
      // A few seconds of racing find dozens of lost wake-ups on 2 cores; three rounds leave
      // a margin for a loaded machine.
      for (let round = 0; round < 3 && lost === 0; round++) {
        const until = `clock_timestamp() + interval '4 seconds'`;
        const { rows } = await db.pool.query<{ until: string }>(`SELECT (${until})::text AS until`);
        const untilLit = pg.escapeLiteral(rows[0]!.until);
        await Promise.all([
          watcher.query(`CALL review_watcher(${lit}, ${untilLit})`),
          handover.query(`CALL review_handover(${lit}, ${untilLit})`),
        ]);
        const counts = await db.pool.query<{ lost: string; promised: string }>(
          `SELECT (SELECT count(*) FROM review_watch_promised w
                     JOIN review_released r USING (epoch) WHERE NOT r.marked)::text AS lost,
                  (SELECT count(*) FROM review_watch_promised)::text AS promised`,
        );
        lost = Number(counts.rows[0]!.lost);
        promised = Number(counts.rows[0]!.promised);
      }
      assert.ok(promised > 0, 'the watcher was told notifies = true at least once');
      assert.equal(
        lost,
        0,
        `${lost} watch answers said notifies = true for a grant that was released without a mark`,
      );
    } finally {
      watcher.release();
      handover.release();
    }
  });
});

describe('2. fence_row refuses a key move also when attached AFTER ROW to a partitioned table', () => {
  /*
   * The attack: §11 item 17 offers fence_row AFTER ROW ("it sees the final row"). On a
   * partitioned table an UPDATE that moves a row to another partition is executed as a DELETE
   * from the old partition and an INSERT into the new one, and for AFTER ROW triggers
   * PostgreSQL fires AFTER DELETE and AFTER INSERT, never AFTER UPDATE. fence_row then sees an
   * INSERT of the moved row, fences it by the new key, and never sees the old key: the holder
   * of key b takes a row away from key a's holder, which §12 says is refused with 0A000.
   * (Attached BEFORE, the BEFORE UPDATE trigger fires on the old partition and refuses.)
   */
  test("a writer holding key b cannot move a row out of key a's partition", async () => {
    const table = `moves_${uniqueKey('p').replace(/[^a-z0-9]/gi, '_')}`;
    const a = uniqueKey('part-a');
    const b = uniqueKey('part-b');
    const holderA = await acquire(db.pool, a, 'holder-a', '1 hour');
    // b's epoch differs from a's, so the stored epoch is b's claim and not a's.
    await acquire(db.pool, b, 'earlier', '1 hour').then((grant) =>
      db.pool.query(`SELECT lease.release($1, 'earlier', $2)`, [b, String(grant.epoch)]),
    );
    const holderB = await acquire(db.pool, b, 'holder-b', '1 hour');
    assert.notEqual(holderA.epoch, holderB.epoch);
    await db.pool.query(
      `CREATE TABLE ${table} (lease_key text, lease_epoch bigint, payload text) PARTITION BY LIST (lease_key)`,
    );
    await db.pool.query(
      `CREATE TABLE ${table}_a PARTITION OF ${table} FOR VALUES IN (${pg.escapeLiteral(a)})`,
    );
    await db.pool.query(
      `CREATE TABLE ${table}_b PARTITION OF ${table} FOR VALUES IN (${pg.escapeLiteral(b)})`,
    );
    await db.pool.query(
      `CREATE TRIGGER fence AFTER INSERT OR UPDATE ON ${table}
         FOR EACH ROW EXECUTE FUNCTION lease.fence_row('lease_key', 'lease_epoch')`,
    );
    // Attached AFTER to a partitioned table the trigger cannot see a move, so it refuses to run.
    const after = await db.pool
      .query(`INSERT INTO ${table} VALUES ($1, $2, 'written by a')`, [a, String(holderA.epoch)])
      .then(
        () => undefined,
        (error: pg.DatabaseError) => error,
      );
    assert.equal(after?.code, '0A000');
    assert.match(after?.message ?? '', /must fire BEFORE/);
    await db.pool.query(`DROP TRIGGER fence ON ${table}`);
    await db.pool.query(
      `CREATE TRIGGER fence BEFORE INSERT OR UPDATE ON ${table}
         FOR EACH ROW EXECUTE FUNCTION lease.fence_row('lease_key', 'lease_epoch')`,
    );
    await db.pool.query(`INSERT INTO ${table} VALUES ($1, $2, 'written by a')`, [
      a,
      String(holderA.epoch),
    ]);

    const moved = await db.pool
      .query(`UPDATE ${table} SET lease_key = $1, lease_epoch = $2, payload = 'taken by b'`, [
        b,
        String(holderB.epoch),
      ])
      .then(
        () => undefined,
        (error: pg.DatabaseError) => error,
      );
    const { rows } = await db.pool.query(`SELECT lease_key, payload FROM ${table}`);
    assert.deepEqual(rows, [{ lease_key: a, payload: 'written by a' }], 'the row stayed with key a');
    assert.equal(moved?.code, '0A000');
  });
});

describe('3. a renew or release refused as lapsed after a lock wait keeps no row lock', () => {
  /*
   * The attack: renew and release decide "lapsed" after waiting for the row (§10, "Lapse is
   * final, also after a lock wait"), which is right, but the decision is made under a
   * FOR NO KEY UPDATE lock taken outside any subtransaction (40-renew-release.sql, step 2),
   * and the refusal does not give it back. The caller's open transaction then holds the
   * lapsed row, and every takeover, even with wait = 0, queues behind a transaction that
   * changed nothing (§4: wait = 0 may wait for "another transaction's uncommitted change";
   * §5 rules such leftover locks out for a denied acquire, and a refused renew is the same
   * kind of answer). With owners bound, the stale holder's role keeps the takeover waiting
   * although its fence is gone and its call changed nothing. (Weakness: a fence held open
   * by the same role would hold the takeover too, by design.)
   */
  for (const call of ['renew', 'release'] as const) {
    test(`${call} answers lapsed, and the takeover does not wait for its transaction`, async () => {
      const key = uniqueKey(`lapsed-${call}`);
      const grant = await acquire(db.pool, key, 'holder', '3 seconds');
      await using iso = await Isolation.open(db.url, ['fencer', 'stale', 'taker']);
      const { fencer, stale, taker } = iso.named;
      try {
        await fencer.query('BEGIN');
        await fencer.query('SELECT lease.fence($1, $2::bigint)', [key, String(grant.epoch)]);
        await stale.query('BEGIN');
        const refused = stale.start(
          call === 'renew'
            ? renewCall(key, 'holder', grant.epoch, '1 minute')
            : releaseCall(key, 'holder', grant.epoch),
        );
        await iso.untilBlocked(refused, fencer);
        await sleepPast(db.pool, grant.expiresAt);
        await fencer.query('COMMIT');
        assert.equal((await refused.result()).status, 'lapsed');

        // The stale caller's transaction stays open, having changed nothing.
        let takeover;
        try {
          takeover = await taker.run(acquireCall(key, 'taker', '1 minute'));
        } catch (error) {
          if (error instanceof StepBlockedError)
            assert.fail(`the takeover waits for the transaction whose ${call} said lapsed`);
          throw error;
        }
        assert.equal(takeover.acquired, true);
        assert.ok(takeover.epoch! > grant.epoch!);
      } finally {
        await stale.query('ROLLBACK').catch(() => undefined);
        await fencer.query('ROLLBACK').catch(() => undefined);
      }
    });
  }
});

describe('4. bind_owners is safe to call from two sessions at once', () => {
  /*
   * The attack: bind_owners replaces lease._owners_bound() with CREATE OR REPLACE FUNCTION,
   * which updates the function's pg_proc row without locking it first. A second call while
   * the first is uncommitted waits for it and then fails with SQLSTATE XX000 "tuple
   * concurrently updated", an internal error, instead of applying (or reporting) the setting.
   */
  test('the second of two concurrent bind_owners(true) calls succeeds once the first commits', async () => {
    await using iso = await Isolation.open(db.url, ['first', 'second']);
    const { first, second } = iso.named;
    try {
      await first.query('BEGIN');
      await first.query('SELECT lease.bind_owners(true)');
      const concurrent = second.start('SELECT lease.bind_owners(true) AS bound');
      await iso.blockedOrSettled(concurrent, first);
      await first.query('COMMIT');
      const outcome = await concurrent.result().then(
        (result) => result.rows[0] as { bound: boolean },
        (error: pg.DatabaseError) => error,
      );
      if (outcome instanceof Error)
        assert.fail(
          `bind_owners failed with ${(outcome as pg.DatabaseError).code}: ${outcome.message}`,
        );
      assert.equal(outcome.bound, true);
    } finally {
      await first.query('ROLLBACK').catch(() => undefined);
      await db.pool.query('SELECT lease.bind_owners(false)');
    }
  });
});

describe('5. bind_owners(true) applies from the next transaction of a session that is in one', () => {
  /*
   * The switch is a constant that PL/pgSQL folds into its cached plans, and a session
   * processes the invalidation of those plans when it starts a transaction or takes a new
   * lock. A transaction that called renew before the switch committed may go on under the old
   * setting until it ends (SEMANTICS.md §12 says so); its session's next transaction must not.
   */
  test("a session that renewed another role's owner inside an open transaction is refused in its next one", async () => {
    const roles: TestRole[] = [];
    let asCarol: pg.Client | undefined;
    try {
      const alice = await createRole(db);
      const carol = await createRole(db);
      roles.push(alice, carol);
      const key = uniqueKey('open-across-switch');
      const owner = `${alice.name}/worker`;
      const grant = await acquire(db.pool, key, owner, '1 hour');
      asCarol = await carol.connect();
      await asCarol.query('BEGIN');
      const before = await asCarol.query(`SELECT status FROM lease.renew($1, $2, $3, '1 hour')`, [
        key,
        owner,
        String(grant.epoch),
      ]);
      assert.equal(before.rows[0].status, 'ok', 'binding is off: anyone may renew');
      await db.pool.query('SELECT lease.bind_owners(true)');
      await asCarol.query('COMMIT');
      const next = await asCarol
        .query(`SELECT status FROM lease.renew($1, $2, $3, '2 hours')`, [
          key,
          owner,
          String(grant.epoch),
        ])
        .then(
          (result) => result.rows[0] as { status: string },
          (error: pg.DatabaseError) => error,
        );
      assert.ok(
        next instanceof pg.DatabaseError,
        `Carol renewed Alice's owner in a transaction begun after bind_owners(true): ${JSON.stringify(next)}`,
      );
      assert.equal(next.code, '42501');
    } finally {
      await asCarol?.query('ROLLBACK').catch(() => undefined);
      await db.pool.query('SELECT lease.bind_owners(false)');
      for (const role of roles) await role.drop();
    }
  });
});

describe('6. ALTER EXTENSION UPDATE from 0.2.0 bounds the watch marks it inherits', () => {
  /*
   * The attack: 0.2.0 marked a key for as long as watch asked (watch(k, '1 year')) and kept
   * the mark across grants. The update to 0.2.1 keeps the rows as they are, so such a mark
   * lasts past five minutes, and one made against an earlier grant makes the current,
   * later holder's release notify: both are what §12 says a mark never does.
   */
  let cluster: PgCluster;
  before(async () => {
    cluster = await PgCluster.start({ extraExtensionFiles: [FIXTURE_0_2_0] });
  });
  after(() => cluster?.destroy());

  test('after the update no mark runs more than five minutes ahead', async () => {
    const url = await cluster.createDatabase(undefined, { extension: false });
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    try {
      await client.query(`CREATE EXTENSION pg_lease VERSION '0.2.0'`);
      // Marked for a year while held.
      await client.query(`SELECT lease.acquire('long', 'a', '1 hour')`);
      await client.query(`SELECT lease.watch('long', '1 year')`);
      // Marked against a's grant, then released and granted to b: the mark stays in 0.2.0.
      const { rows } = await client.query(`SELECT epoch FROM lease.acquire('handed', 'a', '1 hour')`);
      await client.query(`SELECT lease.watch('handed', '1 hour')`);
      await client.query(`SELECT lease.release('handed', 'a', $1)`, [rows[0].epoch]);
      await client.query(`SELECT lease.acquire('handed', 'b', '1 hour')`);
      const marked = await client.query(
        `SELECT key FROM lease.leases WHERE watched_until > clock_timestamp() + interval '5 minutes' ORDER BY key`,
      );
      assert.deepEqual(
        marked.rows.map((r) => r.key),
        ['handed', 'long'],
        '0.2.0 left long marks',
      );

      await client.query('ALTER EXTENSION pg_lease UPDATE');
      const after = await client.query(
        `SELECT key, watched_until FROM lease.leases
          WHERE watched_until > clock_timestamp() + interval '5 minutes' ORDER BY key`,
      );
      assert.deepEqual(after.rows, [], 'marks longer than five minutes survived the update');
    } finally {
      await client.end();
    }
  });
});

describe("7. the extension's SQL is parsed the same whatever the caller's string-literal settings", () => {
  /*
   * The attack: the PL/pgSQL bodies pin only search_path, so their statements are parsed
   * with the caller's standard_conforming_strings. Under `off` the validator's pattern
   * '%\_many' (10-rules.sql) loses its backslash and becomes '%_many' (which by luck still
   * tells batches from single calls), and the caller gets a WARNING from inside pg_lease on
   * the first call of the session that takes the validating path.
   */
  test('a caller with standard_conforming_strings = off gets no warning from pg_lease', async () => {
    const client = new pg.Client({ connectionString: db.url });
    const notices: string[] = [];
    client.on('notice', (notice) => notices.push(`${notice.severity}: ${notice.message}`));
    await client.connect();
    try {
      await client.query('SET standard_conforming_strings = off');
      await client.query('SET escape_string_warning = on');
      // A ttl of one day is valid but not "plain": acquire validates it.
      await client.query(`SELECT * FROM lease.acquire($1, 'o', '1 day')`, [uniqueKey('scs')]);
      assert.deepEqual(notices, []);
    } finally {
      await client.end();
    }
  });
});
