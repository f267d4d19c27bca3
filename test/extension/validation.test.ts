/**
 * SEMANTICS.md §3 and I9: every invalid input of every function raises SQLSTATE 22023 with a
 * message starting `pg_lease: invalid input` and a DETAIL naming every violated constraint,
 * joined by "; ", and nothing changes. The phrases are the ones the install script uses.
 *
 * The tests in this file run one after another: each compares the whole lease table before
 * and after its call.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { acquire, allRows, inspect, release, renew, serverVersionNum } from '../support/lease-calls.js';
import { uniqueKey } from '../support/helpers.js';

/** The DETAIL phrase for each constraint, as worded by extension/src. */
const PHRASE = {
  keyEmpty: 'key must be a non-empty string',
  keyLong: 'key must be at most 1000 bytes',
  ownerEmpty: 'owner must be a non-empty string',
  ownerLong: 'owner must be at most 1000 bytes',
  epoch: 'epoch must not be null',
  ttl: 'ttl must be a positive finite interval',
  wait: 'wait must be a non-negative finite interval',
} as const;
type Violation = keyof typeof PHRASE;

const LIMIT = 1000;
const asciiOf = (bytes: number) => 'k'.repeat(bytes);
/** 1001 bytes in 501 characters: a limit counted in characters would let it through. */
const twoByte1001 = 'é'.repeat(500) + 'k';
/** 1001 bytes in 251 characters. */
const fourByte1001 = '😀'.repeat(250) + 'k';
/** Far over the btree tuple limit and incompressible, so a missing check would hit btree/TOAST. */
const huge = randomBytes(60_000).toString('base64');

let db: TestDatabase;
/** A key held by worker-a, so that a call slipping past validation would visibly change it. */
let heldKey: string;
let heldEpoch: bigint;
let infiniteIntervals = false;

before(async () => {
  db = await createTestDatabase();
  heldKey = uniqueKey('validation-held');
  const granted = await acquire(db.pool, heldKey, 'worker-a', '10 minutes');
  heldEpoch = granted.epoch!;
  infiniteIntervals = (await serverVersionNum(db.pool)) >= 170000;
});
after(() => db.close());

/** Runs an invalid call and checks the error and that the lease table is unchanged. */
async function expectInvalid(call: () => Promise<unknown>, violations: Violation[]): Promise<void> {
  const before = await allRows(db.pool);
  let error: unknown;
  try {
    await call();
  } catch (caught) {
    error = caught;
  }
  assert.ok(error instanceof pg.DatabaseError, `expected a 22023 error, got ${String(error)}`);
  assert.equal(error.code, '22023', `${error.code}: ${error.message}`);
  assert.ok(
    error.message.startsWith('pg_lease: invalid input'),
    `message "${error.message}" must start with "pg_lease: invalid input"`,
  );
  const named = (error.detail ?? '').split('; ');
  assert.deepEqual(
    [...named].sort(),
    violations.map((violation) => PHRASE[violation]).sort(),
    `DETAIL "${error.detail}" must name exactly the violated constraints`,
  );
  assert.deepEqual(await allRows(db.pool), before, 'invalid input must change nothing');
}

/**
 * Before PostgreSQL 17 an interval cannot be infinite: the literal fails to parse with 22007
 * before pg_lease is reached, so there is nothing for the extension to reject.
 */
async function expectUnparsable(call: () => Promise<unknown>): Promise<void> {
  const before = await allRows(db.pool);
  const error = await call().then(
    () => undefined,
    (caught: unknown) => caught,
  );
  assert.ok(error instanceof pg.DatabaseError, `expected a 22007 error, got ${String(error)}`);
  assert.equal(error.code, '22007', `${error.code}: ${error.message}`);
  assert.deepEqual(await allRows(db.pool), before, 'a failed call must change nothing');
}

interface Case {
  name: string;
  key?: string | null;
  owner?: string | null;
  ttl?: string | null;
  wait?: string | null;
  epoch?: bigint | null;
  violations: Violation[];
  /** Only on servers that know infinite intervals (PostgreSQL 17+). */
  infinite?: boolean;
}

const keyCases: Case[] = [
  { name: 'a NULL key', key: null, violations: ['keyEmpty'] },
  { name: "an empty key ''", key: '', violations: ['keyEmpty'] },
  { name: 'a key of 1001 ASCII bytes', key: asciiOf(LIMIT + 1), violations: ['keyLong'] },
  { name: 'a key of 1001 bytes in 501 characters', key: twoByte1001, violations: ['keyLong'] },
  { name: 'a key of 1001 bytes in 251 characters', key: fourByte1001, violations: ['keyLong'] },
  { name: 'an incompressible 80 kB key', key: huge, violations: ['keyLong'] },
];

const ownerCases: Case[] = [
  { name: 'a NULL owner', owner: null, violations: ['ownerEmpty'] },
  { name: "an empty owner ''", owner: '', violations: ['ownerEmpty'] },
  { name: 'an owner of 1001 ASCII bytes', owner: asciiOf(LIMIT + 1), violations: ['ownerLong'] },
  { name: 'an owner of 1001 bytes in 501 characters', owner: twoByte1001, violations: ['ownerLong'] },
  { name: 'an owner of 1001 bytes in 251 characters', owner: fourByte1001, violations: ['ownerLong'] },
  { name: 'an incompressible 80 kB owner', owner: huge, violations: ['ownerLong'] },
];

const ttlCases: Case[] = [
  { name: 'a NULL ttl', ttl: null, violations: ['ttl'] },
  { name: 'a zero ttl', ttl: '0', violations: ['ttl'] },
  { name: "a zero ttl written '0 days 0 seconds'", ttl: '0 days 0 seconds', violations: ['ttl'] },
  { name: "a ttl of '1 day -24 hours' (equal to zero)", ttl: '1 day -24 hours', violations: ['ttl'] },
  { name: 'a negative ttl', ttl: '-1 second', violations: ['ttl'] },
  { name: 'a negative ttl of one microsecond', ttl: '-1 microsecond', violations: ['ttl'] },
  { name: 'a negative ttl of days', ttl: '-3 days', violations: ['ttl'] },
  {
    name: "a ttl of '1 mon -30 days 5 minutes' (above zero, months and days cancel out)",
    ttl: '1 mon -30 days 5 minutes',
    violations: ['ttl'],
  },
  { name: "an infinite ttl 'infinity'", ttl: 'infinity', violations: ['ttl'], infinite: true },
  { name: "an infinite ttl '-infinity'", ttl: '-infinity', violations: ['ttl'], infinite: true },
];

const waitCases: Case[] = [
  { name: 'a NULL wait', wait: null, violations: ['wait'] },
  { name: 'a negative wait', wait: '-1 second', violations: ['wait'] },
  { name: 'a negative wait of one microsecond', wait: '-1 microsecond', violations: ['wait'] },
  { name: "a wait of '1 mon -30 days' (equal to zero)", wait: '1 mon -30 days', violations: ['wait'] },
  { name: "a wait of '1 day -24 hours' (equal to zero)", wait: '1 day -24 hours', violations: ['wait'] },
  { name: "an infinite wait 'infinity'", wait: 'infinity', violations: ['wait'], infinite: true },
  { name: "an infinite wait '-infinity'", wait: '-infinity', violations: ['wait'], infinite: true },
];

function caseTest(
  operation: string,
  testCase: Case,
  call: (testCase: Case) => Promise<unknown>,
): void {
  const list = testCase.violations.map((violation) => PHRASE[violation]).join('; ');
  const title = testCase.infinite
    ? `${operation} with ${testCase.name} raises 22023 naming "${list}" (before PostgreSQL 17: the value does not parse, 22007)`
    : `${operation} with ${testCase.name} raises 22023 naming "${list}"`;
  test(title, async () => {
    if (testCase.infinite && !infiniteIntervals) {
      await expectUnparsable(() => call(testCase));
      return;
    }
    await expectInvalid(() => call(testCase), testCase.violations);
  });
}

const pick = <T>(value: T | undefined, fallback: T): T => (value === undefined ? fallback : value);

describe('acquire validation', () => {
  const call = (c: Case) =>
    acquire(
      db.pool,
      pick(c.key, heldKey),
      pick(c.owner, 'worker-b'),
      pick(c.ttl, '1 minute'),
      pick(c.wait, '0'),
    );
  for (const testCase of [...keyCases, ...ownerCases, ...ttlCases, ...waitCases])
    caseTest('acquire', testCase, call);

  test('acquire by the holder with an invalid ttl does not return or touch its grant', async () => {
    await expectInvalid(() => acquire(db.pool, heldKey, 'worker-a', '0', '0'), ['ttl']);
  });

  caseTest(
    'acquire',
    {
      name: 'every argument invalid',
      key: null,
      owner: '',
      ttl: '0',
      wait: '-1 second',
      violations: ['keyEmpty', 'ownerEmpty', 'ttl', 'wait'],
    },
    call,
  );
  caseTest(
    'acquire',
    {
      name: 'an over-long key and owner and NULL intervals',
      key: twoByte1001,
      owner: asciiOf(LIMIT + 1),
      ttl: null,
      wait: null,
      violations: ['keyLong', 'ownerLong', 'ttl', 'wait'],
    },
    call,
  );
  caseTest(
    'acquire',
    { name: 'an empty key and a negative ttl', key: '', ttl: '-5 minutes', violations: ['keyEmpty', 'ttl'] },
    call,
  );
});

/**
 * acquire checks key and owner only once its guarded UPDATE grants nothing; a granting UPDATE
 * proves them valid through the table's domains and its own test of a NULL owner (which a domain
 * lets through, and which the table no longer refuses by itself). So an invalid owner must be refused
 * alike whether the key is free, lapsed or never granted, and renew and release likewise on a
 * key whose row would otherwise match.
 */
describe('invalid key, owner or epoch on a key in every state', () => {
  const states = {
    free: async (key: string) => {
      const granted = await acquire(db.pool, key, 'worker-a', '1 minute');
      await release(db.pool, key, 'worker-a', granted.epoch!);
    },
    lapsed: async (key: string) => {
      await acquire(db.pool, key, 'worker-a', '1 microsecond');
    },
    'never granted': async () => {},
  };
  for (const [state, prepare] of Object.entries(states))
    for (const testCase of ownerCases)
      test(`acquire of a ${state} key with ${testCase.name} raises 22023 and changes nothing`, async () => {
        const key = uniqueKey(`owner-${state}`);
        await prepare(key);
        await expectInvalid(
          () => acquire(db.pool, key, testCase.owner ?? null, '1 minute'),
          testCase.violations,
        );
      });
  test('renew and release of the holder with a NULL epoch raise 22023 and change nothing', async () => {
    const key = uniqueKey('held-null-epoch');
    await acquire(db.pool, key, 'worker-a', '1 minute');
    await expectInvalid(() => renew(db.pool, key, 'worker-a', null, '1 minute'), ['epoch']);
    await expectInvalid(() => release(db.pool, key, 'worker-a', null), ['epoch']);
  });
});

describe('renew validation', () => {
  const call = (c: Case) =>
    renew(
      db.pool,
      pick(c.key, heldKey),
      pick(c.owner, 'worker-a'),
      pick(c.epoch, heldEpoch),
      pick(c.ttl, '1 minute'),
    );
  for (const testCase of [...keyCases, ...ownerCases, ...ttlCases])
    caseTest('renew', testCase, call);
  caseTest('renew', { name: 'a NULL epoch', epoch: null, violations: ['epoch'] }, call);
  caseTest(
    'renew',
    {
      name: 'every argument NULL',
      key: null,
      owner: null,
      epoch: null,
      ttl: null,
      violations: ['keyEmpty', 'ownerEmpty', 'epoch', 'ttl'],
    },
    call,
  );
  caseTest(
    'renew',
    {
      name: 'an over-long owner, a NULL epoch and a zero ttl',
      owner: fourByte1001,
      epoch: null,
      ttl: '0',
      violations: ['ownerLong', 'epoch', 'ttl'],
    },
    call,
  );
});

describe('release validation', () => {
  const call = (c: Case) =>
    release(db.pool, pick(c.key, heldKey), pick(c.owner, 'worker-a'), pick(c.epoch, heldEpoch));
  for (const testCase of [...keyCases, ...ownerCases]) caseTest('release', testCase, call);
  caseTest('release', { name: 'a NULL epoch', epoch: null, violations: ['epoch'] }, call);
  caseTest(
    'release',
    {
      name: 'every argument NULL',
      key: null,
      owner: null,
      epoch: null,
      violations: ['keyEmpty', 'ownerEmpty', 'epoch'],
    },
    call,
  );
  caseTest(
    'release',
    {
      name: "an over-long key, an empty owner and a NULL epoch",
      key: asciiOf(LIMIT + 1),
      owner: '',
      epoch: null,
      violations: ['keyLong', 'ownerEmpty', 'epoch'],
    },
    call,
  );
});

describe('inspect validation', () => {
  for (const testCase of keyCases)
    caseTest('inspect', testCase, (c) => inspect(db.pool, pick(c.key, heldKey)));
});

/**
 * The API tests plainly valid input with cheap predicates first and sends everything else to
 * the full validation; that fast path must change the speed of a call, never its answer. Its
 * interval tests read the interval's text form, which depends on IntervalStyle.
 */
describe('every IntervalStyle gets the same answers', () => {
  for (const style of ['postgres', 'postgres_verbose', 'sql_standard', 'iso_8601']) {
    test(`with IntervalStyle ${style}, valid calls work and mixed-sign intervals are refused`, async () => {
      const client = await db.pool.connect();
      try {
        await client.query(`SET IntervalStyle = ${style}`);
        const key = uniqueKey(`style-${style}`);
        const granted = await acquire(client, key, 'worker-a', '5 minutes', '0');
        assert.equal(granted.acquired, true);
        const again = await acquire(client, key, 'worker-a', '1 day', '0 seconds');
        assert.deepEqual([again.acquired, again.epoch], [true, granted.epoch]);
        assert.equal((await renew(client, key, 'worker-a', granted.epoch, '90 seconds')).status, 'ok');
        await expectInvalid(
          () => acquire(client, key, 'worker-b', '1 mon -30 days 5 minutes', '0'),
          ['ttl'],
        );
        await expectInvalid(() => acquire(client, key, 'worker-b', '1 minute', '1 mon -30 days'), [
          'wait',
        ]);
        await expectInvalid(
          () => renew(client, key, 'worker-a', granted.epoch, '1 day -24 hours 1 second'),
          ['ttl'],
        );
        assert.equal((await release(client, key, 'worker-a', granted.epoch)).status, 'ok');
      } finally {
        client.release();
      }
    });
  }
});

describe('the limits themselves are valid', () => {
  test('a key and an owner of exactly 1000 bytes work through every function', async () => {
    for (const [key, owner] of [
      [asciiOf(LIMIT), asciiOf(LIMIT)],
      ['é'.repeat(LIMIT / 2), 'é'.repeat(LIMIT / 2)],
      ['😀'.repeat(LIMIT / 4), '😀'.repeat(LIMIT / 4)],
    ] as const) {
      assert.equal(Buffer.byteLength(key), LIMIT);
      const granted = await acquire(db.pool, key, owner, '1 minute');
      assert.equal(granted.acquired, true);
      assert.equal((await inspect(db.pool, key))?.owner, owner);
      assert.equal((await renew(db.pool, key, owner, granted.epoch, '1 minute')).status, 'ok');
      assert.equal((await release(db.pool, key, owner, granted.epoch)).status, 'ok');
    }
  });

  test('keys and owners differing only in their last byte of 1000 are different', async () => {
    const prefix = uniqueKey('p').padEnd(LIMIT - 1, 'p');
    const a = await acquire(db.pool, `${prefix}a`, `${prefix}x`, '1 minute');
    const b = await acquire(db.pool, `${prefix}b`, `${prefix}y`, '1 minute');
    assert.deepEqual([a.acquired, a.epoch, b.acquired, b.epoch], [true, 1n, true, 1n]);
    const denied = await acquire(db.pool, `${prefix}a`, `${prefix}y`, '1 minute');
    assert.equal(denied.acquired, false);
  });

  test('the smallest positive ttl, a zero wait and an epoch of any value are valid', async () => {
    const key = uniqueKey('smallest');
    assert.equal((await acquire(db.pool, key, 'worker-a', '1 microsecond', '0')).acquired, true);
    assert.equal((await acquire(db.pool, key, 'worker-a', '1 minute', '0 seconds')).acquired, true);
    const status = await renew(db.pool, key, 'worker-a', -9223372036854775808n, '1 minute');
    assert.equal(status.status, 'epoch_mismatch');
    assert.equal((await release(db.pool, key, 'worker-a', 9223372036854775807n)).status, 'epoch_mismatch');
  });
});
