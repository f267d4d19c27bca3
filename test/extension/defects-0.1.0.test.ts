/**
 * The defect classes an adversarial review found in 0.1.0 (SEMANTICS.md §10), each reproduced on
 * the released 0.1.0 script (the fixture) and shown closed (since 0.2.0) on the current version
 * 0.2.1, fresh and updated from 0.1.0:
 *
 *   1. objects planted in a pre-made schema lease steer the install script, which runs as the
 *      bootstrap superuser (privilege escalation);
 *   2. a pre-made schema's ACL survives the install (anyone may create objects in lease);
 *   3. a same-owner acquire under REPEATABLE READ confirms a grant from a stale snapshot;
 *   4. a renew that waited for the row lock decides with the clock it read before the wait;
 *   5. an asynchronous commit of a lease change, by lowering synchronous_commit after the call.
 *
 * Each probe answers "vulnerable or not"; the test asserts vulnerable on 0.1.0 and not on 0.2.1,
 * so a probe that stopped detecting the defect would fail here.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { PgCluster } from 'pg-lease-testing';
import { CURRENT_VERSION, FIXTURE_0_1_0 } from '../support/releases.js';

type Install = '0.1.0' | '0.2.1' | 'update';
const INSTALLS: readonly Install[] = ['0.1.0', '0.2.1', 'update'];

let cluster: PgCluster;
before(async () => {
  cluster = await PgCluster.start({
    extraExtensionFiles: [FIXTURE_0_1_0],
    // An asynchronous commit is then flushed only by the WAL writer, up to 10 s later, so a
    // commit record not yet flushed right after COMMIT shows an asynchronous commit.
    settings: { wal_writer_delay: '10s', wal_writer_flush_after: '1GB' },
  });
});
after(() => cluster?.destroy());

let databases = 0;
async function freshDatabase(owner?: string): Promise<{ name: string; url: string }> {
  const name = `defects_${++databases}`;
  await cluster.query(
    `CREATE DATABASE ${name}${owner ? ` OWNER ${pg.escapeIdentifier(owner)}` : ''}`,
  );
  return { name, url: cluster.url(name) };
}

async function connect(url: string, user?: string): Promise<pg.Client> {
  const target = new URL(url);
  if (user) target.username = user;
  const client = new pg.Client({ connectionString: target.toString() });
  client.on('error', () => undefined);
  await client.connect();
  if (user) {
    const { rows } = await client.query('SELECT current_user AS u');
    assert.equal(rows[0].u, user);
  }
  return client;
}

async function install(client: pg.Client, how: Install): Promise<void> {
  if (how === '0.2.1') await client.query('CREATE EXTENSION pg_lease');
  else await client.query(`CREATE EXTENSION pg_lease VERSION '0.1.0'`);
  if (how === 'update') await client.query('ALTER EXTENSION pg_lease UPDATE');
}

/** A database with pg_lease installed as `how`; the caller ends the client. */
async function leaseDatabase(how: Install): Promise<{ url: string; admin: pg.Client }> {
  const { url } = await freshDatabase();
  const admin = await connect(url);
  await install(admin, how);
  return { url, admin };
}

describe('1. objects planted in schema lease cannot steer the superuser install', () => {
  const plant = (role: string) => `
    CREATE SCHEMA lease; CREATE SCHEMA evil;
    CREATE FUNCTION evil.f(oid, regnamespace) RETURNS boolean LANGUAGE plpgsql AS $$
    BEGIN
      IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        EXECUTE 'ALTER ROLE ${role} SUPERUSER';
      END IF;
      RETURN $1 OPERATOR(pg_catalog.=) $2::oid;
    END $$;
    CREATE OPERATOR lease.= (LEFTARG = oid, RIGHTARG = regnamespace, FUNCTION = evil.f)`;

  for (const version of ['0.1.0', CURRENT_VERSION] as const) {
    test(`${version}: a database owner who plants an operator ${version === '0.1.0' ? 'becomes' : 'does not become'} superuser`, async () => {
      const role = `installer_${version.replaceAll('.', '_')}`;
      await cluster.query(`CREATE ROLE ${role} LOGIN`);
      const { url } = await freshDatabase(role);
      const installer = await connect(url, role);
      try {
        await installer.query(plant(role));
        const installed = await installer
          .query(`CREATE EXTENSION pg_lease VERSION '${version}'`)
          .then(() => 'installed', (error: pg.DatabaseError) => error);
        const { rows } = await cluster.query(
          `SELECT rolsuper FROM pg_roles WHERE rolname = $1`,
          [role],
        );
        if (version === '0.1.0') {
          assert.equal(installed, 'installed');
          assert.equal(rows[0]!.rolsuper, true, 'the 0.1.0 probe no longer reproduces the escalation');
        } else {
          assert.equal(rows[0]!.rolsuper, false);
          assert.ok(installed instanceof Error);
          assert.equal(installed.code, '55000');
          assert.match(installed.message, /schema lease existed before and is open/);
          assert.match(installed.detail ?? '', new RegExp(role));
        }
      } finally {
        await installer.end();
        await cluster.query(`ALTER ROLE ${role} NOSUPERUSER`);
      }
    });
  }

  test('0.2.1: the same plant made in the installing transaction itself is found and refused', async () => {
    const role = 'installer_same_xact';
    await cluster.query(`CREATE ROLE ${role} LOGIN`);
    const { url } = await freshDatabase(role);
    const installer = await connect(url, role);
    try {
      await installer.query('BEGIN');
      await installer.query(plant(role));
      await assert.rejects(installer.query('CREATE EXTENSION pg_lease'), (error: pg.DatabaseError) => {
        assert.equal(error.code, '55000');
        assert.match(error.message, /schema lease holds objects that are not part of pg_lease/);
        assert.match(error.detail ?? '', /operator lease\.=\(oid,regnamespace\)/);
        return true;
      });
      await installer.query('ROLLBACK');
      const { rows } = await cluster.query(`SELECT rolsuper FROM pg_roles WHERE rolname = $1`, [role]);
      assert.equal(rows[0]!.rolsuper, false);
    } finally {
      await installer.end();
    }
  });

  test('an update refuses a schema lease that others may create in, then one that holds an object planted under 0.1.0', async () => {
    const { url } = await freshDatabase();
    const admin = await connect(url);
    try {
      await admin.query(`CREATE SCHEMA lease; GRANT CREATE ON SCHEMA lease TO PUBLIC`);
      await admin.query(`CREATE EXTENSION pg_lease VERSION '0.1.0'`);
      await cluster.query(`CREATE ROLE planter LOGIN`);
      const planter = await connect(url, 'planter');
      await planter.query(`CREATE FUNCTION lease._validate(text, text, text, bigint, interval, interval, integer DEFAULT 0)
                             RETURNS void LANGUAGE sql AS 'SELECT'`);
      await planter.end();
      // Open to PUBLIC: refused before anything else, since a session may be creating unseen.
      await assert.rejects(admin.query('ALTER EXTENSION pg_lease UPDATE'), (error: pg.DatabaseError) => {
        assert.equal(error.code, '55000');
        assert.match(error.message, /existed before and is open to roles that are not superusers/);
        assert.match(error.detail ?? '', /PUBLIC/);
        return true;
      });
      // Closed: the planted overload is named.
      await admin.query('REVOKE CREATE ON SCHEMA lease FROM PUBLIC');
      await assert.rejects(admin.query('ALTER EXTENSION pg_lease UPDATE'), (error: pg.DatabaseError) => {
        assert.equal(error.code, '55000');
        assert.match(
          error.detail ?? '',
          /function lease\._validate\(text,text,text,bigint,interval,interval,integer\)/,
        );
        return true;
      });
      const { rows } = await admin.query(`SELECT extversion FROM pg_extension WHERE extname = 'pg_lease'`);
      assert.equal(rows[0].extversion, '0.1.0');
      // Once the object is gone the update goes through and the schema stays closed.
      await admin.query(`DROP FUNCTION lease._validate(text, text, text, bigint, interval, interval, integer)`);
      await admin.query('ALTER EXTENSION pg_lease UPDATE');
      const open = await admin.query(`SELECT has_schema_privilege('planter', 'lease', 'CREATE') AS c`);
      assert.equal(open.rows[0].c, false);
    } finally {
      await admin.end();
      await cluster.query(`DROP OWNED BY planter CASCADE`, [], 'postgres').catch(() => undefined);
    }
  });

  test('an update refuses a function the extension owner added to the extension itself', async () => {
    await cluster.query(`CREATE ROLE ext_owner LOGIN`);
    const { url } = await freshDatabase('ext_owner');
    const owner = await connect(url, 'ext_owner');
    try {
      await owner.query(`CREATE EXTENSION pg_lease VERSION '0.1.0'`);
      // The installing role owns the extension and so may add its own objects to it; a
      // CREATE OR REPLACE in the update would then keep their owner.
      await owner.query(`CREATE FUNCTION public.mine() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$`);
      await owner.query(`ALTER EXTENSION pg_lease ADD FUNCTION public.mine()`);
      await assert.rejects(owner.query('ALTER EXTENSION pg_lease UPDATE'), (error: pg.DatabaseError) => {
        assert.equal(error.code, '55000');
        assert.match(error.detail ?? '', /function public\.mine\(\)/);
        return true;
      });
    } finally {
      await owner.end();
    }
  });

  test('an install refuses a pre-made schema that a session may be creating in unseen', async () => {
    await cluster.query(`CREATE ROLE lurker LOGIN`);
    const { url } = await freshDatabase();
    const admin = await connect(url);
    const lurker = await connect(url, 'lurker');
    try {
      await admin.query(`CREATE SCHEMA lease; GRANT CREATE, USAGE ON SCHEMA lease TO lurker`);
      await lurker.query('BEGIN');
      await lurker.query(`CREATE FUNCTION lease.release(p_key text, p_owner text, p_epoch integer)
                            RETURNS TABLE (status text) LANGUAGE sql AS $$ SELECT 'ok'::text $$`);
      await assert.rejects(admin.query('CREATE EXTENSION pg_lease'), (error: pg.DatabaseError) => {
        assert.equal(error.code, '55000');
        assert.match(error.detail ?? '', /lurker/);
        return true;
      });
      await lurker.query('COMMIT');
    } finally {
      await lurker.end();
      await admin.end();
    }
  });

  test('an install refuses a pre-made schema owned by a role that is not a superuser, even an empty one', async () => {
    await cluster.query(`CREATE ROLE premaker LOGIN`);
    const { url } = await freshDatabase('premaker');
    const premaker = await connect(url, 'premaker');
    try {
      await premaker.query('CREATE SCHEMA lease');
      await assert.rejects(premaker.query('CREATE EXTENSION pg_lease'), /existed before and is open/);
      // Made in the same transaction, nobody else can have touched it: accepted.
      await premaker.query('BEGIN; DROP SCHEMA lease; CREATE SCHEMA lease; CREATE EXTENSION pg_lease; COMMIT');
      const { rows } = await premaker.query(`SELECT nspowner::regrole::text AS o FROM pg_namespace WHERE nspname = 'lease'`);
      assert.equal(rows[0].o, 'postgres');
    } finally {
      await premaker.end();
    }
  });

  test('0.2.1 also refuses a planted type, domain or collation, and takes a pre-made empty schema over', async () => {
    for (const planted of [
      'CREATE TYPE lease.t AS (a int)',
      'CREATE DOMAIN lease.d AS text',
      'CREATE COLLATION lease.c FROM "C"',
    ]) {
      const { url } = await freshDatabase();
      const admin = await connect(url);
      try {
        await admin.query(`CREATE SCHEMA lease`);
        await admin.query(planted);
        await assert.rejects(admin.query('CREATE EXTENSION pg_lease'), /not part of pg_lease/);
        await admin.query('DROP SCHEMA lease CASCADE; CREATE SCHEMA lease');
        await admin.query('CREATE EXTENSION pg_lease');
      } finally {
        await admin.end();
      }
    }
  });
});

describe('2. a pre-made schema lease that others may create in is not taken over', () => {
  for (const how of INSTALLS) {
    test(`${how}: GRANT CREATE ON SCHEMA lease TO PUBLIC made beforehand ${how === '0.1.0' ? 'survives the install' : 'is refused until revoked, then closed'}`, async () => {
      const { url } = await freshDatabase();
      const admin = await connect(url);
      const role = `r_${databases}`;
      try {
        await admin.query(`CREATE ROLE ${role} LOGIN`);
        await admin.query(`CREATE SCHEMA lease; GRANT CREATE, USAGE ON SCHEMA lease TO PUBLIC`);
        if (how === '0.2.1') {
          await assert.rejects(admin.query('CREATE EXTENSION pg_lease'), /existed before and is open/);
          await admin.query('REVOKE CREATE ON SCHEMA lease FROM PUBLIC');
        }
        if (how === 'update') {
          await admin.query(`CREATE EXTENSION pg_lease VERSION '0.1.0'`);
          await assert.rejects(admin.query('ALTER EXTENSION pg_lease UPDATE'), /existed before and is open/);
          await admin.query('REVOKE CREATE ON SCHEMA lease FROM PUBLIC');
          await admin.query('ALTER EXTENSION pg_lease UPDATE');
        } else {
          await install(admin, how);
        }
        const { rows } = await admin.query(
          `SELECT has_schema_privilege($1, 'lease', 'CREATE') AS can_create,
                  has_schema_privilege($1, 'lease', 'USAGE') AS can_use,
                  (SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'lease') AS owner`,
          [role],
        );
        assert.equal(rows[0].can_create, how === '0.1.0');
        assert.equal(rows[0].can_use, true);
        assert.equal(rows[0].owner, 'postgres');
      } finally {
        await admin.end();
      }
    });
  }

  for (const how of ['0.2.1', 'update'] as const) {
    test(`${how}: grants from default privileges or made since 0.1.0 do not survive on the table or the helpers`, async () => {
      const { url } = await freshDatabase();
      const admin = await connect(url);
      const eve = `eve_${databases}`;
      try {
        await admin.query(`CREATE ROLE ${eve} LOGIN`);
        await admin.query(`ALTER DEFAULT PRIVILEGES FOR ROLE postgres GRANT SELECT, UPDATE ON TABLES TO ${eve}`);
        await admin.query(`ALTER DEFAULT PRIVILEGES FOR ROLE postgres GRANT EXECUTE ON FUNCTIONS TO ${eve}`);
        if (how === 'update') {
          await admin.query(`CREATE EXTENSION pg_lease VERSION '0.1.0'`);
          await admin.query(`GRANT SELECT, UPDATE ON lease.leases TO ${eve}`);
          await admin.query(`ALTER EXTENSION pg_lease UPDATE`);
        } else {
          await admin.query('CREATE EXTENSION pg_lease');
        }
        const { rows } = await admin.query(
          `SELECT has_table_privilege($1, 'lease.leases', 'SELECT') AS sel,
                  has_table_privilege($1, 'lease.leases', 'UPDATE') AS upd,
                  has_function_privilege($1, 'lease._lock_margin()', 'EXECUTE') AS helper,
                  has_function_privilege($1, 'lease.acquire(text,text,interval,interval)', 'EXECUTE') AS api`,
          [eve],
        );
        assert.deepEqual(rows[0], { sel: false, upd: false, helper: false, api: true });
      } finally {
        await admin.query(`ALTER DEFAULT PRIVILEGES FOR ROLE postgres REVOKE ALL ON TABLES FROM ${eve}`);
        await admin.query(`ALTER DEFAULT PRIVILEGES FOR ROLE postgres REVOKE ALL ON FUNCTIONS FROM ${eve}`);
        await admin.end();
      }
    });
  }
});

describe('3. under REPEATABLE READ a same-owner acquire never confirms a stale grant', () => {
  for (const how of INSTALLS) {
    test(`${how}: the issue's sequence ${how === '0.1.0' ? 'confirms epoch 1 while B holds 3' : 'fails with 40001'}`, async () => {
      const { url, admin } = await leaseDatabase(how);
      const s2 = await connect(url);
      try {
        await admin.query(`SELECT * FROM lease.acquire('k', 'A', '30 s')`);
        await s2.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
        await s2.query(`SELECT * FROM lease.inspect('k')`);
        await admin.query(`SELECT lease.release('k', 'A', 1)`);
        await admin.query(`SELECT * FROM lease.acquire('k', 'B', '30 s')`);
        const answer = await s2
          .query(`SELECT acquired, epoch FROM lease.acquire('k', 'A', '30 s')`)
          .then((r) => r.rows[0], (error: pg.DatabaseError) => error);
        if (how === '0.1.0') {
          assert.deepEqual(answer, { acquired: true, epoch: '1' });
        } else {
          assert.ok(answer instanceof Error, `acquire answered ${JSON.stringify(answer)}`);
          assert.equal((answer as pg.DatabaseError).code, '40001');
        }
      } finally {
        await s2.query('ROLLBACK').catch(() => undefined);
        await s2.end();
        await admin.end();
      }
    });
  }
});

describe('4. a renew that waited for the row lock past the expiry reports lapsed', () => {
  for (const how of INSTALLS) {
    test(`${how}: a renew blocked across the expiry ${how === '0.1.0' ? 'revives the lapsed grant' : 'reports lapsed'}`, async () => {
      const { url, admin } = await leaseDatabase(how);
      const a1 = await connect(url);
      const a2 = await connect(url);
      try {
        const { rows } = await admin.query(`SELECT epoch FROM lease.acquire('k', 'A', '1500 ms')`);
        const epoch = rows[0].epoch as string;
        await a1.query('BEGIN');
        await a1.query(`SELECT * FROM lease.renew('k', 'A', $1, '1 ms')`, [epoch]);
        const blocked = a2.query(`SELECT status FROM lease.renew('k', 'A', $1, '10 s')`, [epoch]);
        // Wait until the grant has lapsed, as inspect reports it.
        for (;;) {
          const seen = await admin.query(`SELECT held FROM lease.inspect('k')`);
          if (seen.rows[0].held === false) break;
          await new Promise((resolve) => setTimeout(resolve, 100));
        }
        await a1.query('ROLLBACK');
        const status = (await blocked).rows[0].status as string;
        const after = await admin.query(`SELECT held FROM lease.inspect('k')`);
        if (how === '0.1.0') {
          assert.equal(status, 'ok');
          assert.equal(after.rows[0].held, true);
        } else {
          assert.equal(status, 'lapsed');
          assert.equal(after.rows[0].held, false);
        }
      } finally {
        await a1.end();
        await a2.end();
        await admin.end();
      }
    });
  }
});

describe('5. a lease change never commits asynchronously', () => {
  /** Runs `body` in a transaction and tells whether its commit record was flushed by COMMIT. */
  async function flushedByCommit(client: pg.Client, body: string): Promise<boolean> {
    await client.query('BEGIN');
    await client.query(body);
    const { rows } = await client.query(`SELECT pg_current_wal_insert_lsn() AS lsn`);
    await client.query('COMMIT');
    const flushed = await client.query(`SELECT pg_current_wal_flush_lsn() > $1::pg_lsn AS f`, [
      rows[0].lsn,
    ]);
    return flushed.rows[0].f as boolean;
  }

  /** [session setting, transaction body, whether 0.1.0 committed it asynchronously] */
  const bypasses: Record<string, [string, string, boolean]> = {
    'SET LOCAL synchronous_commit = off after the call': [
      'on',
      `SELECT lease.acquire('k-' || txid_current(), 'A', '1 min');
       SET LOCAL synchronous_commit = off`,
      true,
    ],
    'a wrapper function with its own SET synchronous_commit = off, in a session with off': [
      'off',
      `SELECT wrapped_acquire('k-' || txid_current())`,
      true,
    ],
    'a session with synchronous_commit = off': [
      'off',
      `SELECT lease.acquire('k-' || txid_current(), 'A', '1 min')`,
      false,
    ],
  };

  for (const how of INSTALLS) {
    for (const [name, [session, body, asyncOn010]] of Object.entries(bypasses)) {
      const asynchronous = how === '0.1.0' && asyncOn010;
      test(`${how}: ${name} ${asynchronous ? 'commits asynchronously' : 'still commits durably'}`, async () => {
        const { admin } = await leaseDatabase(how);
        try {
          await admin.query(`CREATE FUNCTION wrapped_acquire(p_key text) RETURNS void
                               LANGUAGE sql SET synchronous_commit = off
                               AS $$ SELECT lease.acquire(p_key, 'A', '1 min') $$`);
          await admin.query(`SET synchronous_commit = ${session}`);
          assert.equal(await flushedByCommit(admin, body), !asynchronous);
        } finally {
          await admin.end();
        }
      });
    }
  }

  test('0.2.1: renew and release commit durably under synchronous_commit = off', async () => {
    const { admin } = await leaseDatabase('0.2.1');
    try {
      await admin.query(`SELECT lease.acquire('r', 'A', '1 min')`);
      await admin.query('SET synchronous_commit = off');
      assert.equal(await flushedByCommit(admin, `SELECT lease.renew('r', 'A', 1, '1 min')`), true);
      assert.equal(await flushedByCommit(admin, `SELECT lease.release('r', 'A', 1)`), true);
      // Reading changes nothing and needs no flush: the caller's setting is left alone.
      const { rows } = await admin.query('SHOW synchronous_commit');
      assert.equal(rows[0].synchronous_commit, 'off');
    } finally {
      await admin.end();
    }
  });

  test('0.2.1, the documented limit: SET CONSTRAINTS ALL IMMEDIATE and then lowering the setting commits asynchronously', async () => {
    const { admin } = await leaseDatabase('0.2.1');
    try {
      const durable = await flushedByCommit(
        admin,
        `SET CONSTRAINTS ALL IMMEDIATE;
         SELECT lease.acquire('limit', 'A', '1 min');
         SET LOCAL synchronous_commit = off`,
      );
      assert.equal(durable, false);
    } finally {
      await admin.end();
    }
  });

  test('0.2.1: the level a lease commit uses, with and without synchronous standbys configured', async () => {
    const { admin } = await leaseDatabase('0.2.1');
    try {
      // A deferred trigger queued after pg_lease's fires after it, at commit, and reports the
      // level the commit would use by failing it (so that no commit waits for a standby that is
      // not there).
      await admin.query(`CREATE FUNCTION report_level() RETURNS trigger LANGUAGE plpgsql AS $$
                           BEGIN RAISE EXCEPTION 'level=%', current_setting('synchronous_commit'); END $$`);
      await admin.query(`CREATE TABLE probe (x int)`);
      await admin.query(`CREATE CONSTRAINT TRIGGER report AFTER INSERT ON probe
                           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION report_level()`);
      const cases = [
        ['', 'off', 'on'],
        ['', 'local', 'local'],
        ['', 'remote_write', 'remote_write'],
        ['', 'on', 'on'],
        ['standby1', 'off', 'on'],
        ['standby1', 'local', 'on'],
        ['standby1', 'remote_write', 'on'],
        ['standby1', 'on', 'on'],
        ['standby1', 'remote_apply', 'remote_apply'],
      ] as const;
      for (const [standbys, setting, expected] of cases) {
        await cluster.query(`ALTER SYSTEM SET synchronous_standby_names = '${standbys}'`);
        await cluster.query('SELECT pg_reload_conf()');
        for (;;) {
          const { rows } = await admin.query('SHOW synchronous_standby_names');
          if (rows[0].synchronous_standby_names === standbys) break;
          await new Promise((resolve) => setTimeout(resolve, 20));
        }
        await admin.query('BEGIN');
        await admin.query(`SELECT set_config('synchronous_commit', $1, true)`, [setting]);
        await admin.query(`SELECT lease.acquire(gen_random_uuid()::text, 'A', '1 min')`);
        await admin.query(`INSERT INTO probe VALUES (1)`);
        await assert.rejects(admin.query('COMMIT'), (error: Error) => error.message === `level=${expected}`, `${standbys}/${setting}`);
      }
    } finally {
      await cluster.query(`ALTER SYSTEM RESET synchronous_standby_names`);
      await cluster.query('SELECT pg_reload_conf()');
      await admin.end();
    }
  });
});

describe('5b. a crash right after COMMIT keeps the grant', () => {
  for (const how of INSTALLS) {
    test(`${how}: a grant whose transaction lowered synchronous_commit after the call is ${how === '0.1.0' ? 'lost' : 'kept'} by kill -9 of the postmaster`, async () => {
      await using crashing = await PgCluster.start({
        extraExtensionFiles: [FIXTURE_0_1_0],
        settings: { wal_writer_delay: '10s', wal_writer_flush_after: '1GB' },
      });
      await crashing.query('CREATE DATABASE c');
      const client = await connect(crashing.url('c'));
      await install(client, how);
      await client.query('BEGIN');
      await client.query(`SELECT lease.acquire('survivor', 'A', '1 hour')`);
      await client.query('SET LOCAL synchronous_commit = off');
      await client.query('COMMIT');
      await client.end();
      await crashing.crash();
      await crashing.start();
      const { rows } = await crashing.query(
        `SELECT count(*)::int AS n FROM lease.inspect('survivor')`,
        [],
        'c',
      );
      assert.equal(rows[0]!.n, how === '0.1.0' ? 0 : 1);
    });
  }
});

