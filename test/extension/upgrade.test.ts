/**
 * SEMANTICS.md §10 "Install and upgrade safety": 0.1.0 is no longer installable, and
 * `ALTER EXTENSION pg_lease UPDATE` from it gives exactly the objects of a fresh 0.2.0 while every
 * lease keeps its owner, epoch and expiry. The released 0.1.0 script exists only as the test
 * fixture extension/test/fixtures/pg_lease--0.1.0.sql, staged into this file's private server.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { PgCluster } from 'pg-lease-testing';
import { PACKAGE_ROOT, extensionFiles } from 'pg-lease-testing';

export const FIXTURE_0_1_0 = path.join(
  PACKAGE_ROOT,
  'extension',
  'test',
  'fixtures',
  'pg_lease--0.1.0.sql',
);

/** Every catalog fact about pg_lease's objects that an update must reproduce. */
export const CATALOG_QUERY = `
  WITH members AS (
    SELECT d.classid, d.objid
      FROM pg_depend d
     WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
       AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_lease'))
  SELECT 'member' AS kind, pg_describe_object(m.classid, m.objid, 0) AS name, NULL AS detail
    FROM members m
  UNION ALL
  SELECT 'function', p.oid::regprocedure::text,
         concat_ws(' | ', pg_get_functiondef(p.oid), p.proacl::text, p.proowner::regrole::text,
                   obj_description(p.oid, 'pg_proc'))
    FROM pg_proc p WHERE p.pronamespace = 'lease'::regnamespace
  UNION ALL
  SELECT 'relation', c.oid::regclass::text,
         concat_ws(' | ', c.relkind, c.relacl::text, c.reloptions::text, c.relowner::regrole::text,
                   obj_description(c.oid, 'pg_class'))
    FROM pg_class c WHERE c.relnamespace = 'lease'::regnamespace
  UNION ALL
  SELECT 'column', a.attrelid::regclass::text || '.' || a.attname,
         concat_ws(' | ', format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attnum,
                   a.attcollation::regcollation::text, pg_get_expr(ad.adbin, ad.adrelid))
    FROM pg_attribute a
    JOIN pg_class c ON c.oid = a.attrelid
    LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
   WHERE c.relnamespace = 'lease'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
  UNION ALL
  SELECT 'constraint',
         coalesce(nullif(conrelid, 0)::regclass::text, contypid::regtype::text) || '.' || conname,
         pg_get_constraintdef(oid)
    FROM pg_constraint WHERE connamespace = 'lease'::regnamespace
  UNION ALL
  SELECT 'type', t.oid::regtype::text,
         concat_ws(' | ', t.typtype, format_type(t.typbasetype, t.typtypmod), t.typnotnull,
                   t.typcollation::regcollation::text, t.typacl::text, t.typowner::regrole::text)
    FROM pg_type t WHERE t.typnamespace = 'lease'::regnamespace AND t.typtype = 'd'
  UNION ALL
  SELECT 'index', indexrelid::regclass::text, pg_get_indexdef(indexrelid)
    FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
   WHERE c.relnamespace = 'lease'::regnamespace
  UNION ALL
  SELECT 'trigger', t.tgrelid::regclass::text || '.' || t.tgname,
         pg_get_triggerdef(t.oid) || ' | ' || t.tgenabled::text
    FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
   WHERE c.relnamespace = 'lease'::regnamespace
  UNION ALL
  SELECT 'schema', nspname, concat_ws(' | ', nspowner::regrole::text, nspacl::text)
    FROM pg_namespace WHERE nspname = 'lease'
  UNION ALL
  SELECT 'extension', extname,
         concat_ws(' | ', extversion, extnamespace::regnamespace::text, extrelocatable,
                   extconfig::text, extowner::regrole::text)
    FROM pg_extension WHERE extname = 'pg_lease'
  ORDER BY 1, 2`;

let cluster: PgCluster;
before(async () => {
  cluster = await PgCluster.start({ extraExtensionFiles: [FIXTURE_0_1_0] });
});
after(() => cluster?.destroy());

async function database(): Promise<pg.Client> {
  const url = await cluster.createDatabase(undefined, { extension: false });
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  return client;
}

async function catalog(client: pg.Client): Promise<unknown[]> {
  return (await client.query(CATALOG_QUERY)).rows;
}

describe('shipped versions', () => {
  test('the package ships the 0.2.1 install script and an update from 0.1.0 and from 0.2.0, not the 0.1.0 install script', () => {
    const shipped = extensionFiles().map((file) => path.basename(file));
    assert.deepEqual(shipped.sort(), [
      'pg_lease--0.1.0--0.2.1.sql',
      'pg_lease--0.2.0--0.2.1.sql',
      'pg_lease--0.2.1.sql',
      'pg_lease.control',
    ]);
  });

  test('a server with the shipped files offers only 0.2.1 to CREATE EXTENSION', async () => {
    await using plain = await PgCluster.start();
    const { rows } = await plain.query(
      `SELECT version FROM pg_available_extension_versions WHERE name = 'pg_lease' ORDER BY 1`,
    );
    assert.deepEqual(rows, [{ version: '0.2.1' }]);
    await plain.query('CREATE DATABASE v');
    await assert.rejects(
      plain.query(`CREATE EXTENSION pg_lease VERSION '0.1.0'`, [], 'v'),
      /has no installation script nor update path for version "0\.1\.0"/,
    );
    await plain.query('CREATE EXTENSION pg_lease', [], 'v');
    const version = await plain.query(
      `SELECT extversion FROM pg_extension WHERE extname = 'pg_lease'`,
      [],
      'v',
    );
    assert.deepEqual(version.rows, [{ extversion: '0.2.1' }]);
  });
});

describe('make install', () => {
  const pgConfig = spawnSync('pg_config', ['--sharedir'], { encoding: 'utf8' });
  const available = pgConfig.status === 0 && spawnSync('make', ['--version']).status === 0;
  test(
    'removes a pg_lease--0.1.0.sql left by an earlier install, so 0.1.0 stays uninstallable',
    { skip: !available && !process.env.CI && 'needs make and pg_config' },
    () => {
      const destdir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-lease-destdir-'));
      try {
        const extensionDir = path.join(destdir, pgConfig.stdout.trim(), 'extension');
        fs.mkdirSync(extensionDir, { recursive: true });
        fs.writeFileSync(path.join(extensionDir, 'pg_lease--0.1.0.sql'), '-- stale\n');
        const make = spawnSync(
          'make',
          ['-s', '-C', path.join(PACKAGE_ROOT, 'extension'), 'install', `DESTDIR=${destdir}`],
          { encoding: 'utf8' },
        );
        assert.equal(make.status, 0, make.stderr);
        assert.deepEqual(fs.readdirSync(extensionDir).sort(), [
          'pg_lease--0.1.0--0.2.1.sql',
          'pg_lease--0.2.0--0.2.1.sql',
          'pg_lease--0.2.1.sql',
          'pg_lease.control',
        ]);
      } finally {
        fs.rmSync(destdir, { recursive: true, force: true });
      }
    },
  );
});

describe('ALTER EXTENSION pg_lease UPDATE from 0.1.0', () => {
  test('gives exactly the catalog of a fresh 0.2.1 install', async () => {
    const fresh = await database();
    const updated = await database();
    try {
      await fresh.query('CREATE EXTENSION pg_lease');
      await updated.query(`CREATE EXTENSION pg_lease VERSION '0.1.0'`);
      await updated.query('ALTER EXTENSION pg_lease UPDATE');
      const want = await catalog(fresh);
      assert.ok(want.length > 20, 'the catalog query sees the objects');
      assert.deepEqual(await catalog(updated), want);
    } finally {
      await fresh.end();
      await updated.end();
    }
  });

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
      const files = `SELECT pg_relation_filenode('lease.leases') AS heap,
                            pg_relation_filenode('lease.leases_pkey') AS pkey`;
      const filesBefore = (await db.query(files)).rows;
      await db.query('ALTER EXTENSION pg_lease UPDATE');
      // The columns became domains without a rewrite of the table or a rebuild of its index.
      assert.deepEqual((await db.query(files)).rows, filesBefore);
      const afterUpdate = (
        await db.query(`SELECT key, owner, epoch, expires_at FROM lease.leases ORDER BY key`)
      ).rows;
      assert.deepEqual(afterUpdate, before);
      // 0.2.0 adds released_at: keys free at the update count as released then (for purge).
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

  test('a holder keeps renewing through the update, and a renew that waits for it goes through', async () => {
    const url = await cluster.createDatabase(undefined, { extension: false });
    const holder = new pg.Client({ connectionString: url });
    const admin = new pg.Client({ connectionString: url });
    await holder.connect();
    await admin.connect();
    try {
      await admin.query(`CREATE EXTENSION pg_lease VERSION '0.1.0'`);
      const { rows } = await holder.query(`SELECT epoch FROM lease.acquire('job', 'w', '10 s')`);
      const epoch = rows[0].epoch as string;
      let renewing = true;
      const statuses: string[] = [];
      const loop = (async () => {
        while (renewing) {
          const r = await holder.query(`SELECT status FROM lease.renew('job', 'w', $1, '10 s')`, [
            epoch,
          ]);
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
      const version = await admin.query(`SELECT extversion FROM pg_extension WHERE extname = 'pg_lease'`);
      assert.equal(version.rows[0].extversion, '0.2.1');
      const state = await admin.query(`SELECT held, owner, epoch FROM lease.inspect('job')`);
      assert.deepEqual(state.rows, [{ held: true, owner: 'w', epoch: epoch }]);
    } finally {
      await holder.end();
      await admin.end();
    }
  });
});
