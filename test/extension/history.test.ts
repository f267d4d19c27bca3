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
 * commit; before a list or inspect (outside REPEATABLE READ), a clock reading of its own, since
 * their snapshot is taken at Bind, which may precede the statement_timestamp() of Execute (the
 * first test below). The model reasons only with those intervals (see its header), so it reports
 * nothing that some commit order and timing consistent with the history would allow.
 *
 * The first test pins that read window: it splits a list's Parse and Bind from its Execute,
 * commits a release in between, and requires the model to accept the held grant the list
 * reports, and to flag the same answer as I7 once the list is taken to have been sent after the
 * commit. The second proves that the checker checks: against the released 0.2.0 (the fixture
 * extension/test/fixtures/pg_lease--0.2.0.sql, installed in a private server), whose
 * acquire_many inserts a key whose free row a concurrent purge deleted at the epoch floor of its
 * own snapshot, the same generator and model must report an I2/I3 violation within a bounded
 * number of operations. The third runs the current extension (the default version) and
 * requires no violation at all.
 *
 * The random choices come from a seeded generator; every run prints its seed, and
 * PG_LEASE_HISTORY_SEED=<seed> replays the same choices (the timing, and so the history, still
 * varies). A failure prints the violations with a trace of the calls involved
 * (PG_LEASE_HISTORY_SHOW=<n> shows n of them, default 6).
 */
import assert from 'node:assert/strict';
import { once, type EventEmitter } from 'node:events';
import { describe, test } from 'node:test';
import pg from 'pg';
import { PgCluster } from 'pg-lease-testing';
import { createTestDatabase } from '../support/database.js';
import {
  checkHistory,
  formatViolations,
  operationsToShow,
  summarize,
  type Call,
  type Isolation,
  type Request,
  type Txn,
  type Violation,
} from '../support/history-model.js';
import {
  DETECTION_BUDGET,
  OPERATIONS,
  PREFIX,
  coverage,
  prepare,
  runHistory,
  seedFor,
  statement,
} from '../support/history-run.js';
import { micros } from '../support/lease-calls.js';
import { FIXTURE_0_2_0 } from '../support/releases.js';
import type { TestRole } from '../support/roles.js';

type Connection = EventEmitter & Record<string, (...args: unknown[]) => void>;
const HELD = ['describe', 'execute', 'sync', 'flush'] as const;

/**
 * Sends a parameterised query as node-postgres does (Parse, Bind, Describe, Execute, Sync) but
 * holds back Describe, Execute and Sync until `go()`: once `bound` resolves the server has run
 * Bind, where it takes a SELECT's snapshot, and has not yet seen Execute, which sets
 * statement_timestamp() again. A backend that loses the CPU between the two does the same.
 */
function sendInTwo(client: pg.Client, text: string, values: unknown[]) {
  const connection = (client as unknown as { connection: Connection }).connection;
  const proto = Object.getPrototypeOf(connection) as Connection;
  const held: (() => void)[] = [];
  for (const m of HELD)
    connection[m] = (...args: unknown[]) => held.push(() => proto[m]!.apply(connection, args));
  const bound = once(connection, 'bindComplete');
  const result = client.query<Record<string, unknown>>(text, values);
  for (const m of HELD) delete connection[m];
  assert.equal(held.length, 3, 'node-postgres sent the query at once');
  connection.flush!();
  return { result, bound, go: () => held.forEach((send) => send()) };
}

/** One session of a hand-made history: its calls, recorded as history-run.ts records them. */
class Recorder {
  last = 0n;
  #index = 0;
  constructor(
    readonly id: number,
    readonly client: pg.Client,
    readonly calls: Call[],
    readonly txns: Txn[],
  ) {}

  /** A clock reading: the end of what came before it, and the `sent` bound of what follows. */
  async clock(): Promise<bigint> {
    const { rows } = await this.client.query<{ t0: string; t1: string }>(
      `SELECT ${micros('statement_timestamp()')} AS t0, ${micros('clock_timestamp()')} AS t1`,
    );
    this.last = BigInt(rows[0]!.t1);
    return BigInt(rows[0]!.t0);
  }

  txn(isolation: Isolation): Txn {
    const txn: Txn = {
      id: this.txns.length + 1,
      session: this.id,
      isolation,
      outcome: 'open',
      endLo: 0n,
      endHi: 0n,
      calls: [],
    };
    this.txns.push(txn);
    return txn;
  }

  /** Runs the request; `between` runs after its Bind and before its Execute. */
  async call(txn: Txn, request: Request, between?: () => Promise<void>): Promise<Call> {
    const call: Call = {
      id: this.calls.length,
      session: this.id,
      index: this.#index++,
      txn,
      request,
      t0: 0n,
      t1: 0n,
      sent: this.last,
    };
    this.calls.push(call);
    txn.calls.push(call);
    const { text, values, parse } = statement(request);
    let rows: Record<string, unknown>[];
    if (between) {
      const sending = sendInTwo(this.client, text, values);
      await sending.bound;
      await between();
      sending.go();
      ({ rows } = await sending.result);
    } else {
      ({ rows } = await this.client.query<Record<string, unknown>>(text, values));
    }
    call.t0 = BigInt(rows[0]!.t0 as string);
    call.t1 = BigInt(rows[0]!.t1 as string);
    call.response = parse(rows);
    this.last = call.t1;
    return call;
  }
}

describe('a randomized history of every call, checked against a model of the contract', () => {
  test('a list bound before a release commits reads the grant as held, though its statement_timestamp() is later; the model allows exactly that', async () => {
    const db = await createTestDatabase();
    const clients = [1, 2].map(() => new pg.Client({ connectionString: db.url }));
    try {
      for (const client of clients) await client.connect();
      const calls: Call[] = [];
      const txns: Txn[] = [];
      const [a, b] = clients.map((client, i) => new Recorder(i + 1, client, calls, txns)) as [
        Recorder,
        Recorder,
      ];
      await a.clock();
      await b.clock();
      const key = `${PREFIX}k0`;

      const acquireTxn = a.txn('autocommit');
      const acquire = await a.call(acquireTxn, {
        op: 'acquire',
        key,
        owner: 'a',
        ttlUs: 3_600_000_000n,
        waitUs: 0n,
      });
      const granted = acquire.response?.kind === 'grants' ? acquire.response.rows[0] : undefined;
      assert.equal(granted?.acquired, true);
      const epoch = granted!.epoch!;
      Object.assign(acquireTxn, { outcome: 'committed', endLo: acquire.t1 });

      // b: BEGIN, then list's Parse and Bind; a releases and sees its commit; then b's Execute.
      const listTxn = b.txn('read committed');
      await b.client.query('BEGIN');
      const releaseTxn = a.txn('autocommit');
      let released = 0n;
      const request: Request = { op: 'list', prefix: PREFIX, heldOnly: true, keys: [key] };
      const list = await b.call(listTxn, request, async () => {
        const release = await a.call(releaseTxn, { op: 'release', key, owner: 'a', epoch });
        assert.deepEqual(release.response, {
          kind: 'statuses',
          rows: [{ key, status: 'ok', expiresAt: null }],
        });
        acquireTxn.endHi = release.t0;
        released = await a.clock();
        Object.assign(releaseTxn, { outcome: 'committed', endLo: release.t1, endHi: released });
      });
      await b.client.query('COMMIT');
      Object.assign(listTxn, { outcome: 'committed', endLo: list.t1, endHi: await b.clock() });

      // What the server did: the release committed before the list's statement_timestamp(), and
      // the list still read the grant, from the snapshot its Bind took.
      assert.ok(
        released < list.t0,
        `release committed before ${released}, list began at ${list.t0}`,
      );
      assert.deepEqual(
        list.response?.kind === 'states' &&
          list.response.rows.map((r) => [r.key, r.held, r.owner, r.epoch]),
        [[key, true, 'a', epoch]],
      );
      assert.ok(list.sent < releaseTxn.endLo, 'the list was sent before the release');

      const history = { calls, txns, keys: [key] };
      const violations = checkHistory(history);
      assert.deepEqual(violations, [], formatViolations(history, violations, 3, PREFIX));

      // Had the list left the client after the release's commit, the same answer would be a stale
      // read, and the model must say so.
      list.sent = released + 1n;
      const stale = checkHistory(history);
      assert.deepEqual(
        stale.map((v) => v.invariant).sort(),
        ['I7', 'I7'],
        formatViolations(history, stale, 3, PREFIX),
      );
    } finally {
      for (const client of clients) await client.end().catch(() => undefined);
      await db.close();
    }
  });

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
