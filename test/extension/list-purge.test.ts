/**
 * lease.list and lease.purge (SEMANTICS.md §4 list, §4 purge): listing under inspect's
 * lazy-expiry rules through the primary key index, and purging dead keys without breaking
 * fencing: a purged key's next grant still carries an epoch above every epoch it had (I2, I3).
 *
 * Ages are set by moving a row's released_at or expires_at into the past as the superuser,
 * never by sleeping for an older_than: the test then holds on a loaded machine.
 */
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import {
  acquire,
  acquireCall,
  inspect,
  pgError,
  release,
  releaseCall,
  renew,
  renewCall,
  sleepPast,
  type Queryable,
} from '../support/lease-calls.js';
import { uniqueKey } from '../support/helpers.js';
import { createRole } from '../support/roles.js';
import { PACKAGE_ROOT, PgCluster } from 'pg-lease-testing';
import { Isolation } from '../support/sessions.js';

interface Listed {
  key: string;
  held: boolean;
  owner: string | null;
  epoch: string;
  expires_at: Date | null;
}

async function list(db: Queryable, prefix: string | null, heldOnly?: boolean): Promise<Listed[]> {
  const { rows } =
    heldOnly === undefined
      ? await db.query('SELECT key, held, owner, epoch::text AS epoch, expires_at FROM lease.list($1)', [prefix])
      : await db.query(
          'SELECT key, held, owner, epoch::text AS epoch, expires_at FROM lease.list($1, $2)',
          [prefix, heldOnly],
        );
  return rows as Listed[];
}

async function purge(db: Queryable, olderThan: string, limit?: number): Promise<number> {
  const { rows } =
    limit === undefined
      ? await db.query('SELECT lease.purge($1::interval)::text AS n', [olderThan])
      : await db.query('SELECT lease.purge($1::interval, $2)::text AS n', [olderThan, limit]);
  return Number((rows[0] as { n: string }).n);
}

/** Makes a free or lapsed key look `age` old: the superuser moves its timestamps back. */
async function age(db: Queryable, key: string, interval: string): Promise<void> {
  await db.query(
    `UPDATE lease.leases
        SET released_at = CASE WHEN owner IS NULL THEN released_at - $2::interval END,
            expires_at = CASE WHEN owner IS NOT NULL THEN expires_at - $2::interval END
      WHERE key = $1`,
    [key, interval],
  );
}

async function floor(db: Queryable): Promise<bigint> {
  const { rows } = await db.query('SELECT epoch::text AS e FROM lease.epoch_floor');
  return BigInt((rows[0] as { e: string }).e);
}

/** UTF-8 byte order, which is how COLLATE "C" sorts keys. */
const byteOrder = (a: string, b: string) => Buffer.compare(Buffer.from(a), Buffer.from(b));

let db: TestDatabase;
before(async () => {
  db = await createTestDatabase();
});
after(() => db.close());

describe('lease.list', () => {
  test('held_only (the default) lists live grants; false adds free and lapsed keys as inspect shows them', async () => {
    const ns = uniqueKey('list-states') + '/';
    const held = await acquire(db.pool, `${ns}a-held`, 'w1', '1 hour');
    const freed = await acquire(db.pool, `${ns}b-free`, 'w1', '1 hour');
    await release(db.pool, `${ns}b-free`, 'w1', freed.epoch);
    const short = await acquire(db.pool, `${ns}c-lapsed`, 'w2', '100 milliseconds');
    await sleepPast(db.pool, short.expiresAt);

    const live = await list(db.pool, ns);
    assert.deepEqual(
      live.map((row) => [row.key, row.held, row.owner, row.epoch]),
      [[`${ns}a-held`, true, 'w1', String(held.epoch)]],
    );
    const all = await list(db.pool, ns, false);
    assert.deepEqual(
      all.map((row) => row.key),
      [`${ns}a-held`, `${ns}b-free`, `${ns}c-lapsed`],
    );
    for (const row of all) {
      const state = (await inspect(db.pool, row.key))!;
      assert.equal(row.held, state.held, row.key);
      assert.equal(row.owner, state.owner, row.key);
      assert.equal(row.epoch, String(state.epoch), row.key);
      assert.equal(row.expires_at === null, state.expiresAt === null, row.key);
    }
    // The lapsed grant is not held: no owner, no expiry, its epoch is the watermark.
    assert.deepEqual(
      [all[2]!.held, all[2]!.owner, all[2]!.expires_at, all[2]!.epoch],
      [false, null, null, String(short.epoch)],
    );
  });

  test('a prefix selects exactly the keys that start with it, byte for byte, in byte order', async () => {
    const ns = uniqueKey('list-prefix') + '/';
    const suffixes = [
      '',
      'a',
      'a-1',
      'a-2',
      'b',
      'é',
      'ê',
      'é-x',
      '\uD7FF',
      '\uE000',
      '\u{10FFFF}',
      '\u{10FFFF}a',
      'Z',
      'z',
      "a'%_\\",
    ];
    const keys = suffixes.map((suffix) => ns + suffix);
    for (const key of keys) await acquire(db.pool, key, 'w', '1 hour');

    const prefixes = [
      ns,
      `${ns}a`,
      `${ns}a-`,
      `${ns}é`,
      `${ns}\uD7FF`,
      `${ns}\u{10FFFF}`,
      `${ns}a'%`,
      `${ns}a'%_\\`,
      `${ns}q`,
    ];
    for (const prefix of prefixes) {
      const expected = keys.filter((key) => key.startsWith(prefix)).sort(byteOrder);
      const got = (await list(db.pool, prefix)).map((row) => row.key);
      assert.deepEqual(got, expected, `prefix ${JSON.stringify(prefix)}`);
    }
    // No prefix (NULL) and the empty prefix list every key, ours in the same order.
    for (const prefix of [null, '']) {
      const got = (await list(db.pool, prefix)).map((row) => row.key).filter((k) => k.startsWith(ns));
      assert.deepEqual(got, [...keys].sort(byteOrder));
    }
  });

  test('the upper bound of a prefix is the next code point, skipping surrogates and U+10FFFF', async () => {
    const { rows } = await db.pool.query<{ prefix: string; bound: string | null }>(
      `SELECT p AS prefix, lease._prefix_upper_bound(p) AS bound
         FROM unnest($1::text[]) WITH ORDINALITY AS t(p, n) ORDER BY n`,
      [['', 'a', 'job-', 'é', '\uD7FF', '\u{10FFFF}', `a\u{10FFFF}`, `a\u{10FFFF}\u{10FFFF}`]],
    );
    assert.deepEqual(
      rows.map((row) => row.bound),
      [null, 'b', 'job.', 'ê', '\uE000', null, 'b', 'b'],
    );
  });

  test('a selective prefix is an index range scan of the primary key, never a sequential scan', async () => {
    const ns = uniqueKey('list-plan') + '/';
    await db.pool.query(
      `INSERT INTO lease.leases (key, owner, epoch, expires_at, released_at)
       SELECT $1 || 'bulk-' || g, NULL, 2, NULL, clock_timestamp() FROM generate_series(1, 20000) AS g`,
      [ns],
    );
    await db.pool.query('ANALYZE lease.leases');
    // auto_explain reports the plan of the statement inside lease.list as a NOTICE.
    const client = new pg.Client({ connectionString: db.url });
    await client.connect();
    try {
      const notices: string[] = [];
      client.on('notice', (notice) => notices.push(notice.message ?? ''));
      await client.query(`LOAD 'auto_explain'`);
      for (const setting of [
        'auto_explain.log_min_duration = 0',
        'auto_explain.log_nested_statements = on',
        'auto_explain.log_level = notice',
        'auto_explain.log_format = json',
      ])
        await client.query(`SET ${setting}`);
      for (const heldOnly of [true, false]) {
        notices.length = 0;
        const { rows } = await client.query(
          'SELECT count(*)::int AS n FROM lease.list($1, $2)',
          [`${ns}bulk-1234`, heldOnly],
        );
        assert.equal(rows[0].n, heldOnly ? 0 : 11); // bulk-1234 and bulk-12340..12349
        const inner = notices
          .map((message) => JSON.parse(message.slice(message.indexOf('{'))) as ExplainJson)
          .find((plan) => plan['Query Text'].includes('FROM lease.leases'));
        assert.ok(inner, `no plan of the inner statement among: ${notices.join('\n')}`);
        const nodes = flatten(inner.Plan);
        assert.ok(
          nodes.some((node) => node['Index Name'] === 'leases_pkey' && node['Index Cond']),
          `expected an index condition on leases_pkey: ${JSON.stringify(inner.Plan)}`,
        );
        assert.ok(
          !nodes.some((node) => node['Node Type'] === 'Seq Scan'),
          `sequential scan: ${JSON.stringify(inner.Plan)}`,
        );
      }
    } finally {
      await client.end();
      await db.pool.query(`DELETE FROM lease.leases WHERE starts_with(key, $1)`, [ns]);
    }
  });

  test('invalid input is 22023 naming every violated rule', async () => {
    const error = await pgError(db.pool.query('SELECT * FROM lease.list(repeat($1, 1001), NULL)', ['x']));
    assert.equal(error.code, '22023');
    assert.equal(error.message, 'pg_lease: invalid input');
    assert.equal(error.detail, 'prefix must be at most 1000 bytes; held_only must not be null');
  });

  test('a role with no privileges beyond PUBLIC may list', async () => {
    const role = await createRole(db);
    try {
      const key = uniqueKey('list-role');
      await acquire(db.pool, key, 'w', '1 hour');
      const client = await role.connect();
      const rows = await list(client, key);
      assert.deepEqual(
        rows.map((row) => [row.key, row.owner]),
        [[key, 'w']],
      );
    } finally {
      await role.drop();
    }
  });
});

interface ExplainNode {
  'Node Type': string;
  'Index Name'?: string;
  'Index Cond'?: string;
  Plans?: ExplainNode[];
}
interface ExplainJson {
  'Query Text': string;
  Plan: ExplainNode;
}
function flatten(node: ExplainNode): ExplainNode[] {
  return [node, ...(node.Plans ?? []).flatMap(flatten)];
}

describe('lease.purge', () => {
  test('deletes free and lapsed keys unchanged for older_than, returns how many, never touches held keys', async () => {
    const ns = uniqueKey('purge-which') + '/';
    const oldFree = `${ns}old-free`;
    const newFree = `${ns}new-free`;
    const oldLapsed = `${ns}old-lapsed`;
    const held = `${ns}held`;
    const heldLong = `${ns}held-since-long`;
    for (const key of [oldFree, newFree]) {
      const granted = await acquire(db.pool, key, 'w', '1 hour');
      await release(db.pool, key, 'w', granted.epoch);
    }
    await acquire(db.pool, oldLapsed, 'w', '1 hour');
    await acquire(db.pool, held, 'w', '1 hour');
    await acquire(db.pool, heldLong, 'w', '1000 days');
    await age(db.pool, oldFree, '2 hours');
    await age(db.pool, oldLapsed, '3 hours'); // expired 2 hours ago
    await age(db.pool, heldLong, '2 hours'); // granted long ago, still live

    // Other tests' keys may be purged too; count only ours.
    const before = (await list(db.pool, ns, false)).length;
    await purge(db.pool, '1 hour');
    const remaining = (await list(db.pool, ns, false)).map((row) => row.key);
    assert.deepEqual(remaining, [held, heldLong, newFree].sort(byteOrder));
    assert.equal(before - remaining.length, 2);
    assert.equal((await inspect(db.pool, held))?.held, true);
    assert.equal((await inspect(db.pool, oldFree)), undefined);
  });

  test('returns the number of rows it deleted, at most limit', async () => {
    await purge(db.pool, '0'); // start from a table without dead keys
    const ns = uniqueKey('purge-count') + '/';
    for (let i = 0; i < 5; i++) {
      const granted = await acquire(db.pool, `${ns}${i}`, 'w', '1 hour');
      await release(db.pool, `${ns}${i}`, 'w', granted.epoch);
    }
    assert.equal(await purge(db.pool, '0', 2), 2);
    assert.equal((await list(db.pool, ns, false)).length, 3);
    assert.equal(await purge(db.pool, '0'), 3);
    assert.equal(await purge(db.pool, '0'), 0);
  });

  test("a purged key's next grant carries an epoch above every epoch it had, and so do new keys", async () => {
    const key = uniqueKey('purge-floor');
    let epoch = 0n;
    for (let i = 0; i < 4; i++) {
      const granted = await acquire(db.pool, key, `w${i}`, '1 hour');
      assert.ok(granted.epoch! > epoch);
      epoch = granted.epoch!;
      await release(db.pool, key, `w${i}`, epoch);
    }
    const watermark = (await inspect(db.pool, key))!.epoch; // epoch + 1
    assert.equal(await purge(db.pool, '0') >= 1, true);
    assert.equal(await inspect(db.pool, key), undefined, 'a purged key reads as never leased');
    assert.ok((await floor(db.pool)) >= watermark);

    const again = await acquire(db.pool, key, 'w-next', '1 hour');
    assert.ok(again.epoch! > watermark, `${again.epoch} must exceed ${watermark}`);
    const fresh = await acquire(db.pool, uniqueKey('purge-floor-new'), 'w', '1 hour');
    assert.ok(fresh.epoch! > watermark, 'a key never seen starts above the floor too');
    // The old holder's epoch stays stale.
    assert.equal((await renew(db.pool, key, 'w3', epoch, '1 hour')).status, 'not_owner');
  });

  test('the floor is the highest epoch purged, never lowered by a later purge', async () => {
    const high = uniqueKey('purge-high');
    const low = uniqueKey('purge-low');
    const lowGrant = await acquire(db.pool, low, 'w', '1 hour');
    await release(db.pool, low, 'w', lowGrant.epoch);
    let granted = await acquire(db.pool, high, 'w', '1 hour');
    for (let i = 0; i < 5; i++) {
      await release(db.pool, high, 'w', granted.epoch);
      granted = await acquire(db.pool, high, 'w', '1 hour');
    }
    await release(db.pool, high, 'w', granted.epoch);
    const highEpoch = (await inspect(db.pool, high))!.epoch;
    const lowEpoch = (await inspect(db.pool, low))!.epoch;
    assert.ok(lowEpoch < highEpoch);
    await age(db.pool, high, '2 hours');
    await purge(db.pool, '1 hour'); // high only
    const raised = await floor(db.pool);
    assert.ok(raised >= highEpoch, `floor ${raised} below ${highEpoch}`);
    assert.equal((await inspect(db.pool, low))?.epoch, lowEpoch);
    await purge(db.pool, '0'); // low, with its lower epoch
    assert.equal(await inspect(db.pool, low), undefined);
    assert.equal(await floor(db.pool), raised);
  });

  test('invalid input is 22023 naming every violated rule, and changes nothing', async () => {
    const key = uniqueKey('purge-invalid');
    const granted = await acquire(db.pool, key, 'w', '1 hour');
    await release(db.pool, key, 'w', granted.epoch);
    const cases: [string, unknown[], string][] = [
      ['SELECT lease.purge(NULL)', [], 'older_than must be a non-negative finite interval'],
      ["SELECT lease.purge('-1 second')", [], 'older_than must be a non-negative finite interval'],
      ["SELECT lease.purge('1 day -1 hour')", [], 'older_than must be a non-negative finite interval'],
      ["SELECT lease.purge('1001 years')", [], 'older_than must be at most 1000 years'],
      [
        "SELECT lease.purge('-1 day', 0)",
        [],
        'older_than must be a non-negative finite interval; limit must be at least 1',
      ],
    ];
    for (const [sql, values, detail] of cases) {
      const error = await pgError(db.pool.query(sql, values));
      assert.equal(error.code, '22023', sql);
      assert.equal(error.message, 'pg_lease: invalid input', sql);
      assert.equal(error.detail, detail, sql);
    }
    assert.equal((await inspect(db.pool, key))?.epoch, granted.epoch! + 1n);
  });

  test('is refused in a read-only transaction (25006)', async () => {
    const client = await db.pool.connect();
    try {
      await client.query('BEGIN READ ONLY');
      const error = await pgError(client.query("SELECT lease.purge('0')"));
      assert.equal(error.code, '25006');
    } finally {
      await client.query('ROLLBACK');
      client.release();
    }
  });
});

describe('who may purge', () => {
  let owned: TestDatabase;
  before(async () => {
    owned = await createTestDatabase({ extension: false });
  });
  after(() => owned.close());

  test('the installing role may purge and grant it; PUBLIC may not', async () => {
    const installer = await createRole(owned, 'GRANT CREATE ON DATABASE %D TO %I');
    const app = await createRole(owned);
    try {
      const asInstaller = await installer.connect();
      await asInstaller.query('CREATE EXTENSION pg_lease');
      const asApp = await app.connect();
      // The app may use the API and list, but not purge.
      const granted = await acquire(asApp, 'k', 'app', '1 hour');
      await release(asApp, 'k', 'app', granted.epoch);
      assert.equal((await list(asApp, 'k', false)).length, 1);
      const denied = await pgError(asApp.query("SELECT lease.purge('0')"));
      assert.equal(denied.code, '42501');

      assert.equal(await purge(asInstaller, '0'), 1);
      await asInstaller.query(
        `GRANT EXECUTE ON FUNCTION lease.purge(interval, bigint) TO ${pg.escapeIdentifier(app.name)}`,
      );
      const again = await acquire(asApp, 'k', 'app', '1 hour');
      assert.equal(again.epoch, granted.epoch! + 2n, 'the floor carried the purged epoch');
      await release(asApp, 'k', 'app', again.epoch);
      assert.equal(await purge(asApp, '0'), 1);
      await asInstaller.query('DROP EXTENSION pg_lease');
      await asInstaller.query('DROP SCHEMA IF EXISTS lease').catch(() => undefined);
    } finally {
      await app.drop();
      await installer.drop();
    }
  });
});

/** The released 0.1.0 install script, kept as a test fixture (it is not installable). */
const FIXTURE_0_1_0 = path.join(PACKAGE_ROOT, 'extension', 'test', 'fixtures', 'pg_lease--0.1.0.sql');

describe('who may purge after an update from 0.1.0', () => {
  test('the role that installed 0.1.0 and updates it may purge; PUBLIC still may not', async () => {
    await using cluster = await PgCluster.start({ extraExtensionFiles: [FIXTURE_0_1_0] });
    const url = await cluster.createDatabase(undefined, { extension: false });
    const suffix = Math.random().toString(36).slice(2, 8);
    const installer = `pgl_installer_${suffix}`;
    const app = `pgl_app_${suffix}`;
    await cluster.query(`CREATE ROLE ${installer} LOGIN; CREATE ROLE ${app} LOGIN`);
    const database = new URL(url).pathname.slice(1);
    await cluster.query(`GRANT CREATE ON DATABASE ${database} TO ${installer}`);
    const as = async (role: string) => {
      const parsed = new URL(url);
      parsed.username = role;
      const client = new pg.Client({ connectionString: parsed.toString() });
      await client.connect();
      return client;
    };
    const asInstaller = await as(installer);
    const asApp = await as(app);
    try {
      await asInstaller.query(`CREATE EXTENSION pg_lease VERSION '0.1.0'`);
      const granted = await acquire(asApp, 'k', 'app', '1 hour');
      await release(asApp, 'k', 'app', granted.epoch);
      await asInstaller.query('ALTER EXTENSION pg_lease UPDATE');
      assert.equal((await pgError(asApp.query("SELECT lease.purge('0')"))).code, '42501');
      // Free at the update counts as released then: 0 purges it, an hour does not.
      assert.equal(await purge(asInstaller, '1 hour'), 0);
      assert.equal(await purge(asInstaller, '0'), 1);
      assert.equal((await acquire(asApp, 'k', 'app', '1 hour')).epoch, granted.epoch! + 2n);
    } finally {
      await asApp.end();
      await asInstaller.end();
    }
  });
});

describe('purge against concurrent sessions', () => {
  test('an open purge never delays calls on live keys; an acquire of a purged key waits and gets a greater epoch', async () => {
    const ns = uniqueKey('purge-race') + '/';
    const dead = `${ns}dead`;
    const live = `${ns}live`;
    const deadGrant = await acquire(db.pool, dead, 'w', '1 hour');
    await release(db.pool, dead, 'w', deadGrant.epoch);
    await db.pool.query(
      `INSERT INTO lease.leases (key, owner, epoch, expires_at, released_at)
       SELECT $1 || 'filler-' || g, NULL, 7, NULL, clock_timestamp() FROM generate_series(1, 2000) AS g`,
      [ns],
    );
    const liveGrant = await acquire(db.pool, live, 'holder', '1 hour');

    await using iso = await Isolation.open(db.url, ['purger', 'holder', 'other']);
    const { purger, holder, other } = iso.named;
    await purger.query('BEGIN');
    const purged = Number((await purger.query("SELECT lease.purge('0')::int AS n")).rows[0].n);
    assert.ok(purged >= 2001);
    // The purge holds its locks until COMMIT; live keys do not notice.
    assert.equal((await holder.run(renewCall(live, 'holder', liveGrant.epoch, '1 hour'))).status, 'ok');
    assert.equal((await other.run(acquireCall(live, 'other', '1 hour'))).acquired, false);
    const fresh = await other.run(acquireCall(`${ns}brand-new`, 'other', '1 hour'));
    assert.equal(fresh.acquired, true);
    assert.equal((await holder.run(releaseCall(live, 'holder', liveGrant.epoch))).status, 'ok');

    // An acquire of a key being purged waits for the purge, then starts above the floor.
    const revive = other.start(acquireCall(dead, 'other', '1 hour'));
    await iso.untilBlocked(revive, purger);
    await purger.query('COMMIT');
    const revived = await revive.result();
    assert.equal(revived.acquired, true);
    assert.ok(revived.epoch! >= 8n, `epoch ${revived.epoch} must be above the purged 7`);
    assert.ok(revived.epoch! > deadGrant.epoch! + 1n);
  });
});

/*
 * Purge racing acquire, renew and release, interleaving by interleaving (the home of the
 * former isolation specs purge-vs-acquire and purge-vs-renew-release). The epoch floor is
 * one per database, so each test gets a database of its own: its epochs are then exact.
 */
describe('purge races, each in a fresh database', { concurrency: true }, () => {
  async function fresh<T>(body: (own: TestDatabase) => Promise<T>): Promise<T> {
    const own = await createTestDatabase();
    try {
      return await body(own);
    } finally {
      await own.close();
    }
  }

  for (const end of ['COMMIT', 'ROLLBACK'] as const) {
    test(`an acquire of a key an open purge deletes waits for it; after the purge's ${end} it gets epoch 3`, () =>
      fresh(async (own) => {
        const k = await acquire(own.pool, 'k', 'a', '1 hour');
        await release(own.pool, 'k', 'a', k.epoch);
        const h = await acquire(own.pool, 'h', 'a', '1 hour');
        await using iso = await Isolation.open(own.url, ['purger', 'other']);
        const { purger, other } = iso.named;
        await purger.query('BEGIN');
        assert.equal(await purge(purger, '0'), 1);
        const step = other.start(acquireCall('k', 'b', '1 hour'));
        await iso.untilBlocked(step, purger);
        await purger.query(end);
        const granted = await step.result();
        assert.deepEqual([granted.acquired, granted.epoch], [true, 3n]);
        assert.deepEqual(
          (await list(own.pool, null, false)).map((r) => [r.key, r.held, r.owner, r.epoch]),
          [
            ['h', true, 'a', String(h.epoch)],
            ['k', true, 'b', '3'],
          ],
        );
      }));
  }

  test('a purge skips a key whose grant is uncommitted, without waiting for it', () =>
    fresh(async (own) => {
      const k = await acquire(own.pool, 'k', 'a', '1 hour');
      await release(own.pool, 'k', 'a', k.epoch);
      await using iso = await Isolation.open(own.url, ['purger', 'other']);
      const { purger, other } = iso.named;
      await other.query('BEGIN');
      assert.equal((await other.run(acquireCall('k', 'b', '1 hour'))).epoch, 3n);
      // query() fails with StepBlockedError if the purge waits for the uncommitted grant.
      assert.equal(Number((await purger.query("SELECT lease.purge('0')::int AS n")).rows[0].n), 0);
      await other.query('COMMIT');
      const seen = await inspect(own.pool, 'k');
      assert.deepEqual([seen?.held, seen?.owner, seen?.epoch], [true, 'b', 3n]);
    }));

  test('an acquire whose insert waited while another granted, released and purged the key gets epoch 3, not 1 again', () =>
    fresh(async (own) => {
      await using iso = await Isolation.open(own.url, ['s2', 's3']);
      const { s2, s3 } = iso.named;
      await s3.query('BEGIN');
      assert.equal((await s3.run(acquireCall('n', 'c', '1 hour'))).epoch, 1n);
      const step = s2.start(acquireCall('n', 'b', '1 hour'));
      await iso.untilBlocked(step, s3);
      assert.equal((await s3.run(releaseCall('n', 'c', 1n))).status, 'ok');
      assert.equal(await purge(s3, '0'), 1);
      await s3.query('COMMIT');
      const granted = await step.result();
      assert.deepEqual([granted.acquired, granted.epoch], [true, 3n]);
      const seen = await inspect(own.pool, 'n');
      assert.deepEqual([seen?.held, seen?.owner, seen?.epoch], [true, 'b', 3n]);
    }));

  test('under REPEATABLE READ the same race fails the acquire with 40001 and grants nothing', () =>
    fresh(async (own) => {
      await using iso = await Isolation.open(own.url, ['s2', 's3']);
      const { s2, s3 } = iso.named;
      await s2.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
      await s2.query("SELECT count(*) FROM lease.inspect('n')"); // takes the snapshot
      await s3.query('BEGIN');
      assert.equal((await s3.run(acquireCall('n', 'c', '1 hour'))).epoch, 1n);
      const step = s2.start(acquireCall('n', 'b', '1 hour'));
      await iso.untilBlocked(step, s3);
      assert.equal((await s3.run(releaseCall('n', 'c', 1n))).status, 'ok');
      assert.equal(await purge(s3, '0'), 1);
      await s3.query('COMMIT');
      const error = await step.error();
      assert.equal(error.code, '40001', error.message);
      await s2.query('ROLLBACK');
      assert.equal(await inspect(own.pool, 'n'), undefined);
    }));

  test('a lapsed grant stays final across a purge: lapsed while it is open, without waiting; not_owner after', () =>
    fresh(async (own) => {
      const l = await acquire(own.pool, 'l', 'a', '300 milliseconds');
      await acquire(own.pool, 'h', 'a', '1 hour');
      await sleepPast(own.pool, l.expiresAt);
      await using iso = await Isolation.open(own.url, ['purger', 'holder']);
      const { purger, holder } = iso.named;
      await purger.query('BEGIN');
      assert.equal(await purge(purger, '0'), 1);
      // run() fails with StepBlockedError if either call waits for the purge.
      assert.deepEqual(await holder.run(renewCall('l', 'a', l.epoch, '1 hour')), { status: 'lapsed', expiresAt: null });
      assert.deepEqual(await holder.run(releaseCall('l', 'a', l.epoch)), { status: 'lapsed' });
      await purger.query('COMMIT');
      assert.deepEqual(await holder.run(renewCall('l', 'a', l.epoch, '1 hour')), { status: 'not_owner', expiresAt: null });
      assert.deepEqual(await holder.run(releaseCall('l', 'a', l.epoch)), { status: 'not_owner' });
      assert.deepEqual(
        (await list(own.pool, null, false)).map((r) => r.key),
        ['h'],
      );
    }));

  test('an uncommitted release is skipped by a purge; once committed the key is purged and its next grant is epoch 3', () =>
    fresh(async (own) => {
      const h = await acquire(own.pool, 'h', 'a', '1 hour');
      await using iso = await Isolation.open(own.url, ['purger', 'holder']);
      const { purger, holder } = iso.named;
      await holder.query('BEGIN');
      assert.equal((await holder.run(releaseCall('h', 'a', h.epoch))).status, 'ok');
      // query() fails with StepBlockedError if the purge waits for the uncommitted release.
      assert.equal(Number((await purger.query("SELECT lease.purge('0')::int AS n")).rows[0].n), 0);
      await holder.query('COMMIT');
      assert.equal(Number((await purger.query("SELECT lease.purge('0')::int AS n")).rows[0].n), 1);
      assert.equal(await inspect(own.pool, 'h'), undefined);
      const next = await holder.run(acquireCall('h', 'b', '1 hour'));
      assert.deepEqual([next.acquired, next.epoch], [true, 3n]);
    }));
});
