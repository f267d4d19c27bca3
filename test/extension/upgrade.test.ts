/**
 * SEMANTICS.md §10 "Install and upgrade safety": only the current version (CURRENT_VERSION,
 * 0.2.2) can be installed (0.1.0 in particular is not), and `ALTER EXTENSION pg_lease UPDATE`
 * from each earlier version (0.1.0, 0.2.0, 0.2.1) runs one direct update script and gives
 * exactly the objects of a fresh install of the current version, while every lease keeps its
 * owner, epoch and expiry. The released install scripts of the earlier versions exist only as
 * the test fixtures extension/test/fixtures/pg_lease--<v>.sql, staged into this file's private
 * server.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { PgCluster, extensionFiles } from 'pg-lease-testing';
import {
  CATALOG_QUERY,
  CURRENT_VERSION as CURRENT,
  EARLIER_VERSIONS,
  copyExtensionSource,
  make,
  pgConfigForMake,
  skipWithoutMake,
} from '../support/releases.js';

/** The versions a database may be on before it updates. */
const EARLIER = EARLIER_VERSIONS.map((earlier) => earlier.version);

/** What the package ships and make installs: the install script and one direct update each. */
const SHIPPED = [
  ...EARLIER.map((from) => `pg_lease--${from}--${CURRENT}.sql`),
  `pg_lease--${CURRENT}.sql`,
  'pg_lease.control',
].sort();

/**
 * A server that once had 0.2.0 installed keeps its update script pg_lease--0.1.0--0.2.0.sql,
 * so a database on 0.1.0 could also update through 0.2.0. This stand-in for that script fails
 * if it ever runs: every update from 0.1.0 in this file shows that PostgreSQL takes the direct
 * script (the shortest path) instead.
 */
const STALE_STEP = `-- test stand-in for a stale pg_lease--0.1.0--0.2.0.sql: must never run
DO $$ BEGIN RAISE EXCEPTION 'the update went through pg_lease--0.1.0--0.2.0.sql'; END $$;
`;

let cluster: PgCluster;
let staleDir: string;
before(async () => {
  staleDir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-lease-stale-step-'));
  const staleStep = path.join(staleDir, 'pg_lease--0.1.0--0.2.0.sql');
  fs.writeFileSync(staleStep, STALE_STEP);
  cluster = await PgCluster.start({
    extraExtensionFiles: [...EARLIER_VERSIONS.map((earlier) => earlier.fixture), staleStep],
  });
});
after(async () => {
  await cluster?.destroy();
  fs.rmSync(staleDir, { recursive: true, force: true });
});

async function database(): Promise<pg.Client> {
  const url = await cluster.createDatabase(undefined, { extension: false });
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  return client;
}

async function catalog(client: pg.Client): Promise<unknown[]> {
  return (await client.query(CATALOG_QUERY)).rows;
}

async function extversion(client: pg.Client): Promise<string> {
  const { rows } = await client.query(
    `SELECT extversion FROM pg_extension WHERE extname = 'pg_lease'`,
  );
  return rows[0].extversion;
}

describe('shipped versions', () => {
  test(`the package ships the ${CURRENT} install script and a direct update from each of ${EARLIER.join(', ')}, no other install script`, () => {
    const shipped = extensionFiles().map((file) => path.basename(file));
    assert.deepEqual(shipped.sort(), SHIPPED);
  });

  test(`a server with the shipped files offers only ${CURRENT} to CREATE EXTENSION`, async () => {
    await using plain = await PgCluster.start();
    const { rows } = await plain.query(
      `SELECT version FROM pg_available_extension_versions WHERE name = 'pg_lease' ORDER BY 1`,
    );
    assert.deepEqual(rows, [{ version: CURRENT }]);
    await plain.query('CREATE DATABASE v');
    for (const version of EARLIER)
      await assert.rejects(
        plain.query(`CREATE EXTENSION pg_lease VERSION '${version}'`, [], 'v'),
        new RegExp(
          `has no installation script nor update path for version "${version.replaceAll('.', '\\.')}"`,
        ),
      );
    await plain.query('CREATE EXTENSION pg_lease', [], 'v');
    const version = await plain.query(
      `SELECT extversion FROM pg_extension WHERE extname = 'pg_lease'`,
      [],
      'v',
    );
    assert.deepEqual(version.rows, [{ extversion: CURRENT }]);
  });
});

describe('make install', () => {
  test(
    'builds the scripts from src, installs them, and removes the 0.1.0, 0.2.0 and 0.2.1 scripts an earlier install left, so no earlier version is installable',
    { skip: skipWithoutMake() },
    () => {
      const source = copyExtensionSource();
      try {
        const sharedir = spawnSync(pgConfigForMake()!, ['--sharedir'], { encoding: 'utf8' });
        assert.equal(sharedir.status, 0, sharedir.stderr);
        const destdir = path.join(path.dirname(source.dir), 'destdir');
        const extensionDir = path.join(destdir, sharedir.stdout.trim(), 'extension');
        fs.mkdirSync(extensionDir, { recursive: true });
        for (const stale of [
          'pg_lease--0.1.0.sql',
          'pg_lease--0.2.0.sql',
          'pg_lease--0.1.0--0.2.0.sql',
          'pg_lease--0.2.1.sql',
          'pg_lease--0.1.0--0.2.1.sql',
          'pg_lease--0.2.0--0.2.1.sql',
        ])
          fs.writeFileSync(path.join(extensionDir, stale), '-- stale\n');
        const result = make(source.dir, 'install', `DESTDIR=${destdir}`);
        assert.equal(result.status, 0, result.stdout + result.stderr);
        assert.deepEqual(fs.readdirSync(extensionDir).sort(), SHIPPED);
      } finally {
        source.rm();
      }
    },
  );
});

describe('the update paths', () => {
  test(`PostgreSQL sees one direct script from each earlier version to ${CURRENT}`, async () => {
    const db = await database();
    try {
      const { rows } = await db.query(
        `SELECT source, target, path FROM pg_extension_update_paths('pg_lease')
          WHERE path IS NOT NULL ORDER BY 1, 2`,
      );
      assert.deepEqual(rows, [
        // The stale step this file's server carries (see STALE_STEP).
        { source: '0.1.0', target: '0.2.0', path: '0.1.0--0.2.0' },
        ...EARLIER.map((from) => ({ source: from, target: CURRENT, path: `${from}--${CURRENT}` })),
      ]);
    } finally {
      await db.end();
    }
  });

  for (const from of EARLIER) {
    test(`ALTER EXTENSION pg_lease UPDATE TO '${CURRENT}' from ${from} runs the direct script`, async () => {
      const db = await database();
      try {
        await db.query(`CREATE EXTENSION pg_lease VERSION '${from}'`);
        // From 0.1.0 a path through 0.2.0 exists too (STALE_STEP), and taking it would fail.
        await db.query(`ALTER EXTENSION pg_lease UPDATE TO '${CURRENT}'`);
        assert.equal(await extversion(db), CURRENT);
      } finally {
        await db.end();
      }
    });
  }
});

for (const from of EARLIER) {
  describe(`ALTER EXTENSION pg_lease UPDATE from ${from}`, () => {
    test(`gives exactly the catalog of a fresh ${CURRENT} install`, async () => {
      const fresh = await database();
      const updated = await database();
      try {
        await fresh.query('CREATE EXTENSION pg_lease');
        await updated.query(`CREATE EXTENSION pg_lease VERSION '${from}'`);
        assert.equal(await extversion(updated), from);
        await updated.query('ALTER EXTENSION pg_lease UPDATE');
        const want = await catalog(fresh);
        assert.ok(want.length > 20, 'the catalog query sees the objects');
        assert.deepEqual(await catalog(updated), want);
      } finally {
        await fresh.end();
        await updated.end();
      }
    });

    test('a holder keeps renewing through the update, and a renew that waits for it goes through', async () => {
      const url = await cluster.createDatabase(undefined, { extension: false });
      const holder = new pg.Client({ connectionString: url });
      const admin = new pg.Client({ connectionString: url });
      await holder.connect();
      await admin.connect();
      try {
        await admin.query(`CREATE EXTENSION pg_lease VERSION '${from}'`);
        const { rows } = await holder.query(`SELECT epoch FROM lease.acquire('job', 'w', '10 s')`);
        const epoch = rows[0].epoch as string;
        let renewing = true;
        const statuses: string[] = [];
        const loop = (async () => {
          while (renewing) {
            const r = await holder.query(
              `SELECT status FROM lease.renew('job', 'w', $1, '10 s')`,
              [epoch],
            );
            statuses.push(r.rows[0].status);
          }
        })();
        await new Promise((resolve) => setTimeout(resolve, 100));
        await admin.query('ALTER EXTENSION pg_lease UPDATE');
        const countAtUpdate = statuses.length;
        while (statuses.length < countAtUpdate + 20) {
          await new Promise((resolve) => setTimeout(resolve, 10));
        }
        renewing = false;
        await loop;
        assert.ok(countAtUpdate > 0, 'renewals ran before the update');
        assert.deepEqual(new Set(statuses), new Set(['ok']));
        assert.equal(await extversion(admin), CURRENT);
        const state = await admin.query(`SELECT held, owner, epoch FROM lease.inspect('job')`);
        assert.deepEqual(state.rows, [{ held: true, owner: 'w', epoch: epoch }]);
      } finally {
        await holder.end();
        await admin.end();
      }
    });
  });
}

/** The relation files of the state, which an update must neither rewrite nor rebuild. */
async function stateFiles(db: pg.Client, withFloor: boolean): Promise<unknown[]> {
  const relations = ['lease.leases', 'lease.leases_pkey'];
  if (withFloor) relations.push('lease.epoch_floor', 'lease.epoch_floor_pkey');
  const { rows } = await db.query(
    `SELECT r AS relation, pg_relation_filenode(r::regclass) AS filenode
       FROM unnest($1::text[]) AS r ORDER BY 1`,
    [relations],
  );
  return rows;
}

describe('ALTER EXTENSION pg_lease UPDATE from 0.1.0 keeps the state', () => {
  test('keeps held, released and lapsed leases with their owner, epoch and expiry', async () => {
    const db = await database();
    try {
      await db.query(`CREATE EXTENSION pg_lease VERSION '0.1.0'`);
      await db.query(`SELECT lease.acquire('held', 'a', '1 hour')`);
      await db.query(`SELECT lease.acquire('released', 'a', '1 hour')`);
      await db.query(`SELECT lease.release('released', 'a', 1)`);
      await db.query(`SELECT lease.acquire('lapsed', 'a', '1 millisecond')`);
      for (let i = 0; i < 3; i++) {
        const { rows } = await db.query(`SELECT epoch FROM lease.acquire('bumped', 'a', '1 hour')`);
        await db.query(`SELECT lease.release('bumped', 'a', $1)`, [rows[0].epoch]);
      }
      await db.query(`SELECT pg_sleep(0.01)`);
      const before = (await db.query(`SELECT * FROM lease.leases ORDER BY key`)).rows;
      const filesBefore = await stateFiles(db, false);
      await db.query('ALTER EXTENSION pg_lease UPDATE');
      assert.equal(await extversion(db), CURRENT);
      // The columns became domains without a rewrite of the table or a rebuild of its index.
      assert.deepEqual(await stateFiles(db, false), filesBefore);
      const afterUpdate = (
        await db.query(`SELECT key, owner, epoch, expires_at FROM lease.leases ORDER BY key`)
      ).rows;
      assert.deepEqual(afterUpdate, before);
      // 0.2.0 added released_at: keys free at the update count as released then (for purge).
      const released = await db.query(
        `SELECT key FROM lease.leases WHERE released_at IS NOT NULL ORDER BY key`,
      );
      assert.deepEqual(
        released.rows.map((r) => r.key),
        ['bumped', 'released'],
      );
      const seen = await db.query(
        `SELECT k, i.* FROM unnest(ARRAY['held', 'released', 'lapsed', 'bumped']) AS k,
                LATERAL lease.inspect(k) AS i ORDER BY k`,
      );
      assert.deepEqual(
        seen.rows.map((r) => [r.k, r.held, r.owner, String(r.epoch)]),
        [
          ['bumped', false, null, '6'],
          ['held', true, 'a', '1'],
          ['lapsed', false, null, '1'],
          ['released', false, null, '2'],
        ],
      );
      // Epochs go on from where 0.1.0 left them.
      const next = await db.query(
        `SELECT k, a.epoch FROM unnest(ARRAY['released', 'lapsed', 'bumped']) AS k,
                LATERAL lease.acquire(k, 'b', '1 hour') AS a ORDER BY k`,
      );
      assert.deepEqual(
        next.rows.map((r) => [r.k, String(r.epoch)]),
        [
          ['bumped', '7'],
          ['lapsed', '2'],
          ['released', '3'],
        ],
      );
    } finally {
      await db.end();
    }
  });
});

// 0.2.0 and 0.2.1 have the same tables.
for (const from of ['0.2.0', '0.2.1'] as const) {
  describe(`ALTER EXTENSION pg_lease UPDATE from ${from} keeps the state`, () => {
    test('keeps held, released, lapsed and purged keys: owner, epoch, expiry, release time and the epoch floor', async () => {
      const db = await database();
      try {
        await db.query(`CREATE EXTENSION pg_lease VERSION '${from}'`);
        // Each release moves the key's epoch on by one, as a grant does.
        const grantAndRelease = async (key: string) => {
          const { rows } = await db.query(`SELECT epoch FROM lease.acquire($1, 'a', '1 hour')`, [
            key,
          ]);
          const released = await db.query(`SELECT status FROM lease.release($1, 'a', $2)`, [
            key,
            rows[0].epoch,
          ]);
          assert.equal(released.rows[0].status, 'ok');
        };
        // A key granted twice (epochs 1 and 3, released at 4) and purged: the floor is 4.
        await grantAndRelease('purged');
        await grantAndRelease('purged');
        assert.equal((await db.query(`SELECT lease.purge('0 seconds') AS n`)).rows[0].n, '1');
        await db.query(`SELECT lease.acquire('held', 'a', '1 hour')`);
        await grantAndRelease('released');
        await db.query(`SELECT lease.acquire('lapsed', 'a', '1 millisecond')`);
        for (let i = 0; i < 3; i++) await grantAndRelease('bumped');
        await db.query(`SELECT pg_sleep(0.01)`);
        // 0.2.0's columns, so that a column a later version adds does not count as a change.
        const rowsQuery = `SELECT key, owner, epoch, expires_at, released_at, watched_until
                             FROM lease.leases ORDER BY key`;
        const floorQuery = `SELECT * FROM lease.epoch_floor`;
        const before = (await db.query(rowsQuery)).rows;
        const floorBefore = (await db.query(floorQuery)).rows;
        assert.deepEqual(floorBefore, [{ singleton: true, epoch: '4' }]);
        const filesBefore = await stateFiles(db, true);
        await db.query('ALTER EXTENSION pg_lease UPDATE');
        assert.equal(await extversion(db), CURRENT);
        assert.deepEqual(await stateFiles(db, true), filesBefore);
        assert.deepEqual((await db.query(rowsQuery)).rows, before);
        assert.deepEqual((await db.query(floorQuery)).rows, floorBefore);
        const seen = await db.query(
          `SELECT k, i.* FROM unnest(ARRAY['held', 'released', 'lapsed', 'bumped', 'purged']) AS k,
                  LATERAL lease.inspect(k) AS i ORDER BY k`,
        );
        // A purged key has no row, like a key never granted: inspect answers nothing for it.
        assert.deepEqual(
          seen.rows.map((r) => [r.k, r.held, r.owner, String(r.epoch)]),
          [
            ['bumped', false, null, '10'],
            ['held', true, 'a', '5'],
            ['lapsed', false, null, '5'],
            ['released', false, null, '6'],
          ],
        );
        // Epochs go on from where the earlier version left them; the purged key starts above the floor.
        const next = await db.query(
          `SELECT k, a.epoch FROM unnest(ARRAY['released', 'lapsed', 'bumped', 'purged']) AS k,
                  LATERAL lease.acquire(k, 'b', '1 hour') AS a ORDER BY k`,
        );
        assert.deepEqual(
          next.rows.map((r) => [r.k, String(r.epoch)]),
          [
            ['bumped', '11'],
            ['lapsed', '6'],
            ['purged', '5'],
            ['released', '7'],
          ],
        );
      } finally {
        await db.end();
      }
    });
  });
}
