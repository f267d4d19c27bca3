import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { LeaseClient } from '../../src/index.js';
import { PACKAGE_ROOT } from 'pg-lease-testing';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { createRole } from '../support/roles.js';
import { CURRENT_VERSION } from '../support/releases.js';

import { parseJson, runCli } from './helpers.js';

/** The current version as it appears in the CLI's messages, for a RegExp. */
const CURRENT_PATTERN = CURRENT_VERSION.replaceAll('.', '\\.');

let viaExtension: TestDatabase;
let viaBundle: TestDatabase;

before(async () => {
  viaExtension = await createTestDatabase({ extension: false });
  viaBundle = await createTestDatabase({ extension: false });
});
after(async () => {
  await viaExtension.close();
  await viaBundle.close();
});

/** Everything pg_lease puts in schema lease, described by the catalogs, in a stable order. */
async function leaseObjects(pool: pg.Pool): Promise<string[]> {
  const { rows } = await pool.query<{ line: string }>(`
    SELECT 'schema acl ' || coalesce(nspacl::text, '') AS line
      FROM pg_namespace WHERE nspname = 'lease'
    UNION ALL
    SELECT 'function ' || p.oid::regprocedure::text || E'\\n' || pg_get_functiondef(p.oid)
           || E'\\nacl ' || coalesce(p.proacl::text, '')
           || E'\\ncomment ' || coalesce(obj_description(p.oid, 'pg_proc'), '')
      FROM pg_proc p WHERE p.pronamespace = 'lease'::regnamespace
    UNION ALL
    SELECT 'table ' || c.relname || ' ' || c.relkind::text || ' ' || coalesce(c.reloptions::text, '')
           || ' acl ' || coalesce(c.relacl::text, '')
           || ' comment ' || coalesce(obj_description(c.oid, 'pg_class'), '')
      FROM pg_class c WHERE c.relnamespace = 'lease'::regnamespace
    UNION ALL
    SELECT 'column ' || a.attrelid::regclass::text || '.' || a.attname || ' '
           || format_type(a.atttypid, a.atttypmod) || ' ' || coalesce(co.collname, '')
           || ' not null ' || a.attnotnull
      FROM pg_attribute a
      JOIN pg_class c ON c.oid = a.attrelid
      LEFT JOIN pg_collation co ON co.oid = a.attcollation
     WHERE c.relnamespace = 'lease'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT 'constraint ' || conname || ' ' || pg_get_constraintdef(oid)
      FROM pg_constraint WHERE connamespace = 'lease'::regnamespace
    ORDER BY 1`);
  return rows.map((row) => row.line);
}

describe('pg-lease install', () => {
  test('installs the extension with CREATE EXTENSION and reports its version', async () => {
    const result = await runCli(['install', '--url', viaExtension.url]);
    assert.equal(result.code, 0, result.stderr);
    assert.match(
      result.stdout,
      new RegExp(`^installed pg_lease ${CURRENT_PATTERN} as an extension$`, 'm'),
    );
    const { rows } = await viaExtension.pool.query<{ extversion: string }>(
      "SELECT extversion FROM pg_extension WHERE extname = 'pg_lease'",
    );
    assert.deepEqual(rows, [{ extversion: CURRENT_VERSION }]);
    const again = await runCli(['install', '--url', viaExtension.url, '--json']);
    assert.equal(again.code, 0, again.stderr);
    assert.deepEqual(parseJson(again), {
      version: CURRENT_VERSION,
      method: 'extension',
      created: false,
    });
  });

  test('--from-bundle installs the same objects without an extension, in working order', async () => {
    const result = await runCli(['install', '--url', viaBundle.url, '--from-bundle', '--json']);
    assert.equal(result.code, 0, result.stderr);
    assert.deepEqual(parseJson(result), {
      version: CURRENT_VERSION,
      method: 'bundle',
      created: true,
    });
    const { rows } = await viaBundle.pool.query(
      "SELECT 1 FROM pg_extension WHERE extname = 'pg_lease'",
    );
    assert.equal(rows.length, 0);

    if ((await leaseObjects(viaExtension.pool)).length === 0)
      await runCli(['install', '--url', viaExtension.url]);
    const expected = await leaseObjects(viaExtension.pool);
    assert.ok(expected.length > 10, expected.join('\n'));
    assert.deepEqual(await leaseObjects(viaBundle.pool), expected);

    const client = new LeaseClient(viaBundle.pool);
    const lease = (await client.acquire('bundled', { ttl: '30s' }))!;
    assert.equal(lease.epoch, 1n);
    await lease.renew();
    assert.equal(await lease.release(), 'ok');
    assert.equal((await client.inspect('bundled'))?.epoch, 2n);
  });

  test('reports a bundle install as installed on the next run, with either method', async () => {
    const bundle = await runCli(['install', '--url', viaBundle.url, '--from-bundle']);
    assert.equal(bundle.code, 0, bundle.stderr);
    assert.match(
      bundle.stdout,
      new RegExp(`pg_lease ${CURRENT_PATTERN} is already installed \\(from the bundled script\\)`),
    );
    const plain = await runCli(['install', '--url', viaBundle.url]);
    assert.equal(plain.code, 0, plain.stderr);
    assert.match(plain.stdout, /already installed \(from the bundled script\)/);
  });

  test('--from-bundle refuses a schema named lease that it did not create', async () => {
    const other = await createTestDatabase({ extension: false });
    try {
      await other.pool.query('CREATE SCHEMA lease');
      const result = await runCli(['install', '--url', other.url, '--from-bundle']);
      assert.equal(result.code, 1);
      assert.match(result.stderr, /schema "lease" already exists/);
      const { rows } = await other.pool.query(
        "SELECT 1 FROM pg_proc WHERE pronamespace = 'lease'::regnamespace",
      );
      assert.equal(rows.length, 0);
    } finally {
      await other.close();
    }
  });

  for (const from of ['0.1.0', '0.2.0', '0.2.1'] as const)
    test(`--from-bundle updates a ${from} bundle install to the same objects, keeping every lease, and says so`, async () => {
      const old = await createTestDatabase({ extension: false });
      try {
        // What the package's `install --from-bundle` did in that version (the released install
        // script is a test fixture; neither had a pg_extension_config_dump call to remove).
        const script = fs
          .readFileSync(
            path.join(PACKAGE_ROOT, `extension/test/fixtures/pg_lease--${from}.sql`),
            'utf8',
          )
          .replace(/^\\echo .*$/m, '');
        const client = await old.pool.connect();
        try {
          await client.query('BEGIN');
          await client.query('CREATE SCHEMA lease');
          if (from === '0.1.0') await client.query('SET LOCAL search_path = lease, pg_catalog');
          await client.query(script);
          await client.query(
            `COMMENT ON SCHEMA lease IS 'pg_lease ${from} (installed from the pg-lease npm bundle)'`,
          );
          await client.query('COMMIT');
        } finally {
          client.release();
        }
        await old.pool.query(`SELECT lease.acquire('held', 'a', '1 hour')`);
        await old.pool.query(`SELECT lease.acquire('released', 'a', '1 hour')`);
        await old.pool.query(`SELECT lease.release('released', 'a', 1)`);
        // The 0.1.0 columns; 0.2.0 adds released_at (set for keys free at the update).
        const rows = 'SELECT key, owner, epoch, expires_at FROM lease.leases ORDER BY key';
        const before = (await old.pool.query(rows)).rows;

        const result = await runCli(['install', '--url', old.url, '--from-bundle', '--json']);
        assert.equal(result.code, 0, result.stderr);
        assert.deepEqual(parseJson(result), {
          version: CURRENT_VERSION,
          method: 'bundle',
          created: false,
          updatedFrom: from,
        });
        const text = await runCli(['install', '--url', old.url, '--from-bundle']);
        assert.match(text.stdout, new RegExp(`pg_lease ${CURRENT_PATTERN} is already installed`));
        assert.deepEqual((await old.pool.query(rows)).rows, before);
        if ((await leaseObjects(viaBundle.pool)).length === 0)
          await runCli(['install', '--url', viaBundle.url, '--from-bundle']);
        assert.deepEqual(await leaseObjects(old.pool), await leaseObjects(viaBundle.pool));
        const renewed = await old.pool.query(
          `SELECT status FROM lease.renew('held', 'a', 1, '1 hour')`,
        );
        assert.equal(renewed.rows[0].status, 'ok');
      } finally {
        await old.close();
      }
    });

  test('refuses to downgrade a newer bundle install, naming both versions', async () => {
    const newer = await createTestDatabase({ extension: false });
    try {
      await runCli(['install', '--url', newer.url, '--from-bundle']);
      await newer.pool.query(
        `COMMENT ON SCHEMA lease IS 'pg_lease 9.0.0 (installed from the pg-lease npm bundle)'`,
      );
      const result = await runCli(['install', '--url', newer.url, '--from-bundle']);
      assert.equal(result.code, 1);
      assert.match(
        result.stderr,
        new RegExp(
          `pg_lease 9\\.0\\.0 is installed, newer than the ${CURRENT_PATTERN} .*downgrades are not supported`,
        ),
      );
    } finally {
      await newer.close();
    }
  });

  test('a schema lease made by another role and labelled as a bundle install is not taken for pg_lease', async () => {
    const forged = await createTestDatabase({ extension: false });
    const mallory = await createRole(forged, 'GRANT CREATE ON DATABASE %D TO %I');
    try {
      const client = await mallory.connect();
      await client.query(`CREATE SCHEMA lease;
        COMMENT ON SCHEMA lease IS 'pg_lease ${CURRENT_VERSION} (installed from the pg-lease npm bundle)';
        GRANT USAGE ON SCHEMA lease TO PUBLIC;
        CREATE FUNCTION lease.acquire(p_key text, p_owner text, p_ttl interval, p_wait interval DEFAULT '0')
          RETURNS TABLE (acquired boolean, epoch bigint, expires_at timestamptz)
          LANGUAGE sql AS $$ SELECT true, 1::bigint, now() + p_ttl $$`);
      for (const args of [['--from-bundle'], []]) {
        const result = await runCli(['install', '--url', forged.url, ...args]);
        assert.equal(result.code, 1, result.stdout);
        assert.match(result.stderr, new RegExp(`bundle install owned by role ${mallory.name}`));
      }
      // The same, made by the installing role itself but with a function of another role in it.
      await client.query('DROP SCHEMA lease CASCADE');
      await forged.pool.query(`CREATE SCHEMA lease;
        COMMENT ON SCHEMA lease IS 'pg_lease ${CURRENT_VERSION} (installed from the pg-lease npm bundle)';
        GRANT CREATE, USAGE ON SCHEMA lease TO ${mallory.name}`);
      await client.query(
        `CREATE FUNCTION lease.inspect(p_key text) RETURNS boolean LANGUAGE sql AS 'SELECT true'`,
      );
      const mixed = await runCli(['install', '--url', forged.url, '--from-bundle']);
      assert.equal(mixed.code, 1);
      assert.match(mixed.stderr, /not all of its objects belong to its owner/);
    } finally {
      await forged.pool.query('DROP SCHEMA IF EXISTS lease CASCADE');
      await mallory.drop();
      await forged.close();
    }
  });
});
