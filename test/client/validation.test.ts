/**
 * The client checks input with the server's rules before sending, and must say exactly what the
 * server would: each case here runs through the client and, as raw SQL, through the server.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import {
  Election,
  INVALID_INPUT_MESSAGE,
  LeaseClient,
  LeaseInvalidInputError,
  parseInterval,
  SQLSTATE,
} from '../../src/index.js';
import { parseIntervalFields } from '../../src/duration.js';
import { serverVersionNum } from '../support/lease-calls.js';
import { translateError } from '../../src/errors.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';

let db: TestDatabase;
let client: LeaseClient;

before(async () => {
  db = await createTestDatabase();
  client = new LeaseClient(db.pool);
});
after(() => db.close());

const LONG_KEY = 'é'.repeat(501); // 1002 bytes in 501 characters
const LONG_OWNER = 'x'.repeat(1001);

interface Case {
  name: string;
  viaClient: (client: LeaseClient) => Promise<unknown>;
  sql: string;
  values: unknown[];
}

const nothing = null as unknown as string;

const CASES: Case[] = [
  {
    name: 'acquire: empty key and owner, zero ttl, negative wait',
    viaClient: (c) => c.acquire('', { owner: '', ttl: '0', wait: '-1 s' }),
    sql: 'SELECT * FROM lease.acquire($1, $2, $3::interval, $4::interval)',
    values: ['', '', '0', '-1 s'],
  },
  {
    name: 'acquire: key and owner over 1000 bytes, intervals over 1000 years',
    viaClient: (c) =>
      c.acquire(LONG_KEY, { owner: LONG_OWNER, ttl: '1001 years', wait: '1001 years' }),
    sql: 'SELECT * FROM lease.acquire($1, $2, $3::interval, $4::interval)',
    values: [LONG_KEY, LONG_OWNER, '1001 years', '1001 years'],
  },
  {
    name: 'acquire: intervals with a negative field although positive overall',
    viaClient: (c) => c.acquire('k', { owner: 'o', ttl: '1 day -1 s', wait: '1 mon -29 days' }),
    sql: 'SELECT * FROM lease.acquire($1, $2, $3::interval, $4::interval)',
    values: ['k', 'o', '1 day -1 s', '1 mon -29 days'],
  },
  {
    name: 'acquire: milliseconds, zero ttl and negative wait',
    viaClient: (c) => c.acquire('k', { owner: 'o', ttl: 0, wait: -1 }),
    sql: 'SELECT * FROM lease.acquire($1, $2, $3::interval, $4::interval)',
    values: ['k', 'o', '0 ms', '-1 ms'],
  },
  {
    name: 'renew: everything missing',
    viaClient: (c) =>
      c.renew(nothing, { owner: nothing, epoch: null as unknown as bigint, ttl: '-1 min' }),
    sql: 'SELECT * FROM lease.renew($1, $2, $3::bigint, $4::interval)',
    values: [null, null, null, '-1 min'],
  },
  {
    name: 'renew: ttl over 1000 years',
    viaClient: (c) => c.renew('k', { owner: 'o', epoch: 1n, ttl: '1001 years' }),
    sql: 'SELECT * FROM lease.renew($1, $2, $3::bigint, $4::interval)',
    values: ['k', 'o', '1', '1001 years'],
  },
  {
    name: 'release: empty key, long owner, no epoch',
    viaClient: (c) => c.release('', { owner: LONG_OWNER, epoch: null as unknown as bigint }),
    sql: 'SELECT * FROM lease.release($1, $2, $3::bigint)',
    values: ['', LONG_OWNER, null],
  },
  {
    name: 'inspect: empty key',
    viaClient: (c) => c.inspect(''),
    sql: 'SELECT * FROM lease.inspect($1)',
    values: [''],
  },
  {
    name: 'inspect: key over 1000 bytes',
    viaClient: (c) => c.inspect(LONG_KEY),
    sql: 'SELECT * FROM lease.inspect($1)',
    values: [LONG_KEY],
  },
];

describe('invalid input: the client says what the server says', () => {
  for (const { name, viaClient, sql, values } of CASES) {
    test(name, async () => {
      const fromClient = await viaClient(client).then(
        () => assert.fail('the client accepted invalid input'),
        (error: unknown) => error,
      );
      const fromServer = await db.pool.query(sql, values).then(
        () => assert.fail('the server accepted invalid input'),
        (error: unknown) => error,
      );
      assert.equal((fromServer as pg.DatabaseError).code, SQLSTATE.INVALID_PARAMETER_VALUE);
      const translated = translateError(fromServer, 'k');
      assert.ok(fromClient instanceof LeaseInvalidInputError);
      assert.ok(translated instanceof LeaseInvalidInputError);
      assert.equal(translated.cause, fromServer);
      assert.equal(fromClient.cause, undefined); // never sent
      assert.equal(fromClient.code, 'invalid_input');
      assert.equal(fromClient.sqlState, '22023');
      assert.ok(fromClient.message.startsWith(INVALID_INPUT_MESSAGE));
      assert.deepEqual(
        { message: fromClient.message, detail: fromClient.detail, hint: fromClient.hint },
        { message: translated.message, detail: translated.detail, hint: translated.hint },
      );
    });
  }

  test('lists every violation, in parameter order', async () => {
    const error = await client.acquire('', { owner: '', ttl: '0', wait: '-1 s' }).catch((e) => e);
    assert.deepEqual((error as LeaseInvalidInputError).violations, [
      'key must be a non-empty string',
      'owner must be a non-empty string',
      'ttl must be a positive finite interval',
      'wait must be a non-negative finite interval',
    ]);
  });

  test('is checked before anything is sent', async () => {
    const unreachable = new LeaseClient('postgresql://postgres@127.0.0.1:1/none');
    try {
      await assert.rejects(unreachable.acquire('', { ttl: '30s' }), LeaseInvalidInputError);
    } finally {
      await unreachable.end();
    }
  });

  test('infinite durations are out of range, as on the server', async () => {
    for (const ttl of [Infinity, NaN, 'infinity']) {
      await assert.rejects(
        client.acquire('k', { ttl }),
        (error: unknown) =>
          error instanceof LeaseInvalidInputError &&
          error.detail === 'ttl must be a positive finite interval',
        String(ttl),
      );
    }
    await assert.rejects(
      client.acquire('k', { ttl: '1s', wait: -Infinity }),
      (error: unknown) =>
        error instanceof LeaseInvalidInputError &&
        error.detail === 'wait must be a non-negative finite interval',
    );
  });
  test('the largest valid key, owner and ttl are accepted by both sides', async () => {
    const key = 'é'.repeat(500); // exactly 1000 bytes
    const lease = await client.acquire(key, { owner: 'o'.repeat(1000), ttl: '1000 years' });
    assert.ok(lease);
    assert.equal(Buffer.byteLength(lease.key), 1000);
    assert.equal(await lease.release(), 'ok');
  });
});

/** The client's own rules for what it alone reads (docs/client.md, "Durations"). */
describe('durations: one meaning for every input', () => {
  async function detailOf(attempt: Promise<unknown>): Promise<string> {
    const error = await attempt.then(
      () => assert.fail('accepted'),
      (caught: unknown) => caught,
    );
    assert.ok(error instanceof LeaseInvalidInputError, String(error));
    return error.detail;
  }

  test('text that is not a duration is reported as unreadable, naming it', async () => {
    assert.equal(
      await detailOf(client.acquire('k', { ttl: '5 parsecs' })),
      'ttl "5 parsecs" is not a duration',
    );
    assert.equal(
      await detailOf(client.acquire('k', { ttl: '1s', wait: 'soon' })),
      'wait "soon" is not a duration',
    );
  });

  test('text that is a bare number has no unit and is refused; zero is allowed', async () => {
    assert.equal(
      await detailOf(client.acquire('k', { ttl: '30' })),
      'ttl "30" has no unit: write 30s, 30ms or 30min',
    );
    const lease = await client.acquire(`bare-zero-${process.pid}`, { ttl: '30s', wait: '0' });
    assert.ok(lease);
    await lease.release();
  });

  test('a number is a whole number of milliseconds: 30 is a 30 ms lease, 0.5 is refused', async () => {
    assert.equal(
      await detailOf(client.acquire('k', { ttl: 0.5 })),
      'ttl must be a whole number of milliseconds, got 0.5',
    );
    assert.equal(
      await detailOf(client.acquire('k', { ttl: '1.5ms' })),
      'ttl must be a whole number of milliseconds, got "1.5ms"',
    );
    assert.equal(
      await detailOf(client.acquire('k', { ttl: '1s', wait: '500 us' })),
      'wait must be a whole number of milliseconds, got "500 us"',
    );
    const key = `ms-${process.pid}`;
    const lease = await client.acquire(key, { ttl: 60_000 });
    assert.ok(lease);
    const { rows } = await db.pool.query<{ ms: number }>(
      `SELECT round(extract(epoch FROM expires_at - now()) * 1000)::int AS ms
         FROM lease.leases WHERE key = $1`,
      [key],
    );
    // 60 000 read as milliseconds is a minute; read as seconds it would be 16 hours.
    assert.ok(rows[0]!.ms > 30_000 && rows[0]!.ms <= 60_000, String(rows[0]!.ms));
    await lease.release();
  });

  test('a keepAlive interval as long as the ttl or longer is refused before anything is sent', async () => {
    const key = `keep-${process.pid}`;
    assert.equal(
      await detailOf(client.acquire(key, { ttl: '3s', keepAlive: { interval: '3s' } })),
      'keepAlive.interval must be shorter than the ttl, got "3s" for a ttl of "3s"',
    );
    assert.equal(
      await detailOf(client.acquire(key, { ttl: 2_000, keepAlive: { interval: 5_000 } })),
      'keepAlive.interval must be shorter than the ttl, got 5000 for a ttl of 2000',
    );
    assert.equal(await client.inspect(key), null);
    const lease = await client.acquire(key, { ttl: '3s', keepAlive: { interval: '1s' } });
    assert.ok(lease);
    await lease.release();
  });

  test('an epoch beyond PostgreSQL bigint is invalid input, not a driver error', async () => {
    assert.equal(
      await detailOf(client.renew('k', { owner: 'o', epoch: 2n ** 63n, ttl: '1s' })),
      'epoch must be a 64-bit integer, got 9223372036854775808',
    );
  });
});

describe('bad options: one error type everywhere in the package', () => {
  // Each option the client reads itself is refused with the error a bad ttl gets, its DETAIL
  // naming the option, before anything is sent or any state is made.
  const refusals: [string, () => unknown, string][] = [
    [
      'a poll interval of zero',
      () => new LeaseClient(db.pool, { pollInterval: 0 }),
      'pollInterval must be a positive finite interval',
    ],
    [
      'a poll interval without a unit',
      () => new LeaseClient(db.pool, { pollInterval: '5' }),
      'pollInterval "5" has no unit: write 5s, 5ms or 5min',
    ],
    [
      'a negative step-down margin',
      () => new Election(client, 'e', { ttl: '3s', stepDownMargin: -1 }),
      'stepDownMargin must be a non-negative finite interval',
    ],
    [
      'a keep-alive interval that is not a duration',
      () => new Election(client, 'e', { ttl: '3s', keepAlive: { interval: 'soon' } }).campaign(),
      'keepAlive.interval "soon" is not a duration',
    ],
    [
      'an unknown isolation level',
      () =>
        client.fenced({ key: 'k', epoch: 1n }, () => undefined, {
          isolation: 'chaos' as 'serializable',
        }),
      'isolation must be one of read committed, repeatable read, serializable, got "chaos"',
    ],
    [
      'an epoch that is not a number',
      () => client.renew('k', { owner: 'o', epoch: '7' as unknown as bigint, ttl: '1s' }),
      'epoch must be a bigint, got string',
    ],
  ];
  for (const [name, call, detail] of refusals)
    test(`${name} is a LeaseInvalidInputError naming the option`, async () => {
      await assert.rejects(
        async () => call(),
        (error: unknown) => {
          assert.ok(error instanceof LeaseInvalidInputError, String(error));
          assert.equal(error.detail, detail);
          return true;
        },
      );
    });
});

describe('interval text: the client reads it as PostgreSQL does', () => {
  const ACCEPTED = [
    '30s',
    '30',
    '1h30m',
    '1h 30m',
    '1.5h',
    '90 min',
    '1 2:03:04',
    '10:00',
    '1:2',
    '00:00:00.5',
    '-1 s',
    '1 s ago',
    '@ 1 minute',
    '@ 1 hour ago',
    '00:30:00 ago',
    'P1DT2H',
    'PT0.5S',
    'PT1M30S',
    'PT1H30M',
    'P1W',
    'P1M',
    'P1Y',
    'P1DT',
    'PT',
    'P0.5D',
    'P1.5Y',
    'PT1.5H',
    '1 mon',
    '14 mons',
    '1.5 mon',
    '1 year',
    '1.5 year',
    '2 decades',
    '1 century',
    '1 millennium',
    '1 week 2 days',
    '1.5 w',
    '1w',
    '1d',
    '1 d 1 h',
    '100ms',
    '100 msec',
    '5us',
    '5 usec',
    '0.5 ms',
    '.5 s',
    '+5 s',
    '1 day -1 s',
    '1 day 02:00',
    '-1:30',
    '25:00',
    '1:02:03.25',
    ' 30 s ',
    '30 SECONDS',
    '1 secs',
    '1 hrs',
    '1 h 2 m 3 s 4 ms 5 us',
    '1 h -1 m',
    '5 seconds 1 day',
    '1.123456789 s',
  ];
  /**
   * Read the same way by PostgreSQL 15 and later; PostgreSQL 14's parser rejects them. The
   * client reads them like the newer servers (it sends microseconds, never this text).
   */
  const ACCEPTED_FROM_15 = ['5. s', '2147483648 s'];
  const REJECTED = [
    '',
    ' ',
    'soon',
    'epoch',
    '1e3 s',
    '1,5 s',
    '1 s 1 s',
    '1 day 1 day',
    '3 4',
    '1 2',
    '1 hour 10:00',
    '10:00:00:00',
    '1:60',
    'P',
    'p1d',
    'ago',
    '1 ago',
  ];
  /** Rejected by the client and by PostgreSQL 17 and later; older servers read it as '-1 days'. */
  const REJECTED_FROM_17 = ['1 day ago ago'];

  async function serverFields(text: string) {
    const { rows } = await db.pool.query<{ months: number; days: number; micros: string }>(
      `SELECT m AS months, d AS days,
              (date_part('epoch', i - make_interval(months => m, days => d)) * 1000000)::bigint::text AS micros
         FROM (SELECT i, (date_part('year', i) * 12 + date_part('month', i))::int AS m,
                      date_part('day', i)::int AS d
                 FROM (SELECT $1::interval AS i) AS given) AS parts`,
      [text],
    );
    const row = rows[0]!;
    return { months: row.months, days: row.days, microseconds: Number(row.micros) };
  }

  test('accepts what PostgreSQL accepts, field by field', async () => {
    const version = await serverVersionNum(db.pool);
    if (version < 150000) {
      for (const text of ACCEPTED_FROM_15) {
        await assert.rejects(db.pool.query('SELECT $1::interval', [text]), text);
      }
    }
    for (const text of version >= 150000 ? [...ACCEPTED, ...ACCEPTED_FROM_15] : ACCEPTED) {
      const mine = parseIntervalFields(text);
      assert.ok(mine !== undefined && typeof mine === 'object', `client rejected ${text}`);
      const normalised = {
        months: mine.months + 0,
        days: mine.days + 0,
        microseconds: mine.microseconds + 0,
      };
      assert.deepEqual(normalised, await serverFields(text), text);
    }
  });

  test('rejects what PostgreSQL rejects', async () => {
    const version = await serverVersionNum(db.pool);
    for (const text of [...REJECTED, ...REJECTED_FROM_17]) {
      assert.equal(parseInterval(text), undefined, `client accepted ${JSON.stringify(text)}`);
      if (version >= 170000 || !REJECTED_FROM_17.includes(text)) {
        await assert.rejects(db.pool.query('SELECT $1::interval', [text]), text);
      } else {
        const { rows } = await db.pool.query<{ v: string }>('SELECT $1::interval::text AS v', [
          text,
        ]);
        assert.equal(rows[0]!.v, '-1 days', text);
      }
    }
  });

  test('reads infinity as not finite', () => {
    assert.equal(parseInterval('infinity'), Infinity);
    assert.equal(parseInterval('-infinity'), -Infinity);
  });
});

/**
 * Issue 32, item 4: a string with a lone UTF-16 surrogate has no UTF-8 form, and was sent as
 * U+FFFD, so 'job-\uD800' and 'job-\uD801' were one key on the server. Every entry point that
 * sends text refuses it as invalid input, naming the argument and where the surrogate is.
 */
describe('text that is not well-formed Unicode is invalid input', () => {
  const LONE = 'job-\uD800';
  const OTHER_LONE = 'job-\uDC01x';
  const unreachable = () => new LeaseClient('postgresql://postgres@127.0.0.1:1/none');
  const entries: [string, (c: LeaseClient) => Promise<unknown>, string][] = [
    [
      'acquire: the key',
      (c) => c.acquire(LONE, { ttl: '30s' }),
      'key must be well-formed Unicode: lone surrogate U+D800 at index 4',
    ],
    [
      'acquire: the owner, and a key with a lone low surrogate',
      (c) => c.acquire(OTHER_LONE, { ttl: '30s', owner: 'worker-\uDBFF' }),
      'key must be well-formed Unicode: lone surrogate U+DC01 at index 4; ' +
        'owner must be well-formed Unicode: lone surrogate U+DBFF at index 7',
    ],
    [
      "the client's owner option",
      async () => {
        const withOwner = new LeaseClient('postgresql://postgres@127.0.0.1:1/none', {
          owner: '\uD800',
        });
        try {
          return await withOwner.acquire('k', { ttl: '30s' });
        } finally {
          await withOwner.end();
        }
      },
      'owner must be well-formed Unicode: lone surrogate U+D800 at index 0',
    ],
    [
      'acquireMany: each key by its position',
      (c) => c.acquireMany(['fine', LONE, 'fine-too', OTHER_LONE], { ttl: '30s', owner: 'o' }),
      'keys[1] must be well-formed Unicode: lone surrogate U+D800 at index 4; ' +
        'keys[3] must be well-formed Unicode: lone surrogate U+DC01 at index 4',
    ],
    [
      'acquireMany: the owner',
      (c) => c.acquireMany(['a', 'b'], { ttl: '30s', owner: '\uDFFF' }),
      'owner must be well-formed Unicode: lone surrogate U+DFFF at index 0',
    ],
    [
      'renew',
      (c) => c.renew(LONE, { owner: 'o', epoch: 1n, ttl: '1s' }),
      'key must be well-formed Unicode: lone surrogate U+D800 at index 4',
    ],
    [
      'release',
      (c) => c.release('k', { owner: LONE, epoch: 1n }),
      'owner must be well-formed Unicode: lone surrogate U+D800 at index 4',
    ],
    [
      'inspect',
      (c) => c.inspect(LONE),
      'key must be well-formed Unicode: lone surrogate U+D800 at index 4',
    ],
    [
      'observe',
      (c) => c.observe(LONE).next(),
      'key must be well-formed Unicode: lone surrogate U+D800 at index 4',
    ],
    [
      'list: the prefix',
      (c) => c.list({ prefix: LONE }),
      'prefix must be well-formed Unicode: lone surrogate U+D800 at index 4',
    ],
    [
      'fenced: the key',
      (c) => c.fenced({ key: LONE, epoch: 1n }, () => assert.fail('ran')),
      'key must be well-formed Unicode: lone surrogate U+D800 at index 4',
    ],
    [
      'an election: its key',
      (c) => new Election(c, LONE, { ttl: '3s', identity: 'me' }).campaign(),
      'key must be well-formed Unicode: lone surrogate U+D800 at index 4',
    ],
    [
      'an election: its identity',
      (c) => new Election(c, 'leader', { ttl: '3s', identity: LONE }).campaign(),
      'owner must be well-formed Unicode: lone surrogate U+D800 at index 4',
    ],
    // PostgreSQL's text holds no NUL: the server would answer 22021, not invalid input.
    [
      'acquire: a NUL in the key and in the owner',
      (c) => c.acquire('job\0', { ttl: '30s', owner: '\0worker' }),
      'key must not contain U+0000 (PostgreSQL text holds none): at index 3; ' +
        'owner must not contain U+0000 (PostgreSQL text holds none): at index 0',
    ],
    [
      'acquireMany: a NUL in a key',
      (c) => c.acquireMany(['fine', 'a\0b'], { ttl: '30s', owner: 'o' }),
      'keys[1] must not contain U+0000 (PostgreSQL text holds none): at index 1',
    ],
    [
      'list: a NUL in the prefix',
      (c) => c.list({ prefix: 'jobs/\0' }),
      'prefix must not contain U+0000 (PostgreSQL text holds none): at index 5',
    ],
    [
      'fenced: a NUL in the key',
      (c) => c.fenced({ key: '\0', epoch: 1n }, () => assert.fail('ran')),
      'key must not contain U+0000 (PostgreSQL text holds none): at index 0',
    ],
  ];
  for (const [name, call, detail] of entries)
    test(`${name}: refused before anything is sent`, async () => {
      // A client that cannot connect: anything sent would fail otherwise.
      const nowhere = unreachable();
      try {
        await assert.rejects(
          async () => call(nowhere),
          (error: unknown) => {
            assert.ok(error instanceof LeaseInvalidInputError, String(error));
            assert.equal(error.code, 'invalid_input');
            assert.equal(error.cause, undefined);
            assert.equal(error.detail, detail);
            return true;
          },
        );
      } finally {
        await nowhere.end();
      }
    });

  test('well-formed text with surrogate pairs (an emoji) is accepted by both sides', async () => {
    const key = `pair-\uD83D\uDE00-${process.pid}`; // an emoji: a surrogate pair
    const lease = await client.acquire(key, { ttl: '30s', owner: 'o\uD83D\uDE00' });
    assert.ok(lease);
    assert.equal((await client.inspect(key))?.owner, 'o\uD83D\uDE00');
    await lease.release();
  });

  test("the issue's two keys: neither is acquired, nothing reaches the server", async () => {
    const owner = `surrogates-${process.pid}`;
    for (const key of ['job-\uD800', 'job-\uD801'])
      await assert.rejects(client.acquire(key, { ttl: '30s', owner }), LeaseInvalidInputError);
    // What they would have been sent as.
    assert.equal(await client.inspect('job-\uFFFD'), null);
    const { rows } = await db.pool.query('SELECT 1 FROM lease.leases WHERE owner = $1', [owner]);
    assert.equal(rows.length, 0);
  });
});
