/**
 * SEMANTICS.md §1 and §8: what CREATE EXTENSION pg_lease makes (one schema, one table, four
 * functions), that a non-superuser with CREATE on the database installs it (trusted), and that
 * DROP EXTENSION takes all state with it so a re-install starts every key at epoch 1.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { PACKAGE_ROOT } from 'pg-lease-testing';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { acquire, inspect, leaseTable, pgError, release } from '../support/lease-calls.js';
import { CURRENT_VERSION } from '../support/releases.js';
import { createRole, type TestRole } from '../support/roles.js';

const API = [
  {
    signature: 'lease.acquire(text,text,interval,interval)',
    result: 'TABLE(acquired boolean, epoch bigint, expires_at timestamp with time zone)',
  },
  {
    signature: 'lease.renew(text,text,bigint,interval)',
    result: 'TABLE(status text, expires_at timestamp with time zone)',
  },
  { signature: 'lease.release(text,text,bigint)', result: 'TABLE(status text)' },
  {
    signature: 'lease.inspect(text)',
    result: 'TABLE(held boolean, owner text, epoch bigint, expires_at timestamp with time zone)',
  },
  { signature: 'lease.fence(text,bigint)', result: 'void' },
  { signature: 'lease.fence_row()', result: 'trigger' },
];

describe('what CREATE EXTENSION makes', () => {
  let db: TestDatabase;
  before(async () => {
    db = await createTestDatabase();
  });
  after(() => db.close());

  test('the extension lives in schema lease and is not relocatable', async () => {
    const { rows } = await db.pool.query(
      `SELECT e.extnamespace::regnamespace::text AS schema, e.extrelocatable, e.extversion
         FROM pg_extension e WHERE e.extname = 'pg_lease'`,
    );
    assert.deepEqual(rows, [{ schema: 'lease', extrelocatable: false, extversion: CURRENT_VERSION }]);
    const error = await pgError(db.pool.query('ALTER EXTENSION pg_lease SET SCHEMA public'));
    assert.equal(error.code, '0A000');
  });

  test('the control file marks the extension trusted', async () => {
    const { rows } = await db.pool.query(
      `SELECT trusted, relocatable, schema FROM pg_available_extension_versions
        WHERE name = 'pg_lease' AND version = $1`,
      [CURRENT_VERSION],
    );
    assert.deepEqual(rows, [{ trusted: true, relocatable: false, schema: 'lease' }]);
  });

  test('every named argument a function comment shows (name => value) is a parameter of that function', async () => {
    // What \df+ shows a DBA must run as written: a wrong name is 42883.
    const { rows } = await db.pool.query<{ fn: string; comment: string; args: string[] }>(
      `SELECT p.oid::regprocedure::text AS fn, d.description AS comment,
              coalesce(p.proargnames, '{}') AS args
         FROM pg_proc p JOIN pg_description d ON d.objoid = p.oid AND d.classoid = 'pg_proc'::regclass
        WHERE p.pronamespace = 'lease'::regnamespace`,
    );
    let named = 0;
    for (const { fn, comment, args } of rows)
      for (const [, name] of comment.matchAll(/([A-Za-z_][A-Za-z0-9_]*)\s*=>/g)) {
        named++;
        assert.ok(args.includes(name!), `${fn}: its comment names "${name} =>", its parameters are ${args.join(', ')}`);
      }
    assert.ok(named >= 5, `only ${named} named arguments in the comments: the pattern finds nothing`);
  });

  test('the table refuses a row that breaks a rule, even from a superuser writing it directly', async () => {
    const key = `direct-write-${process.pid}`;
    const grant = await acquire(db.pool, key, 'holder', '1 min');
    const writes: [string, unknown[]][] = [
      ["UPDATE lease.leases SET key = '' WHERE key = $1", [key]],
      ['UPDATE lease.leases SET key = repeat($2, 1001) WHERE key = $1', [key, 'k']],
      ['UPDATE lease.leases SET owner = repeat($2, 1001) WHERE key = $1', [key, 'o']],
      ["UPDATE lease.leases SET owner = '' WHERE key = $1", [key]],
      ['UPDATE lease.leases SET epoch = 0 WHERE key = $1', [key]],
      // The rule across owner and expires_at has no constraint (install.sql: the write core
      // holds it, at 23k instructions less per write); history.test.ts reads every row for it.
    ];
    for (const [sql, values] of writes) {
      const error = await pgError(db.pool.query(sql, values));
      assert.equal(error.code, '23514', `${sql}: ${error.message}`);
    }
    assert.deepEqual(await inspect(db.pool, key), {
      held: true,
      owner: 'holder',
      epoch: grant.epoch,
      expiresAt: grant.expiresAt,
    });
    await release(db.pool, key, 'holder', grant.epoch);
  });

  test('no other role may use the domains, so no table of theirs can hold up DROP EXTENSION', async () => {
    const role = await createRole(db, 'GRANT CREATE ON DATABASE %D TO %I');
    try {
      const client = await role.connect();
      await client.query('CREATE SCHEMA mine');
      for (const domain of ['lease.key_text', 'lease.owner_text', 'lease.epoch_number']) {
        const error = await pgError(client.query(`CREATE TABLE mine.t (c ${domain})`));
        assert.equal(error.code, '42501', `${domain}: ${error.message}`);
      }
      await client.query('DROP SCHEMA mine');
    } finally {
      await role.drop();
    }
  });

  test("the one table has the contract's columns with key as primary key", async () => {
    const table = await leaseTable(db.pool);
    const { rows } = await db.pool.query(
      `SELECT a.attname AS name,
              format_type(CASE t.typtype WHEN 'd' THEN t.typbasetype ELSE a.atttypid END, a.atttypmod) AS type,
              a.attnotnull AS not_null
         FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
        WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped
          AND a.attname IN ('key', 'owner', 'epoch', 'expires_at')
        ORDER BY a.attname`,
      [table],
    );
    assert.deepEqual(rows, [
      { name: 'epoch', type: 'bigint', not_null: true },
      { name: 'expires_at', type: 'timestamp with time zone', not_null: false },
      { name: 'key', type: 'text', not_null: true },
      { name: 'owner', type: 'text', not_null: false },
    ]);
    // The single-column rules are domains over those types; the table has no CHECK of its own.
    const rules = await db.pool.query<{ on: string; rule: string }>(
      `SELECT coalesce(nullif(conrelid, 0)::regclass::text, contypid::regtype::text) AS on,
              pg_get_constraintdef(oid) AS rule
         FROM pg_constraint
        WHERE contype = 'c' AND (conrelid = $1::regclass OR contypid IN (
              SELECT atttypid FROM pg_attribute WHERE attrelid = $1::regclass))
        ORDER BY 1`,
      [table],
    );
    assert.deepEqual(rules.rows, [
      { on: 'lease.epoch_number', rule: 'CHECK ((VALUE >= 1))' },
      { on: 'lease.key_text', rule: 'CHECK (((octet_length(VALUE) >= 1) AND (octet_length(VALUE) <= 1000)))' },
      { on: 'lease.owner_text', rule: 'CHECK (((octet_length(VALUE) >= 1) AND (octet_length(VALUE) <= 1000)))' },
    ]);
    const pk = await db.pool.query(
      `SELECT array_agg(a.attname::text) AS columns
         FROM pg_constraint c
         JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
        WHERE c.conrelid = $1::regclass AND c.contype = 'p'`,
      [table],
    );
    assert.deepEqual(pk.rows[0].columns, ['key']);
  });

  test('the API functions have the documented signatures, results and wait default', async () => {
    for (const { signature, result } of API) {
      const { rows } = await db.pool.query(
        `SELECT pg_get_function_result(p.oid) AS result, p.pronargdefaults AS defaults
           FROM pg_proc p WHERE p.oid = $1::regprocedure`,
        [signature],
      );
      assert.equal(rows[0].result, result, signature);
      assert.equal(rows[0].defaults, signature.startsWith('lease.acquire') ? 1 : 0, signature);
    }
    const { rows } = await db.pool.query(
      `SELECT pg_get_expr(p.proargdefaults, 0) AS wait_default FROM pg_proc p
        WHERE p.oid = 'lease.acquire(text,text,interval,interval)'::regprocedure`,
    );
    const waitDefault = await db.pool.query(`SELECT (${rows[0].wait_default}) = interval '0' AS zero`);
    assert.equal(waitDefault.rows[0].zero, true, `wait defaults to ${rows[0].wait_default}`);
  });

  test('every API function carries a COMMENT for \\df+', async () => {
    for (const { signature } of API) {
      const { rows } = await db.pool.query(
        `SELECT obj_description($1::regprocedure, 'pg_proc') AS comment`,
        [signature],
      );
      assert.ok((rows[0].comment ?? '').length > 0, `${signature} has no comment`);
    }
  });

  test('no function of the extension is written in C', async () => {
    const { rows } = await db.pool.query(
      `SELECT p.oid::regprocedure::text AS fn, l.lanname
         FROM pg_depend d
         JOIN pg_proc p ON p.oid = d.objid AND d.classid = 'pg_proc'::regclass
         JOIN pg_language l ON l.oid = p.prolang
        WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
          AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_lease')`,
    );
    assert.ok(rows.length >= 4);
    for (const row of rows) assert.ok(['sql', 'plpgsql'].includes(row.lanname), `${row.fn}: ${row.lanname}`);
  });

  test('the install script starts like contrib: a path comment, then the \\echo guard', () => {
    const name = `pg_lease--${CURRENT_VERSION}.sql`;
    const script = path.join(PACKAGE_ROOT, 'extension', 'sql', name);
    const lines = fs.readFileSync(script, 'utf8').split('\n').filter((line) => line.trim() !== '');
    assert.ok(lines[0]!.startsWith('/* ') || lines[0]!.startsWith('--'), lines[0]);
    assert.ok(lines[0]!.includes(name), lines[0]);
    const guard = lines.find((line) => line.startsWith('\\echo'));
    assert.equal(guard, '\\echo Use "CREATE EXTENSION pg_lease" to load this file. \\quit');
  });
});

describe('install by a non-superuser', () => {
  let db: TestDatabase;
  let installer: TestRole;
  before(async () => {
    db = await createTestDatabase({ extension: false });
    installer = await createRole(db, 'GRANT CREATE ON DATABASE %D TO %I');
  });
  after(async () => {
    await installer.drop();
    await db.close();
  });

  test('a role without CREATE on the database cannot install pg_lease', async () => {
    const outsider = await createRole(db);
    try {
      const client = await outsider.connect();
      const error = await pgError(client.query('CREATE EXTENSION pg_lease'));
      assert.equal(error.code, '42501');
    } finally {
      await outsider.drop();
    }
  });

  test('a non-superuser with CREATE on the database installs pg_lease and uses it', async () => {
    const client = await installer.connect();
    const { rows } = await client.query('SELECT rolsuper FROM pg_roles WHERE rolname = current_user');
    assert.equal(rows[0].rolsuper, false);
    await client.query('CREATE EXTENSION pg_lease');
    const granted = await acquire(client, 'installed-by-role', 'worker-a', '1 minute');
    assert.deepEqual([granted.acquired, granted.epoch], [true, 1n]);
    assert.equal((await release(client, 'installed-by-role', 'worker-a', granted.epoch)).status, 'ok');
    assert.equal((await inspect(client, 'installed-by-role'))?.epoch, 2n);
  });

  test('not even the installing non-superuser reads or writes the lease table directly', async () => {
    const client = await installer.connect();
    const table = await leaseTable(client);
    const attempts = [
      `SELECT * FROM ${table}`,
      `INSERT INTO ${table} (key, owner, epoch, expires_at) VALUES ('forged', 'mallory', 1, now() + interval '1 hour')`,
      `UPDATE ${table} SET epoch = 1`,
      `DELETE FROM ${table}`,
      `TRUNCATE ${table}`,
    ];
    const allowed: string[] = [];
    for (const sql of attempts) {
      await client.query('BEGIN');
      try {
        await client.query(sql);
        allowed.push(sql.split(' ')[0]!);
      } catch (error) {
        assert.equal((error as { code?: string }).code, '42501', String(error));
      } finally {
        await client.query('ROLLBACK');
      }
    }
    assert.deepEqual(allowed, [], `the installing role may ${allowed.join(', ')} ${table}`);
  });

  test('the installing role cannot make the API run its own code with privileges it lacks', async () => {
    const client = await installer.connect();
    // The classic attack on SECURITY DEFINER code in a schema the attacker controls: move the
    // extension's schema aside, plant look-alikes of everything it references by name, call it.
    try {
      await client.query('ALTER SCHEMA lease RENAME TO lease_moved');
    } catch (error) {
      assert.equal((error as { code?: string }).code, '42501', String(error));
      return;
    }
    try {
      await client.query('CREATE SCHEMA lease');
      await client.query('CREATE TABLE lease.planted_log (who name, superuser boolean)');
      await client.query(
        `CREATE FUNCTION lease.planted_probe() RETURNS void LANGUAGE sql AS $$
           INSERT INTO lease.planted_log
           SELECT current_user, rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user
         $$`,
      );
      await client.query('GRANT ALL ON SCHEMA lease TO PUBLIC');
      await client.query('GRANT ALL ON lease.planted_log TO PUBLIC');
      await client.query(
        'CREATE TABLE lease.leases (key text PRIMARY KEY, owner text, epoch bigint NOT NULL, expires_at timestamptz)',
      );
      await client.query(
        `CREATE FUNCTION lease.planted_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN PERFORM lease.planted_probe(); RETURN NEW; END $$`,
      );
      await client.query(
        `CREATE TRIGGER planted BEFORE INSERT OR UPDATE ON lease.leases
           FOR EACH ROW EXECUTE FUNCTION lease.planted_trigger()`,
      );
      // Look-alikes of every internal helper the API might call by name.
      const helpers = await client.query(
        `SELECT p.proname, pg_get_function_arguments(p.oid) AS args,
                pg_get_function_result(p.oid) AS result,
                p.proretset OR 'o' = ANY (coalesce(p.proargmodes, '{}')) OR p.prorettype = 'void'::regtype AS bare_return
           FROM pg_proc p
          WHERE p.pronamespace = 'lease_moved'::regnamespace
            AND p.proname NOT IN ('acquire', 'renew', 'release', 'inspect', 'fence', 'fence_row')`,
      );
      for (const helper of helpers.rows) {
        await client.query(
          `CREATE FUNCTION lease.${helper.proname}(${helper.args}) RETURNS ${helper.result}
             LANGUAGE plpgsql AS $$ BEGIN PERFORM lease.planted_probe(); RETURN${helper.bare_return ? '' : ' NULL'}; END $$`,
        );
      }
      // Planted look-alikes may make the API loop; the outcome of each call does not matter.
      await client.query("SET statement_timeout = '2s'");
      for (const call of [
        `SELECT * FROM lease_moved.acquire('planted', 'mallory', '1 minute')`,
        `SELECT * FROM lease_moved.acquire('planted', 'mallory', '1 minute', '100 milliseconds')`,
        `SELECT * FROM lease_moved.renew('planted', 'mallory', 1, '1 minute')`,
        `SELECT * FROM lease_moved.release('planted', 'mallory', 1)`,
        `SELECT * FROM lease_moved.inspect('planted')`,
        `SELECT lease_moved.fence('planted', 1)`,
      ]) {
        await client.query(call).catch(() => undefined);
      }
      const { rows } = await client.query('SELECT who, superuser FROM lease.planted_log');
      for (const row of rows) {
        assert.equal(row.superuser, false, `planted code ran as superuser ${row.who}`);
        assert.equal(row.who, installer.name, `planted code ran as ${row.who}`);
      }
      const self = await client.query('SELECT rolsuper FROM pg_roles WHERE rolname = current_user');
      assert.equal(self.rows[0].rolsuper, false);
    } finally {
      await client.query('RESET statement_timeout').catch(() => undefined);
      // Put things back for the tests after this one.
      await client.query('DROP SCHEMA IF EXISTS lease CASCADE').catch(() => undefined);
      await client.query('ALTER SCHEMA lease_moved RENAME TO lease').catch(() => undefined);
    }
  });

  test('the installing non-superuser drops and re-creates pg_lease, and keys start again at epoch 1', async () => {
    const client = await installer.connect();
    await client.query('CREATE EXTENSION IF NOT EXISTS pg_lease');
    const key = 'dropped-by-role';
    const first = await acquire(client, key, 'worker-a', '1 minute');
    await release(client, key, 'worker-a', first.epoch);
    assert.ok((await inspect(client, key))!.epoch > 1n);
    await client.query('DROP EXTENSION pg_lease');
    await client.query('CREATE EXTENSION pg_lease');
    assert.equal(await inspect(client, key), undefined);
    assert.equal((await acquire(client, key, 'worker-b', '1 minute')).epoch, 1n);
  });
});

describe('DROP EXTENSION', () => {
  let db: TestDatabase;
  before(async () => {
    db = await createTestDatabase();
  });
  after(() => db.close());

  test('DROP EXTENSION removes every object and all state; a re-install starts every key at epoch 1', async () => {
    const keys = ['drop-a', 'drop-b'];
    for (const key of keys) {
      for (let i = 0; i < 3; i++) {
        const granted = await acquire(db.pool, key, 'worker-a', '1 minute');
        await release(db.pool, key, 'worker-a', granted.epoch);
      }
      assert.equal((await inspect(db.pool, key))!.epoch, 6n);
    }
    await db.pool.query('DROP EXTENSION pg_lease');
    const left = await db.pool.query(
      `SELECT c.oid::regclass::text AS name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'lease'
       UNION ALL
       SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'lease'`,
    );
    assert.deepEqual(left.rows, [], 'nothing of pg_lease is left');

    await db.pool.query('CREATE EXTENSION pg_lease');
    for (const key of keys) {
      assert.equal(await inspect(db.pool, key), undefined);
      assert.equal((await acquire(db.pool, key, 'worker-b', '1 minute')).epoch, 1n);
    }
  });
});
