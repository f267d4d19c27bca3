/**
 * SEMANTICS.md §4 batches: lease.acquire_many, lease.renew_many and lease.release_many give,
 * per key, exactly what the single call gives on the same state; they lock rows in key order
 * (two batches never deadlock), a denied key takes no row lock, bad input is 22023 naming the
 * offending subscripts, renew and release decide lapse with a clock reading taken under the
 * row lock, and under REPEATABLE READ nothing is confirmed from a stale snapshot.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import {
  acquire,
  acquireCall,
  allRows,
  micros,
  pgError,
  release,
  renew,
  renewCall,
  serverNow,
  sleepPast,
  storedRow,
  type Acquired,
  type Queryable,
  type Renewed,
} from '../support/lease-calls.js';
import { fenceCall } from '../support/fence.js';
import { uniqueKey } from '../support/helpers.js';
import { Isolation } from '../support/sessions.js';

let db: TestDatabase;
before(async () => {
  db = await createTestDatabase();
});
after(() => db.close());

interface BatchAcquired extends Acquired {
  key: string;
}
interface BatchRenewed extends Renewed {
  key: string;
}
interface BatchReleased {
  key: string;
  status: string;
}

const bigintOrNull = (value: unknown): bigint | null =>
  value === null || value === undefined ? null : BigInt(value as string);

async function acquireMany(
  q: Queryable,
  keys: (string | null)[] | null,
  owner: string | null,
  ttl: string | null,
): Promise<BatchAcquired[]> {
  const { rows } = await q.query(
    `SELECT key, acquired, epoch::text AS epoch, ${micros('expires_at')} AS expires_us
       FROM lease.acquire_many($1::text[], $2::text, $3::interval)`,
    [keys, owner, ttl],
  );
  return rows.map((row: Record<string, unknown>) => ({
    key: row.key as string,
    acquired: row.acquired as boolean,
    epoch: bigintOrNull(row.epoch),
    expiresAt: bigintOrNull(row.expires_us),
  }));
}

/** renew_many; with `skipLocked`, the five-argument form that passes it as $5. */
function renewManyText(skipLocked = false): string {
  return `SELECT key, status, ${micros('expires_at')} AS expires_us
            FROM lease.renew_many($1::text[], $2::text, $3::bigint[], $4::interval${skipLocked ? ', $5::boolean' : ''})`;
}

function parseRenewed(rows: Record<string, unknown>[]): BatchRenewed[] {
  return rows.map((row) => ({
    key: row.key as string,
    status: row.status as string,
    expiresAt: bigintOrNull(row.expires_us),
  }));
}

async function renewMany(
  q: Queryable,
  keys: (string | null)[] | null,
  owner: string | null,
  epochs: (bigint | number | null)[] | null,
  ttl: string | null,
  skipLocked?: boolean | null,
): Promise<BatchRenewed[]> {
  const values = [keys, owner, epochs?.map((e) => (e === null ? null : String(e))) ?? null, ttl];
  const { rows } = await q.query(
    renewManyText(skipLocked !== undefined),
    skipLocked === undefined ? values : [...values, skipLocked],
  );
  return parseRenewed(rows);
}

async function releaseMany(
  q: Queryable,
  keys: (string | null)[] | null,
  owner: string | null,
  epochs: (bigint | number | null)[] | null,
): Promise<BatchReleased[]> {
  const { rows } = await q.query(
    'SELECT key, status FROM lease.release_many($1::text[], $2::text, $3::bigint[])',
    [keys, owner, epochs?.map((e) => (e === null ? null : String(e))) ?? null],
  );
  return rows as BatchReleased[];
}

// ---------------------------------------------------------------------------------------------
// State combinations: every state of §2, seen by the caller (worker-a) and by another owner.

const ME = 'worker-a';
const OTHER = 'worker-b';

type Setup =
  | 'never'
  | 'free'
  | 'held-mine'
  | 'held-mine-epoch-3'
  | 'held-other'
  | 'lapsed-mine'
  | 'lapsed-other';

const SETUPS: Setup[] = [
  'never',
  'free',
  'held-mine',
  'held-mine-epoch-3',
  'held-other',
  'lapsed-mine',
  'lapsed-other',
];

/** Brings a fresh key into a state; returns the expiry to sleep past (short grants only). */
async function prepare(q: Queryable, key: string, setup: Setup): Promise<bigint | null> {
  switch (setup) {
    case 'never':
      return null;
    case 'free': {
      const granted = await acquire(q, key, ME, '1 hour');
      assert.equal((await release(q, key, ME, granted.epoch)).status, 'ok');
      return null;
    }
    case 'held-mine':
      await acquire(q, key, ME, '1 hour');
      return null;
    case 'held-mine-epoch-3': {
      const granted = await acquire(q, key, ME, '1 hour');
      await release(q, key, ME, granted.epoch);
      await acquire(q, key, ME, '1 hour');
      return null;
    }
    case 'held-other':
      await acquire(q, key, OTHER, '1 hour');
      return null;
    case 'lapsed-mine':
      return (await acquire(q, key, ME, '300 milliseconds')).expiresAt;
    case 'lapsed-other':
      return (await acquire(q, key, OTHER, '300 milliseconds')).expiresAt;
  }
}

/** Prepares twin keys (one for the batch, one for single calls) in each listed state. */
async function twins(
  label: string,
  setups: Setup[],
): Promise<{ batch: string[]; single: string[]; setups: Setup[] }> {
  const batch: string[] = [];
  const single: string[] = [];
  let latest: bigint | null = null;
  for (const setup of setups) {
    const a = uniqueKey(`${label}:${setup}:batch`);
    const b = uniqueKey(`${label}:${setup}:single`);
    for (const key of [a, b]) {
      const expiry = await prepare(db.pool, key, setup);
      if (expiry !== null && (latest === null || expiry > latest)) latest = expiry;
    }
    batch.push(a);
    single.push(b);
  }
  if (latest !== null) await sleepPast(db.pool, latest);
  return { batch, single, setups };
}

/** Deterministic shuffle, so the batch is not in key order. */
function shuffled<T>(items: T[], seed: number): number[] {
  const order = items.map((_, i) => i);
  let state = seed;
  for (let i = order.length - 1; i > 0; i--) {
    state = (state * 1103515245 + 12345) % 2 ** 31;
    const j = state % (i + 1);
    [order[i], order[j]] = [order[j]!, order[i]!];
  }
  return order;
}

/** A stored row without its timestamps' exact values: what the comparison of twins needs. */
async function shape(key: string): Promise<unknown> {
  const row = await storedRow(db.pool, key);
  if (!row) return 'no row';
  return { owner: row.owner, epoch: row.epoch, held: row.expiresAt !== null };
}

describe('each key of a batch gets exactly the single call’s result', () => {
  test('acquire_many matches acquire for every state, owner and order', async () => {
    const { batch, single, setups } = await twins('acq', SETUPS);
    const order = shuffled(batch, 7);
    const before = await Promise.all(batch.map((key) => storedRow(db.pool, key)));
    const t0 = await serverNow(db.pool);
    const rows = await acquireMany(
      db.pool,
      order.map((i) => batch[i]!),
      ME,
      '1 minute',
    );
    const t1 = await serverNow(db.pool);
    assert.deepEqual(
      rows.map((r) => r.key),
      order.map((i) => batch[i]!),
      'one row per key, in input order',
    );
    for (const [position, i] of order.entries()) {
      const got = rows[position]!;
      const want = await acquire(db.pool, single[i]!, ME, '1 minute');
      const what = `${setups[i]}: batch ${JSON.stringify(got, replacer)} single ${JSON.stringify(want, replacer)}`;
      assert.equal(got.acquired, want.acquired, what);
      assert.equal(got.epoch, want.epoch, what);
      assert.equal(got.expiresAt === null, want.expiresAt === null, what);
      if (setups[i]!.startsWith('held-mine')) {
        // A same-owner acquire returns the grant unchanged and writes nothing (I4).
        assert.equal(String(got.expiresAt), before[i]!.expiresAt, what);
        assert.equal((await storedRow(db.pool, batch[i]!))!.version, before[i]!.version, what);
      } else if (got.acquired) {
        const ttl = 60_000_000n;
        assert.ok(got.expiresAt! >= t0 + ttl && got.expiresAt! <= t1 + ttl, what);
      }
      assert.deepEqual(await shape(batch[i]!), await shape(single[i]!), what);
    }
  });

  for (const [op, skipLocked] of [
    ['renew', undefined],
    ['renew', true],
    ['renew', false],
    ['release', undefined],
  ] as const) {
    const name =
      skipLocked === undefined ? `${op}_many` : `${op}_many with p_skip_locked => ${skipLocked}`;
    test(`${name} matches ${op} for every state and every epoch presented`, async () => {
      // Every state with every kind of epoch: the stored one, one above, one below, 1, far off.
      const epochChoices = [0n, 1n, -1n, 'one', 'far'] as const;
      const combos = SETUPS.flatMap((setup) =>
        epochChoices.map((choice) => ({ setup, choice })),
      );
      const { batch, single } = await twins(
        op,
        combos.map((c) => c.setup),
      );
      const epochs = await Promise.all(
        batch.map(async (key, i) => {
          const row = await storedRow(db.pool, key);
          const stored = row ? BigInt(row.epoch) : 1n;
          const choice = combos[i]!.choice;
          if (choice === 'one') return 1n;
          if (choice === 'far') return 1000n;
          return stored + choice;
        }),
      );
      const order = shuffled(batch, 11);
      const keys = order.map((i) => batch[i]!);
      const t0 = await serverNow(db.pool);
      const rows =
        op === 'renew'
          ? await renewMany(
              db.pool,
              keys,
              ME,
              order.map((i) => epochs[i]!),
              '1 minute',
              skipLocked,
            )
          : await releaseMany(
              db.pool,
              keys,
              ME,
              order.map((i) => epochs[i]!),
            );
      const t1 = await serverNow(db.pool);
      assert.deepEqual(
        rows.map((r) => r.key),
        keys,
        'one row per key, in input order',
      );
      const statuses = new Set<string>();
      for (const [position, i] of order.entries()) {
        const got = rows[position]!;
        const want =
          op === 'renew'
            ? await renew(db.pool, single[i]!, ME, epochs[i]!, '1 minute')
            : await release(db.pool, single[i]!, ME, epochs[i]!);
        const what = `${combos[i]!.setup} epoch ${String(combos[i]!.choice)}: ${got.status} vs ${want.status}`;
        assert.equal(got.status, want.status, what);
        statuses.add(got.status);
        if (op === 'renew') {
          const expiresAt = (got as BatchRenewed).expiresAt;
          if (got.status === 'ok')
            assert.ok(expiresAt! >= t0 + 60_000_000n && expiresAt! <= t1 + 60_000_000n, what);
          else assert.equal(expiresAt, null, what);
        }
        assert.deepEqual(await shape(batch[i]!), await shape(single[i]!), what);
      }
      // The combinations reach every status, so the comparison covers the precedence (I8).
      assert.deepEqual([...statuses].sort(), ['epoch_mismatch', 'lapsed', 'not_owner', 'ok']);
    });
  }

  test('a batch of one key and a batch of 10000 keys both work; the results follow the input', async () => {
    const keys = Array.from({ length: 10_000 }, (_, i) => uniqueKey(`big-${i}`)).reverse();
    const granted = await acquireMany(db.pool, keys, ME, '1 minute');
    assert.equal(granted.length, 10_000);
    assert.ok(granted.every((row, i) => row.key === keys[i] && row.acquired && row.epoch === 1n));
    const renewed = await renewMany(
      db.pool,
      keys,
      ME,
      keys.map(() => 1n),
      '1 minute',
    );
    assert.ok(renewed.every((row, i) => row.key === keys[i] && row.status === 'ok'));
    const released = await releaseMany(
      db.pool,
      keys,
      ME,
      keys.map(() => 1n),
    );
    assert.ok(released.every((row, i) => row.key === keys[i] && row.status === 'ok'));
    const one = uniqueKey('one');
    assert.deepEqual(
      (await acquireMany(db.pool, [one], ME, '1 minute')).map((r) => [r.acquired, r.epoch]),
      [[true, 1n]],
    );
  });
});

describe('batches read lease.leases by index, whatever its size', () => {
  test('acquire_many, renew_many and release_many of 1000 keys among 40000 rows read no row by a sequential scan', async () => {
    // A database of its own: 40000 rows bring autovacuum, which the other tests' row
    // comparisons (xmin and ctid) must not meet.
    const own = await createTestDatabase();
    try {
      const crowd = Array.from({ length: 39_000 }, (_, i) => `crowd-${i}`);
      for (let i = 0; i < crowd.length; i += 10_000)
        await acquireMany(own.pool, crowd.slice(i, i + 10_000), 'crowd', '1 hour');
      const keys = Array.from({ length: 1_000 }, (_, i) => `indexed-${i}`);
      await acquireMany(own.pool, keys.slice(0, 500), ME, '1 hour');
      await own.pool.query('ANALYZE lease.leases');
      const epochs = keys.map(() => 1n);
      const client = await own.pool.connect();
      try {
        await client.query('BEGIN');
        // Rows this backend read from the table by sequential scans; the counter may carry
        // earlier transactions' reads not yet reported, so only its growth counts.
        const seqRead = async () =>
          Number(
            (
              await client.query<{ n: string }>(
                `SELECT seq_tup_read AS n FROM pg_stat_xact_user_tables
                  WHERE relid = 'lease.leases'::regclass`,
              )
            ).rows[0]!.n,
          );
        const calls: [string, () => Promise<{ acquired?: boolean; status?: string }[]>][] = [
          ['acquire_many', () => acquireMany(client, keys, ME, '1 hour')],
          ['renew_many', () => renewMany(client, keys, ME, epochs, '1 hour')],
          ['release_many', () => releaseMany(client, keys, ME, epochs)],
        ];
        for (const [name, call] of calls) {
          const before = await seqRead();
          const rows = await call();
          assert.ok(rows.every((row) => row.acquired === true || row.status === 'ok'), name);
          assert.equal((await seqRead()) - before, 0, `${name} read rows by a sequential scan`);
        }
        await client.query('COMMIT');
      } finally {
        client.release();
      }
    } finally {
      await own.close();
    }
  });
});

describe('batch input errors are 22023 naming the offending subscripts, and change nothing', () => {
  async function invalid(promise: Promise<unknown>): Promise<string> {
    const error = await pgError(promise);
    assert.equal(error.code, '22023', error.message);
    assert.equal(error.message, 'pg_lease: invalid input');
    return error.detail ?? '';
  }

  test('every violated rule is named, with subscripts, in one DETAIL', async () => {
    const held = uniqueKey('err-held');
    await acquire(db.pool, held, ME, '1 hour');
    const rowsBefore = await allRows(db.pool);
    const detail = await invalid(
      acquireMany(db.pool, [held, held, null, '', 'x'.repeat(1001), 'ok', held], '', '-1 s'),
    );
    assert.equal(
      detail,
      'each key must be a non-empty string: keys[3], keys[4]; ' +
        'each key must be at most 1000 bytes: keys[5]; ' +
        'keys must be distinct: keys[2] repeats keys[1], keys[7] repeats keys[1]; ' +
        'owner must be a non-empty string; ttl must be a positive finite interval',
    );
    assert.deepEqual(await allRows(db.pool), rowsBefore, 'nothing changed');
  });

  test('keys: NULL, empty, two-dimensional, over 10000 elements', async () => {
    assert.equal(await invalid(acquireMany(db.pool, null, ME, '1 s')), 'keys must not be null');
    assert.equal(await invalid(acquireMany(db.pool, [], ME, '1 s')), 'keys must not be empty');
    const twoD = await pgError(
      db.pool.query("SELECT * FROM lease.acquire_many('{{a,b},{c,d}}', 'o', '1 s')"),
    );
    assert.equal(twoD.detail, 'keys must be a one-dimensional array');
    const many = Array.from({ length: 10_001 }, (_, i) => `k${i}`);
    assert.equal(
      await invalid(acquireMany(db.pool, many, ME, '1 s')),
      'keys must have at most 10000 elements, not 10001',
    );
  });

  test('a run of bad elements is listed up to ten, then counted', async () => {
    const keys = Array.from({ length: 15 }, () => '');
    assert.equal(
      await invalid(acquireMany(db.pool, keys, ME, '1 s')),
      'each key must be a non-empty string: ' +
        Array.from({ length: 10 }, (_, i) => `keys[${i + 1}]`).join(', ') +
        ' and 5 more',
    );
  });

  test('subscripts are those of the array as passed, also with another lower bound', async () => {
    const error = await pgError(
      db.pool.query("SELECT * FROM lease.release_many('[0:2]={a,\"\",a}', 'o', '[0:2]={1,2,3}')"),
    );
    assert.equal(
      error.detail,
      'each key must be a non-empty string: keys[1]; keys must be distinct: keys[2] repeats keys[0]',
    );
  });

  test('epochs: NULL, NULL elements, a length other than the keys’', async () => {
    assert.equal(
      await invalid(renewMany(db.pool, ['a', 'b'], ME, null, '1 s')),
      'epochs must not be null',
    );
    assert.equal(
      await invalid(renewMany(db.pool, ['a', 'b'], ME, [1, null], '1 s')),
      'each epoch must not be null: epochs[2]',
    );
    assert.equal(
      await invalid(releaseMany(db.pool, ['a', 'b'], ME, [1, 2, null])),
      'epochs must have as many elements as keys (2, not 3); each epoch must not be null: epochs[3]',
    );
    assert.equal(
      await invalid(renewMany(db.pool, ['a'], null, [1], null)),
      'owner must be a non-empty string; ttl must be a positive finite interval',
    );
  });
  test('skip_locked: NULL is named with the other violations', async () => {
    assert.equal(
      await invalid(renewMany(db.pool, ['a', 'a'], ME, [1, 1], '1 s', null)),
      'keys must be distinct: keys[2] repeats keys[1]; skip_locked must not be null',
    );
    assert.equal(
      await invalid(renewMany(db.pool, ['a'], ME, [1], '1 s', null)),
      'skip_locked must not be null',
    );
  });
});

describe('batches and locks', { concurrency: true }, () => {
  test('two renew_many calls listing the same keys in opposite orders never deadlock', async () => {
    await using iso = await Isolation.open(db.url, ['blocker', 's1', 's2']);
    const { blocker, s1, s2 } = iso.named;
    const keys = ['1', '2', '3'].map((n) => uniqueKey(`order-${n}`));
    const [k1, k2, k3] = keys as [string, string, string];
    const epochs = await Promise.all(
      keys.map(async (key) => (await acquire(db.pool, key, ME, '1 hour')).epoch!),
    );
    // The blocker holds the middle key, so each batch stops on it after locking what comes
    // before it in its own order: in input order s1 would hold k3 and s2 k1, and deadlock.
    await blocker.query('BEGIN');
    await blocker.run(renewCall(k2, ME, epochs[1]!, '1 hour'));
    await s1.query('BEGIN');
    const first = s1.start(renewManyText(), [
      [k3, k2, k1],
      ME,
      [epochs[2], epochs[1], epochs[0]].map(String),
      '1 hour',
    ]);
    await iso.untilBlocked(first, blocker);
    await s2.query('BEGIN');
    const second = s2.start(renewManyText(), [[k1, k2, k3], ME, epochs.map(String), '1 hour']);
    // In key order s1 already holds k1, so s2 waits for s1, not for the blocker.
    await iso.untilBlocked(second, s1);
    await blocker.query('COMMIT');
    const firstRows = parseRenewed((await first.result()).rows);
    assert.deepEqual(
      firstRows.map((r) => r.status),
      ['ok', 'ok', 'ok'],
    );
    await s1.query('COMMIT');
    const secondRows = parseRenewed((await second.result()).rows);
    assert.deepEqual(
      secondRows.map((r) => r.status),
      ['ok', 'ok', 'ok'],
    );
    await s2.query('COMMIT');
  });

  test('renew_many and release_many listing the same keys in opposite orders never deadlock', async () => {
    await using iso = await Isolation.open(db.url, ['blocker', 's1', 's2']);
    const { blocker, s1, s2 } = iso.named;
    const keys = ['1', '2', '3'].map((n) => uniqueKey(`rel-order-${n}`));
    const [k1, k2, k3] = keys as [string, string, string];
    const epochs = await Promise.all(
      keys.map(async (key) => (await acquire(db.pool, key, ME, '1 hour')).epoch!),
    );
    await blocker.query('BEGIN');
    await blocker.run(renewCall(k2, ME, epochs[1]!, '2 hours'));
    await s1.query('BEGIN');
    const first = s1.start(renewManyText(), [
      [k3, k2, k1],
      ME,
      [epochs[2], epochs[1], epochs[0]].map(String),
      '3 hours',
    ]);
    await iso.untilBlocked(first, blocker);
    await s2.query('BEGIN');
    const second = s2.start('SELECT key, status FROM lease.release_many($1, $2, $3)', [
      [k1, k2, k3],
      ME,
      epochs.map(String),
    ]);
    // In key order s1 already holds k1, so the release waits for s1, not for the blocker.
    await iso.untilBlocked(second, s1);
    await blocker.query('COMMIT');
    assert.deepEqual(
      parseRenewed((await first.result()).rows).map((r) => [r.key, r.status]),
      [
        [k3, 'ok'],
        [k2, 'ok'],
        [k1, 'ok'],
      ],
    );
    await s1.query('COMMIT');
    assert.deepEqual(
      (await second.result()).rows.map((r) => [r.key, r.status]),
      [
        [k1, 'ok'],
        [k2, 'ok'],
        [k3, 'ok'],
      ],
    );
    await s2.query('COMMIT');
    for (const key of keys) assert.equal((await storedRow(db.pool, key))!.owner, null, key);
  });

  test('two acquire_many calls in opposite orders never deadlock; the first wins every key', async () => {
    await using iso = await Isolation.open(db.url, ['blocker', 's1', 's2']);
    const { blocker, s1, s2 } = iso.named;
    const keys = ['1', '2', '3'].map((n) => uniqueKey(`acq-order-${n}`));
    const [k1, k2, k3] = keys as [string, string, string];
    for (const key of keys) {
      const granted = await acquire(db.pool, key, 'setup', '1 hour');
      await release(db.pool, key, 'setup', granted.epoch);
    }
    await blocker.query('BEGIN');
    assert.equal((await blocker.run(acquireCall(k2, 'blocker', '1 hour'))).acquired, true);
    await s1.query('BEGIN');
    const first = s1.start(
      'SELECT key, acquired, epoch::text AS epoch FROM lease.acquire_many($1, $2, $3)',
      [[k3, k2, k1], 's1', '1 hour'],
    );
    await iso.untilBlocked(first, blocker);
    await s2.query('BEGIN');
    const second = s2.start(
      'SELECT key, acquired, epoch::text AS epoch FROM lease.acquire_many($1, $2, $3)',
      [[k1, k2, k3], 's2', '1 hour'],
    );
    await iso.untilBlocked(second, s1);
    await blocker.query('ROLLBACK');
    assert.deepEqual(
      (await first.result()).rows.map((r) => r.acquired),
      [true, true, true],
    );
    await s1.query('COMMIT');
    assert.deepEqual(
      (await second.result()).rows.map((r) => r.acquired),
      [false, false, false],
    );
    await s2.query('COMMIT');
  });

  test('a key acquire_many denies takes no lock: the holder renews and releases while the batch’s transaction stays open', async () => {
    await using iso = await Isolation.open(db.url, ['holder', 'denied']);
    const { holder, denied } = iso.named;
    const held = uniqueKey('denied-held');
    const free = uniqueKey('denied-free');
    const { epoch } = await acquire(db.pool, held, OTHER, '1 hour');
    await denied.query('BEGIN');
    const rows = await acquireMany(denied, [held, free], ME, '1 hour');
    assert.deepEqual(
      rows.map((r) => r.acquired),
      [false, true],
    );
    // Would be reported blocked (StepBlockedError) had the batch kept a lock on `held`.
    assert.equal((await holder.run(renewCall(held, OTHER, epoch, '2 hours'))).status, 'ok');
    assert.equal((await release(holder, held, OTHER, epoch)).status, 'ok');
    await denied.query('COMMIT');
  });

  test('a key acquire_many loses in a race takes no lock either (the batch falls back to single calls)', async () => {
    await using iso = await Isolation.open(db.url, ['winner', 'batch']);
    const { winner, batch } = iso.named;
    const raced = uniqueKey('raced');
    const other = uniqueKey('raced-other');
    const granted = await acquire(db.pool, raced, 'setup', '1 hour');
    await release(db.pool, raced, 'setup', granted.epoch);
    await winner.query('BEGIN');
    const won = await winner.run(acquireCall(raced, OTHER, '1 hour'));
    assert.equal(won.acquired, true);
    await batch.query('BEGIN');
    // The batch saw the key free and waits on the winner's uncommitted grant.
    const step = batch.start(
      'SELECT key, acquired FROM lease.acquire_many($1, $2, $3)',
      [[other, raced], ME, '1 hour'],
    );
    await iso.untilBlocked(step, winner);
    await winner.query('COMMIT');
    assert.deepEqual(
      (await step.result()).rows.map((r) => [r.key, r.acquired]),
      [
        [other, true],
        [raced, false],
      ],
    );
    // The batch's transaction stays open; the winner's renew and release must not wait for it.
    assert.equal((await winner.run(renewCall(raced, OTHER, won.epoch, '2 hours'))).status, 'ok');
    assert.equal((await release(winner, raced, OTHER, won.epoch)).status, 'ok');
    await batch.query('COMMIT');
    assert.equal((await storedRow(db.pool, other))!.owner, ME);
  });

  test('acquire_many waiting on a single grant that rolls back gets that key too, with the epoch the grant had', async () => {
    await using iso = await Isolation.open(db.url, ['single', 'batch']);
    const { single, batch } = iso.named;
    const keys = ['c', 'b', 'a'].map((n) => uniqueKey(`batch-vs-rollback-${n}`));
    for (const key of keys) {
      const granted = await acquire(db.pool, key, 'setup', '1 hour');
      await release(db.pool, key, 'setup', granted.epoch);
    }
    const raced = keys[1]!;
    await single.query('BEGIN');
    assert.equal((await single.run(acquireCall(raced, OTHER, '1 hour'))).epoch, 3n);
    await batch.query('BEGIN');
    const step = batch.start(
      'SELECT key, acquired, epoch::text AS epoch FROM lease.acquire_many($1, $2, $3)',
      [keys, ME, '1 hour'],
    );
    await iso.untilBlocked(step, single);
    await single.query('ROLLBACK');
    assert.deepEqual(
      (await step.result()).rows.map((r) => [r.key, r.acquired, r.epoch]),
      keys.map((key) => [key, true, '3']),
    );
    await batch.query('COMMIT');
    assert.equal((await storedRow(db.pool, raced))!.owner, ME);
  });

  test('a single acquire waiting on an uncommitted acquire_many is denied once the batch commits', async () => {
    await using iso = await Isolation.open(db.url, ['single', 'batch']);
    const { single, batch } = iso.named;
    const keys = ['c', 'b', 'a'].map((n) => uniqueKey(`single-vs-batch-${n}`));
    for (const key of keys) {
      const granted = await acquire(db.pool, key, 'setup', '1 hour');
      await release(db.pool, key, 'setup', granted.epoch);
    }
    await batch.query('BEGIN');
    const rows = await acquireMany(batch, keys, ME, '1 hour');
    assert.deepEqual(
      rows.map((r) => [r.key, r.acquired, r.epoch]),
      keys.map((key) => [key, true, 3n]),
    );
    await single.query('BEGIN');
    const step = single.start(acquireCall(keys[1]!, OTHER, '1 hour'));
    await iso.untilBlocked(step, batch);
    await batch.query('COMMIT');
    assert.deepEqual(await step.result(), { acquired: false, epoch: null, expiresAt: null });
    await single.query('COMMIT');
    assert.equal((await storedRow(db.pool, keys[1]!))!.owner, ME);
  });

  test('a single acquire meeting an uncommitted release_many of its key is denied at once', async () => {
    await using iso = await Isolation.open(db.url, ['single', 'batch']);
    const { single, batch } = iso.named;
    const keys = ['y', 'x'].map((n) => uniqueKey(`single-vs-release-many-${n}`));
    const epochs = await Promise.all(
      keys.map(async (key) => (await acquire(db.pool, key, OTHER, '1 hour')).epoch!),
    );
    await batch.query('BEGIN');
    const { rows } = await batch.query('SELECT key, status FROM lease.release_many($1, $2, $3)', [
      keys,
      OTHER,
      epochs.map(String),
    ]);
    assert.deepEqual(
      rows.map((r) => [r.key, r.status]),
      keys.map((key) => [key, 'ok']),
    );
    await single.query('BEGIN');
    // run() fails with StepBlockedError if the acquire waits for the releasing batch.
    assert.deepEqual(await single.run(acquireCall(keys[0]!, ME, '1 hour')), {
      acquired: false,
      epoch: null,
      expiresAt: null,
    });
    await batch.query('COMMIT');
    await single.query('COMMIT');
    assert.equal((await storedRow(db.pool, keys[0]!))!.owner, null);
  });

  for (const op of ['renew_many', 'release_many'] as const) {
    test(`${op} reports lapsed when the grant expired while it waited for the row lock`, async () => {
      await using iso = await Isolation.open(db.url, ['locker', 'batch']);
      const { locker, batch } = iso.named;
      const key = uniqueKey(`lock-wait-${op}`);
      const { epoch } = await acquire(db.pool, key, ME, '1 hour');
      // Another session of the same owner shortens the grant and keeps the row locked.
      await locker.query('BEGIN');
      const short = await locker.run(renewCall(key, ME, epoch, '1 second'));
      assert.equal(short.status, 'ok');
      const step =
        op === 'renew_many'
          ? batch.start(renewManyText(), [[key], ME, [String(epoch)], '1 hour'])
          : batch.start('SELECT key, status FROM lease.release_many($1, $2, $3)', [
              [key],
              ME,
              [String(epoch)],
            ]);
      await iso.untilBlocked(step, locker);
      await sleepPast(db.pool, short.expiresAt);
      await locker.query('COMMIT');
      // The row it waited for was live when the batch began, and lapsed before it got the lock.
      assert.equal((await step.result()).rows[0].status, 'lapsed');
      const row = await storedRow(db.pool, key);
      assert.equal(row!.expiresAt, String(short.expiresAt), 'nothing written');
    });
  }
});

describe('renew_many with p_skip_locked => true (§12)', { concurrency: true }, () => {
  /** Keys of ME, each granted for an hour, and their epochs. */
  async function granted(label: string, n: number): Promise<{ keys: string[]; epochs: bigint[] }> {
    const keys = Array.from({ length: n }, (_, i) => uniqueKey(`${label}-${i}`));
    const epochs = await Promise.all(
      keys.map(async (key) => (await acquire(db.pool, key, ME, '1 hour')).epoch!),
    );
    return { keys, epochs };
  }

  const args = (keys: string[], epochs: bigint[], ttl: string) => [
    keys,
    ME,
    epochs.map(String),
    ttl,
  ];

  test('a key whose row a fenced transaction holds is answered locked at once; the others are renewed', async () => {
    await using iso = await Isolation.open(db.url, ['fenced', 'batch']);
    const { fenced, batch } = iso.named;
    const { keys, epochs } = await granted('skip', 3);
    const [k1, k2, k3] = keys as [string, string, string];
    await fenced.query('BEGIN');
    await fenced.run(fenceCall(k2, epochs[1]!));
    const before = await storedRow(db.pool, k2);
    const t0 = await serverNow(db.pool);
    // query() fails if the statement stays blocked on a lock past its grace.
    const rows = parseRenewed(
      (await batch.query(renewManyText(true), [...args([k3, k2, k1], [epochs[2]!, epochs[1]!, epochs[0]!], '2 hours'), true])).rows,
    );
    const t1 = await serverNow(db.pool);
    const twoHours = 7_200_000_000n;
    assert.deepEqual(
      rows.map((r) => [r.key, r.status]),
      [
        [k3, 'ok'],
        [k2, 'locked'],
        [k1, 'ok'],
      ],
    );
    assert.equal(rows[1]!.expiresAt, null);
    for (const row of [rows[0]!, rows[2]!]) {
      assert.ok(row.expiresAt! >= t0 + twoHours && row.expiresAt! <= t1 + twoHours);
      assert.equal(String(row.expiresAt), (await storedRow(db.pool, row.key))!.expiresAt);
    }
    assert.deepEqual(await storedRow(db.pool, k2), before, 'the locked key is unchanged');
    await fenced.query('COMMIT');
  });

  test('a locked row that is not the caller’s live grant gets renew’s refusal at once, not locked', async () => {
    await using iso = await Isolation.open(db.url, ['locker', 'batch']);
    const { locker, batch } = iso.named;
    const theirs = uniqueKey('skip-theirs');
    const lapsed = uniqueKey('skip-lapsed');
    const mine = uniqueKey('skip-mine');
    const t = await acquire(db.pool, theirs, OTHER, '1 hour');
    const l = await acquire(db.pool, lapsed, ME, '300 milliseconds');
    const m = await acquire(db.pool, mine, ME, '1 hour');
    await sleepPast(db.pool, l.expiresAt);
    // Another transaction holds all three rows; renew would wait only for the live grant.
    await locker.query('BEGIN');
    await locker.query('SELECT 1 FROM lease.leases WHERE key = ANY($1) FOR UPDATE', [
      [theirs, lapsed, mine],
    ]);
    const rows = parseRenewed(
      (
        await batch.query(renewManyText(true), [
          [theirs, lapsed, mine, uniqueKey('skip-never')],
          ME,
          [t.epoch, l.epoch, m.epoch, 1n].map(String),
          '1 hour',
          true,
        ])
      ).rows,
    );
    assert.deepEqual(
      rows.map((r) => r.status),
      ['not_owner', 'lapsed', 'locked', 'not_owner'],
    );
    await locker.query('COMMIT');
  });

  test('a locked or refused key keeps no lock in the batch’s transaction', async () => {
    await using iso = await Isolation.open(db.url, ['fenced', 'batch', 'holder']);
    const { fenced, batch, holder } = iso.named;
    const { keys, epochs } = await granted('skip-nolock', 3);
    const [k1, k2, k3] = keys as [string, string, string];
    await fenced.query('BEGIN');
    await fenced.run(fenceCall(k1, epochs[0]!));
    await batch.query('BEGIN');
    const rows = parseRenewed(
      (await batch.query(renewManyText(true), [...args([k1, k2, k3], [epochs[0]!, epochs[1]! + 1n, epochs[2]!], '1 hour'), true])).rows,
    );
    assert.deepEqual(
      rows.map((r) => r.status),
      ['locked', 'epoch_mismatch', 'ok'],
    );
    await fenced.query('COMMIT');
    // The batch's transaction is still open: the holder's own renewals of the keys it did not
    // renew go through, the renewed one waits for it.
    await holder.run(renewCall(k1, ME, epochs[0]!, '1 hour'));
    await holder.run(renewCall(k2, ME, epochs[1]!, '1 hour'));
    const waits = holder.start(renewCall(k3, ME, epochs[2]!, '1 hour'));
    await iso.untilBlocked(waits, batch);
    await batch.query('COMMIT');
    assert.equal((await waits.result()).status, 'ok');
  });

  test('without p_skip_locked, or with false, renew_many still waits for the locked row', async () => {
    await using iso = await Isolation.open(db.url, ['fenced', 'four', 'five']);
    const { fenced, four, five } = iso.named;
    // Keys of their own for each, so that neither waits for the other's lock.
    const a = await granted('skip-wait-four', 2);
    const b = await granted('skip-wait-five', 2);
    await fenced.query('BEGIN');
    await fenced.run(fenceCall(a.keys[1]!, a.epochs[1]!));
    await fenced.run(fenceCall(b.keys[1]!, b.epochs[1]!));
    const waiting = [
      four.start(renewManyText(), args(a.keys, a.epochs, '1 hour')),
      five.start(renewManyText(true), [...args(b.keys, b.epochs, '1 hour'), false]),
    ];
    for (const step of waiting) await iso.untilBlocked(step, fenced);
    const { rows } = await db.pool.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM pg_stat_activity
        WHERE pid = ANY($1) AND wait_event_type = 'Lock'`,
      [[four.pid, five.pid]],
    );
    assert.equal(rows[0]!.n, 2, 'both wait on a lock');
    await fenced.query('COMMIT');
    for (const step of waiting)
      assert.deepEqual(
        parseRenewed((await step.result()).rows).map((r) => r.status),
        ['ok', 'ok'],
      );
  });

  test('under REPEATABLE READ it answers as renew_many does for keys no one has locked', async () => {
    // Per variant, fresh keys in the same states: mine and unchanged; another owner's at the
    // snapshot, released since (locking that row version would be a serialization failure,
    // where renew answers from the snapshot); mine and renewed by another session since; never
    // granted.
    async function answers(skipLocked: boolean): Promise<string[]> {
      const mine = uniqueKey('rr-skip-mine');
      const theirs = uniqueKey('rr-skip-theirs');
      const renewedSince = uniqueKey('rr-skip-renewed');
      const never = uniqueKey('rr-skip-never');
      const m = await acquire(db.pool, mine, ME, '1 hour');
      const t = await acquire(db.pool, theirs, OTHER, '1 hour');
      const r = await acquire(db.pool, renewedSince, ME, '1 hour');
      const rr = new pg.Client({ connectionString: db.url });
      await rr.connect();
      try {
        await rr.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
        await rr.query('SELECT count(*) FROM lease.inspect($1)', [mine]); // takes the snapshot
        await release(db.pool, theirs, OTHER, t.epoch);
        await renew(db.pool, renewedSince, ME, r.epoch, '2 hours');
        const outcome = (keys: string[], epochs: bigint[]) =>
          renewMany(rr, keys, ME, epochs, '1 hour', skipLocked).then(
            (rows) => rows.map((row) => row.status),
            (error: pg.DatabaseError) => [error.code!],
          );
        const first = await outcome([mine, theirs, never], [m.epoch!, t.epoch!, 1n]);
        await rr.query('ROLLBACK');
        await rr.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
        await rr.query('SELECT count(*) FROM lease.inspect($1)', [mine]);
        await renew(db.pool, renewedSince, ME, r.epoch, '2 hours');
        const second = await outcome([renewedSince], [r.epoch!]);
        return [...first, ...second];
      } finally {
        await rr.query('ROLLBACK').catch(() => undefined);
        await rr.end();
      }
    }
    const without = await answers(false);
    assert.deepEqual(without, ['ok', 'not_owner', 'not_owner', '40001']);
    assert.deepEqual(await answers(true), without);
  });
});

describe('batches under REPEATABLE READ', { concurrency: true }, () => {
  async function staleSnapshot(
    setup: (key: string, epoch: bigint) => Promise<void>,
  ): Promise<{ rr: pg.Client; key: string; epoch: bigint; close: () => Promise<void> }> {
    const key = uniqueKey('rr');
    const { epoch } = await acquire(db.pool, key, ME, '1 hour');
    const rr = new pg.Client({ connectionString: db.url });
    await rr.connect();
    await rr.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
    await rr.query('SELECT count(*) FROM lease.inspect($1)', [key]); // takes the snapshot
    await setup(key, epoch!);
    return { rr, key, epoch: epoch!, close: () => rr.end() };
  }

  test('acquire_many does not confirm a same-owner grant that was released and taken since the snapshot', async () => {
    const { rr, key, close } = await staleSnapshot(async (key, epoch) => {
      await release(db.pool, key, ME, epoch);
      await acquire(db.pool, key, OTHER, '1 hour');
    });
    try {
      const outcome = await acquireMany(rr, [key], ME, '1 hour').then(
        (rows) => rows[0]!,
        (error: pg.DatabaseError) => error.code,
      );
      // Either a serialization failure or a denial; never (true, old epoch).
      assert.ok(
        outcome === '40001' || (typeof outcome === 'object' && !outcome.acquired),
        `got ${JSON.stringify(outcome, replacer)}`,
      );
    } finally {
      await rr.query('ROLLBACK').catch(() => undefined);
      await close();
    }
    assert.equal((await storedRow(db.pool, key))!.owner, OTHER);
  });

  test('renew_many does not renew a grant released since the snapshot', async () => {
    const { rr, key, epoch, close } = await staleSnapshot(async (key, epoch) => {
      await release(db.pool, key, ME, epoch);
    });
    try {
      const outcome = await renewMany(rr, [key], ME, [epoch], '1 hour').then(
        (rows) => rows[0]!.status,
        (error: pg.DatabaseError) => error.code,
      );
      assert.ok(outcome === '40001' || outcome === 'not_owner', `got ${outcome}`);
    } finally {
      await rr.query('ROLLBACK').catch(() => undefined);
      await close();
    }
  });

  test('acquire_many under REPEATABLE READ does not confirm a same-owner grant that lapsed while it waited for the row', async () => {
    await using iso = await Isolation.open(db.url, ['locker', 'rr']);
    const { locker, rr } = iso.named;
    const key = uniqueKey('rr-lapse');
    const granted = await acquire(db.pool, key, ME, '1 second');
    // Another transaction keeps the row locked without changing it.
    await locker.query('BEGIN');
    await locker.query('SELECT 1 FROM lease.leases WHERE key = $1 FOR UPDATE', [key]);
    await rr.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
    const step = rr.start(
      'SELECT acquired, epoch::text AS epoch FROM lease.acquire_many($1, $2, $3)',
      [[key], ME, '1 hour'],
    );
    await iso.untilBlocked(step, locker);
    await sleepPast(db.pool, granted.expiresAt);
    await locker.query('COMMIT');
    const error = await step.error();
    assert.equal(error.code, '40001', error.message);
    await rr.query('ROLLBACK');
  });

  test('under REPEATABLE READ an unchanged same-owner grant is confirmed and new keys are granted', async () => {
    const mine = uniqueKey('rr-mine');
    const fresh = uniqueKey('rr-fresh');
    const granted = await acquire(db.pool, mine, ME, '1 hour');
    const rr = new pg.Client({ connectionString: db.url });
    await rr.connect();
    try {
      await rr.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
      const rows = await acquireMany(rr, [mine, fresh], ME, '1 hour');
      assert.deepEqual(
        rows.map((r) => [r.acquired, r.epoch]),
        [
          [true, granted.epoch],
          [true, 1n],
        ],
      );
      assert.equal(rows[0]!.expiresAt, granted.expiresAt);
      await rr.query('COMMIT');
    } finally {
      await rr.end();
    }
  });
});

function replacer(_key: string, value: unknown): unknown {
  return typeof value === 'bigint' ? value.toString() : value;
}

describe('batches and purge (§4 purge)', () => {
  test('acquire_many grants a purged key an epoch above every epoch it had, as acquire does', async () => {
    const batchKey = uniqueKey('purged-batch');
    const singleKey = uniqueKey('purged-single');
    for (const key of [batchKey, singleKey]) {
      const granted = await acquire(db.pool, key, ME, '1 hour');
      await release(db.pool, key, ME, granted.epoch);
    }
    await db.pool.query("SELECT lease.purge(interval '0 seconds')");
    assert.equal(await storedRow(db.pool, batchKey), undefined, 'purged');
    const [batch] = await acquireMany(db.pool, [batchKey], ME, '1 hour');
    const single = await acquire(db.pool, singleKey, ME, '1 hour');
    assert.ok(batch!.epoch! > 2n, `epoch ${batch!.epoch} above the purged watermark 2`);
    assert.equal(batch!.epoch, single.epoch);
  });

  test('release_many records the release, so purge takes the released keys', async () => {
    const keys = [uniqueKey('rel-purge'), uniqueKey('rel-purge')];
    const granted = await acquireMany(db.pool, keys, ME, '1 hour');
    assert.deepEqual(
      (
        await releaseMany(
          db.pool,
          keys,
          ME,
          granted.map((g) => g.epoch),
        )
      ).map((r) => r.status),
      ['ok', 'ok'],
    );
    await db.pool.query("SELECT lease.purge(interval '0 seconds')");
    for (const key of keys) assert.equal(await storedRow(db.pool, key), undefined);
  });
});
