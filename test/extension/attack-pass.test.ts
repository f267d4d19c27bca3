/**
 * Attack pass on pg_lease 0.2.1 (SEMANTICS.md §4, §5, §10, §12). Every test in this file pins
 * a behaviour found broken on the 0.2.1 SQL as committed (branch main at 60c9707), and fails on
 * it:
 *
 *   1. a renew or release by the former holder that waited for the row lock while the key was
 *      taken over answers not_owner, and its transaction keeps the new holder's row locked:
 *      the new holder's renew and release wait until that transaction ends (a new variant of
 *      review-0.2.1 #3: there the refusal was `lapsed`; here the takeover committed first, so
 *      the EvalPlanQual recheck of the lock fails and PostgreSQL keeps the lock it took);
 *   2. on PostgreSQL 14 to 17 a key carrying a nondeterministic collation (a business column
 *      declared `COLLATE` a case-insensitive ICU collation, passed to lease.fence) turns the
 *      fence's refusal PLF01 and a blocking acquire's timeout 57014 into 0A000 "nondeterministic
 *      collations are not supported for substring searches": the DETAIL's replace() runs under
 *      the caller's collation;
 *   3. a role with no privilege beyond PUBLIC's (and CREATE in some schema of its own) blocks
 *      ALTER EXTENSION pg_lease UPDATE from 0.2.0: it makes a function or view that refers to
 *      one of the 0.2.0 helpers the update drops; creating it needs no EXECUTE on the helper;
 *   4. with synchronous standbys configured, a same-owner acquire that waited for the row lock
 *      (behind a fenced writer of the holder) past the grant's expiry answers acquired = false,
 *      as if another owner held the key, and its transaction keeps the row locked, so the
 *      takeover waits for it (30-acquire.sql: the confirming UPDATE runs outside any
 *      subtransaction).
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
  pgError,
  releaseCall,
  renewCall,
  sleepPast,
} from '../support/lease-calls.js';
import { CURRENT_VERSION, FIXTURE_0_2_0 } from '../support/releases.js';
import { Isolation, StepBlockedError } from '../support/sessions.js';

let db: TestDatabase;
before(async () => {
  db = await createTestDatabase();
});
after(() => db.close());

describe('1. a refused renew or release keeps no lock on the next holder’s row', () => {
  /*
   * The attack: renew and release write, or lock, the row of the presented grant in a
   * subtransaction (40-renew-release.sql, steps 1 and 2). Under READ COMMITTED an UPDATE or a
   * SELECT ... FOR NO KEY UPDATE that finds its row version changed by a transaction that
   * committed meanwhile locks the newest version and rechecks its WHERE clause on it
   * (EvalPlanQual); when the recheck fails, the row is skipped but the lock stays. The
   * subtransaction is rolled back only when a row matched (PLL02), so when nothing matched it
   * is committed with the lock. Then the call reports not_owner and the caller's transaction,
   * which changed nothing, holds the new holder's row: the new holder's renew and release,
   * and with them everyone's next takeover, wait until it ends.
   *
   * Deterministic form: the taker holds the row lock of the old grant (a fence of that
   * grant, or a watch mark; both allowed to any role while owners are not bound) while the
   * old holder's renew waits for it, then takes the key over at expiry in the same
   * transaction and commits. The old holder's UPDATE wakes on the taker's version, fails the
   * recheck, keeps the lock. Racy form, which needs no cooperation of the taker (seen in 2 of
   * 8 and 4 of 12 tries on PostgreSQL 15.20, 2 of 12 on 18.4): the old holder's renew waits
   * for the holder's own fenced writer past the expiry, a takeover queues behind it, and the
   * takeover wins the row between the renew's two steps (step 2's FOR NO KEY UPDATE).
   */
  for (const call of ['renew', 'release'] as const) {
    for (const via of ['fence', 'watch'] as const) {
      test(`a ${call} that waited across a takeover (taker's ${via} first) keeps no lock`, async () => {
        const key = uniqueKey(`eqp-${call}-${via}`);
        const old = await acquire(db.pool, key, 'old', '2 seconds');
        await using iso = await Isolation.open(db.url, ['taker', 'stale', 'next']);
        const { taker, stale, next } = iso.named;
        try {
          await taker.query('BEGIN');
          if (via === 'fence')
            await taker.query('SELECT lease.fence($1, $2::bigint)', [key, String(old.epoch)]);
          else
            assert.equal(
              (await taker.query(`SELECT notifies FROM lease.watch($1, '1 minute')`, [key]))
                .rows[0].notifies,
              true,
            );
          await stale.query('BEGIN');
          const refused = stale.start(
            call === 'renew'
              ? renewCall(key, 'old', old.epoch, '1 minute')
              : releaseCall(key, 'old', old.epoch),
          );
          await iso.untilBlocked(refused, taker);
          await sleepPast(db.pool, old.expiresAt);
          const grant = await taker.run(acquireCall(key, 'new', '1 minute'));
          assert.equal(grant.acquired, true);
          await taker.query('COMMIT');
          assert.equal((await refused.result()).status, 'not_owner');

          // The stale caller's transaction stays open, having changed nothing.
          for (const own of [
            renewCall(key, 'new', grant.epoch, '1 minute'),
            releaseCall(key, 'new', grant.epoch),
          ]) {
            try {
              assert.equal((await next.run(own)).status, 'ok');
            } catch (error) {
              if (error instanceof StepBlockedError)
                assert.fail(
                  `the new holder's ${own.text.includes('renew') ? 'renew' : 'release'} waits ` +
                    `for the transaction whose ${call} said not_owner`,
                );
              throw error;
            }
          }
        } finally {
          await stale.query('ROLLBACK').catch(() => undefined);
          await taker.query('ROLLBACK').catch(() => undefined);
        }
      });
    }
  }
});

describe('2. a key with a nondeterministic collation gets the documented errors', () => {
  /*
   * The attack: PL/pgSQL parameters take the collation of the call's arguments, so a key
   * read from a column declared COLLATE a nondeterministic collation reaches lease.fence and
   * lease._acquire_wait with it. Every comparison of keys says COLLATE "C", but the DETAIL of
   * the refusal quotes the key with replace(p_key, '"', '""'), and before PostgreSQL 18
   * replace() refuses nondeterministic collations: the fence fails with 0A000 instead of
   * PLF01 (§10 Fence), a blocking acquire that runs out of time with 0A000 instead of 57014
   * (§4). Both still fail closed, but a client that tells a stale epoch (PLF01) or a timeout
   * (57014) from other errors by SQLSTATE takes them for internal errors.
   */
  let collation: string | undefined;
  before(async () => {
    const { rows } = await db.pool.query(
      `SELECT count(*)::int AS n FROM pg_collation WHERE collprovider = 'i'`,
    );
    if (rows[0].n === 0) return;
    await db.pool.query(
      `CREATE COLLATION attack_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)`,
    );
    collation = 'attack_ci';
  });

  test('lease.fence of a stale epoch raises PLF01, whatever the key’s collation', async (t) => {
    if (!collation) return t.skip('the server has no ICU collations');
    const key = uniqueKey('ci-fence');
    const grant = await acquire(db.pool, key, 'holder', '1 minute');
    await db.pool.query(
      `CREATE TABLE attack_ci_jobs (lease_key text COLLATE ${collation}, lease_epoch bigint)`,
    );
    await db.pool.query(`INSERT INTO attack_ci_jobs VALUES ($1, $2::bigint - 1), ($3, 1)`, [
      key,
      String(grant.epoch),
      uniqueKey('ci-never'),
    ]);
    const { rows } = await db.pool.query<{ lease_key: string; lease_epoch: string }>(
      `SELECT lease_key, lease_epoch::text FROM attack_ci_jobs`,
    );
    for (const row of rows) {
      const error = await pgError(
        db.pool.query(
          `SELECT lease.fence(j.lease_key, j.lease_epoch) FROM attack_ci_jobs AS j
            WHERE j.lease_key = $1 COLLATE "C"`,
          [row.lease_key],
        ),
      );
      assert.equal(error.code, 'PLF01', `fence of ${row.lease_key}: ${error.message}`);
    }
  });

  test('a blocking acquire of such a key that runs out of time raises 57014', async (t) => {
    if (!collation) return t.skip('the server has no ICU collations');
    const key = uniqueKey('ci-wait');
    await acquire(db.pool, key, 'holder', '1 minute');
    const error = await pgError(
      db.pool.query(
        `SELECT * FROM lease.acquire($1::text COLLATE ${collation}, 'waiter', '1 minute', '100 ms')`,
        [key],
      ),
    );
    assert.equal(error.code, '57014', error.message);
  });

  test('(on every version) the same calls with a deterministic collation behave so', async () => {
    const key = uniqueKey('c-fence');
    await acquire(db.pool, key, 'holder', '1 minute');
    const fence = await pgError(db.pool.query(`SELECT lease.fence($1::text, 999)`, [key]));
    assert.equal(fence.code, 'PLF01');
    const wait = await pgError(
      db.pool.query(`SELECT * FROM lease.acquire($1::text, 'waiter', '1 minute', '100 ms')`, [
        key,
      ]),
    );
    assert.equal(wait.code, '57014');
  });
});

describe('3. a role without privileges cannot block ALTER EXTENSION pg_lease UPDATE', () => {
  /*
   * The attack: PostgreSQL checks EXECUTE on a function when a view or a SQL-standard function
   * body that calls it runs, not when it is created, and records a dependency on it. The update
   * from 0.2.0 drops five 0.2.0 helpers (extension/src/upgrade/0.2.0--0.2.1.sql: _validate with
   * six arguments, _validate_batch, _validate_operation, _refusal, _renew_or_release_many). A
   * role with no privilege on any of them, only CREATE in a schema of its own (or TEMP, for as
   * long as its session lives), makes a function whose body calls one; DROP FUNCTION then fails
   * with 2BP01 and the whole update rolls back. Until a superuser finds and drops that object,
   * the database stays on 0.2.0 with its known defects (the epoch that acquire_many hands out
   * twice across a purge, SEMANTICS.md §12). The guard (§10, §12) looks for foreign objects in
   * schema lease and on its tables, not for objects elsewhere that depend on what it drops.
   */
  let cluster: PgCluster;
  before(async () => {
    cluster = await PgCluster.start({ extraExtensionFiles: [FIXTURE_0_2_0] });
  });
  after(async () => {
    await cluster?.destroy();
  });

  const helpers = [
    `lease._refusal('k', 'o', 1::bigint, now())`,
    `lease._validate_batch('acquire_many', '{k}'::text[], 'o', NULL::bigint[], '1 minute'::interval)`,
  ];
  for (const [index, helper] of helpers.entries()) {
    test(`a function of another role calling ${helper.slice(0, helper.indexOf('('))} does not stop the update`, async () => {
      const url = await cluster.createDatabase(undefined, { extension: false });
      const admin = new pg.Client({ connectionString: url });
      await admin.connect();
      const role = `attack_update_${index}`;
      try {
        await admin.query(`CREATE EXTENSION pg_lease VERSION '0.2.0'`);
        await admin.query(`CREATE ROLE ${role} LOGIN`);
        await admin.query(`CREATE SCHEMA ${role} AUTHORIZATION ${role}`);
        const parsed = new URL(url);
        parsed.username = role;
        const attacker = new pg.Client({ connectionString: parsed.toString() });
        await attacker.connect();
        try {
          const denied = await pgError(attacker.query(`SELECT ${helper}`));
          assert.equal(denied.code, '42501', 'the role may not execute the helper');
          await attacker.query(
            `CREATE FUNCTION ${role}.pin() RETURNS void LANGUAGE sql
               BEGIN ATOMIC SELECT ${helper}; END`,
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
  }
});

describe('4. with synchronous standbys, a same-owner acquire that waited past the expiry', () => {
  /*
   * The attack: with synchronous_standby_names set, a same-owner acquire confirms its live
   * grant by rewriting the row unchanged (§10 Durable commits), with a plain UPDATE in the
   * caller's transaction (30-acquire.sql, step 2). When that UPDATE waits for the row lock (a
   * fenced writer of the holder, or any role's watch or fence in an open transaction while
   * owners are not bound) and the grant lapses meanwhile, the clock read after it says "not
   * live", the call goes round once more with its first clock reading (the grant still live
   * by it, so step 1 takes nothing over) and ends denied: acquired = false, the answer for a
   * key HELD by another owner (§4), although the only holder was the caller. And the UPDATE's
   * row lock stays with the caller's transaction, which changed nothing: the takeover by
   * another owner waits until it ends (§12 "A refusal keeps no lock"; §5).
   *
   * No standby is needed to see it: nothing commits while synchronous_standby_names names one
   * (a commit would wait for it); every transaction here rolls back.
   */
  let cluster: PgCluster;
  let url: string;
  before(async () => {
    cluster = await PgCluster.start();
    url = await cluster.createDatabase();
  });
  after(async () => {
    await cluster?.destroy();
  });

  test('neither answers denied nor keeps the row locked', async () => {
    const key = uniqueKey('sync-same-owner');
    const setup = new pg.Client({ connectionString: url });
    await setup.connect();
    let configured = false;
    try {
      const grant = await acquire(setup, key, 'holder', '2 seconds');
      await cluster.query(`ALTER SYSTEM SET synchronous_standby_names = 'attack_nobody'`);
      await cluster.reload();
      configured = true;
      await using iso = await Isolation.open(url, ['writer', 'holder', 'taker']);
      const { writer, holder, taker } = iso.named;
      assert.equal(
        (await holder.query('SHOW synchronous_standby_names')).rows[0].synchronous_standby_names,
        'attack_nobody',
      );
      try {
        await writer.query('BEGIN');
        await writer.query('SELECT lease.fence($1, $2::bigint)', [key, String(grant.epoch)]);
        await holder.query('BEGIN');
        const confirm = holder.start(acquireCall(key, 'holder', '1 minute'));
        await iso.untilBlocked(confirm, writer);
        await sleepPast(setup, grant.expiresAt);
        await taker.query('BEGIN');
        const takeover = taker.start(acquireCall(key, 'taker', '1 minute'));
        await iso.untilBlocked(takeover);
        await writer.query('ROLLBACK');
        const answer = await confirm.result().then(
          (acquired) => acquired,
          (error: pg.DatabaseError) => error,
        );
        if (answer instanceof Error) {
          assert.equal((answer as pg.DatabaseError).code, '40001', answer.message);
        } else {
          if (!answer.acquired)
            assert.fail(
              'the caller’s own grant lapsed while it waited, nobody else held the key, yet it ' +
                `was denied; the takeover is now blocked by: ${(await iso.blockers(taker)).join(', ') || 'nobody'}`,
            );
          assert.ok(answer.epoch! > grant.epoch!, 'a grant after the lapse is a new one');
          return;
        }
        // The holder's transaction is over (aborted): the takeover must not wait for it.
        await iso.untilSettled(takeover);
        assert.equal((await takeover.result()).acquired, true);
      } finally {
        await holder.query('ROLLBACK').catch(() => undefined);
        await taker.query('ROLLBACK').catch(() => undefined);
        await writer.query('ROLLBACK').catch(() => undefined);
      }
    } finally {
      if (configured) {
        await cluster.query('ALTER SYSTEM RESET synchronous_standby_names');
        await cluster.reload();
      }
      await setup.end();
    }
  });
});
