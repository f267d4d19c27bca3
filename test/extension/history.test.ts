/**
 * A randomized concurrent history of every call of the SQL API, checked against a model of the
 * contract (test/support/history-model.ts; specs/SEMANTICS.md I1-I12).
 *
 * Five sessions (one pg.Client each) share four keys and draw from one random mix: acquire
 * with wait 0 and with a short wait, acquire_many, renew, renew_many, release, release_many,
 * lease.fence followed by a write to a table fenced by lease.fence_row, writes through that
 * trigger alone, watch, purge (older_than 0 or a few ms, small limits), inspect and list.
 * ttls run from 20 ms to 1 s, so grants lapse, are taken over and are purged all the time. Some
 * calls run in explicit transactions, READ COMMITTED or REPEATABLE READ, that sit on their row
 * locks (or on a stale snapshot) for up to 100 ms and then commit or roll back; a fenced write
 * sometimes stalls until just past its grant's expiry, and a purge that deleted rows often
 * keeps its transaction open a while, so that takeovers race fences and acquires race purges.
 * Renewals and releases also go out with a wrong epoch, a stale grant or an owner nobody holds,
 * so every status is exercised.
 *
 * Every call is recorded with the server's clock: `statement_timestamp()` and
 * `clock_timestamp()` in the call's own statement, the expiry it returned, and for each
 * transaction the last clock reading inside it and the first after its end, which bound its
 * commit. The model reasons only with those intervals (see its header), so it reports nothing
 * that some commit order and timing consistent with the history would allow.
 *
 * The first test proves that the checker checks: against the released 0.2.0 (the fixture
 * extension/test/fixtures/pg_lease--0.2.0.sql, installed in a private server), whose
 * acquire_many inserts a key whose free row a concurrent purge deleted at the epoch floor of its
 * own snapshot, the same generator and model must report an I2/I3 violation within a bounded
 * number of operations. The second runs the current extension (the default version) and
 * requires no violation at all.
 *
 * The random choices come from a seeded generator; every run prints its seed, and
 * PG_LEASE_HISTORY_SEED=<seed> replays the same choices (the timing, and so the history, still
 * varies). A failure prints the violations with a trace of the calls involved
 * (PG_LEASE_HISTORY_SHOW=<n> shows n of them, default 6).
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { PgCluster } from 'pg-lease-testing';
import { createTestDatabase } from '../support/database.js';
import { formatViolations, operationsToShow, summarize, type Violation } from '../support/history-model.js';
import {
  DETECTION_BUDGET,
  OPERATIONS,
  PREFIX,
  coverage,
  prepare,
  runHistory,
  seedFor,
} from '../support/history-run.js';
import { FIXTURE_0_2_0 } from '../support/releases.js';
import type { TestRole } from '../support/roles.js';

describe('a randomized history of every call, checked against a model of the contract', () => {
  test('finds the released 0.2.0 acquire_many handing out an epoch again across a purge (I2/I3)', async (t) => {
    // Extra files are staged after the tree's own: while the tree ships a pg_lease--0.2.0.sql of
    // its own the fixture replaces it, and once the default is 0.2.1 it stands beside it.
    await using cluster = await PgCluster.start({ extraExtensionFiles: [FIXTURE_0_2_0] });
    const db = await createTestDatabase({ extension: false, in: cluster });
    try {
      const { version, url } = await prepare(db, '0.2.0');
      assert.equal(version, '0.2.0');
      const seed = seedFor();
      const isEpochReuse = (v: Violation) => v.invariant === 'I2' || v.invariant === 'I3';
      const { history, violations, operations } = await runHistory(url, seed, DETECTION_BUDGET, {
        enough: (found) => found.some(isEpochReuse),
      });
      const reuse = violations.filter(isEpochReuse);
      const shownAfter = reuse.length > 0 ? Math.min(...reuse.map(operationsToShow)) : undefined;
      t.diagnostic(
        `seed ${seed}: ${operations} operations; ` +
          (shownAfter === undefined ? 'no I2/I3 violation' : `I2/I3 shown by operation ${shownAfter}`) +
          `; found ${summarize(violations) || 'nothing'}`,
      );
      assert.ok(
        shownAfter !== undefined,
        `seed ${seed}: no I2/I3 violation in ${operations} operations against 0.2.0\n` +
          formatViolations(history, violations, 3, PREFIX),
      );
      t.diagnostic(formatViolations(history, reuse, 1, PREFIX));
    } finally {
      await db.close();
    }
  });

  test('the current extension (its default version) keeps every invariant', async (t) => {
    const db = await createTestDatabase({ extension: false });
    let role: TestRole | undefined;
    try {
      const prepared = await prepare(db);
      role = prepared.role;
      const seed = seedFor();
      const started = performance.now();
      const { history, violations, operations } = await runHistory(prepared.url, seed, OPERATIONS, {
        rowsOf: db.pool,
      });
      const covered = coverage(history);
      t.diagnostic(
        `seed ${seed}, version ${prepared.version}: ${operations} operations in ` +
          `${Math.round(performance.now() - started)} ms; ${JSON.stringify(covered)}`,
      );
      assert.equal(violations.length, 0, `seed ${seed}: ${formatViolations(history, violations, Number(process.env.PG_LEASE_HISTORY_SHOW ?? 6), PREFIX)}`);
      // A history that never did these would have checked little.
      for (const what of [
        'acquire',
        'acquire_many',
        'renew',
        'renew_many',
        'release',
        'release_many',
        'fence',
        'fenced_insert',
        'fenced_update',
        'watch',
        'purge',
        'inspect',
        'list',
        'acquired',
        'denied',
        'status ok',
        'status lapsed',
        'status not_owner',
        'status epoch_mismatch',
        'error PLF01',
        'purged rows',
        'read committed committed',
        'read committed rolled back',
        'repeatable read committed',
        'repeatable read rolled back',
      ])
        assert.ok((covered[what] ?? 0) > 0, `seed ${seed}: the history has no ${what}`);
    } finally {
      await role?.drop();
      await db.close();
    }
  });
});
