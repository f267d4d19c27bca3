/**
 * SEMANTICS.md §10 "Install and upgrade safety", as a list of attacks: every way found for a role
 * that is not a superuser to plant an object in schema lease, or to keep a privilege on what is
 * in it, across CREATE EXTENSION and ALTER EXTENSION pg_lease UPDATE. The install and update
 * scripts run as the bootstrap superuser, so a planted overload that a superuser's untyped call
 * resolves to runs as superuser.
 *
 * Each attack ends the same way: if pg_lease got installed, a superuser makes the untyped call
 * `lease.acquire('k', 'o', '10s')` and nothing foreign may be left in schema lease; the attacker
 * must not have become superuser; then the test checks how the guard refused.
 *
 * The update paths start from the released install scripts (0.1.0, 0.2.0, 0.2.1), staged as test
 * fixtures.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { PACKAGE_ROOT, PgCluster } from 'pg-lease-testing';
import { BUNDLED_VERSION } from '../../src/generated/sql.js';
import { waitFor } from '../support/helpers.js';
import { CURRENT_VERSION, EARLIER_VERSIONS } from '../support/releases.js';

/** A no-op update to a made-up version: the guard and the privilege reset, nothing else. */
const CHAIN_VERSION = 'guardtest';

let cluster: PgCluster;
let stageDir: string;
before(async () => {
  stageDir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-lease-attacks-'));
  const source = path.join(PACKAGE_ROOT, 'extension', 'src');
  const chain = path.join(stageDir, `pg_lease--${BUNDLED_VERSION}--${CHAIN_VERSION}.sql`);
  fs.writeFileSync(
    chain,
    [
      fs.readFileSync(path.join(source, 'guard.sql'), 'utf8'),
      fs.readFileSync(path.join(source, 'objects', '99-privileges.sql'), 'utf8'),
    ].join('\n'),
  );
  cluster = await PgCluster.start({
    extraExtensionFiles: [...EARLIER_VERSIONS.map((earlier) => earlier.fixture), chain],
    settings: { max_prepared_transactions: 4 },
  });
});
after(async () => {
  await cluster?.destroy();
  fs.rmSync(stageDir, { recursive: true, force: true });
});

let serial = 0;
/** A role of the cluster (LOGIN, no attributes), with a name no other test uses. */
async function role(label: string): Promise<string> {
  const name = `${label}_${++serial}`;
  await cluster.query(`CREATE ROLE ${name} LOGIN`);
  return name;
}

async function database(owner?: string): Promise<string> {
  const name = `attack_${++serial}`;
  await cluster.query(`CREATE DATABASE ${name}${owner ? ` OWNER ${owner}` : ''}`);
  return cluster.url(name);
}

const clients: pg.Client[] = [];
after(async () => {
  await Promise.all(clients.map((client) => client.end().catch(() => undefined)));
});

async function connect(url: string, user?: string): Promise<pg.Client> {
  const target = new URL(url);
  if (user) target.username = user;
  const client = new pg.Client({ connectionString: target.toString() });
  client.on('error', () => undefined);
  await client.connect();
  clients.push(client);
  return client;
}

/** The statement's error, or `undefined` if it succeeded. */
async function outcome(promise: Promise<unknown>): Promise<pg.DatabaseError | undefined> {
  try {
    await promise;
    return undefined;
  } catch (error) {
    assert.ok(error instanceof pg.DatabaseError, `expected a PostgreSQL error, got ${error}`);
    return error;
  }
}

/**
 * An overload of lease.acquire that an untyped call with three string literals resolves to (the
 * string category wins for unknown literals). Run by a superuser, it makes `attacker` one.
 */
function overload(attacker: string, name = 'acquire'): string {
  return `CREATE FUNCTION lease.${name}(p_key text, p_owner text, p_ttl text)
      RETURNS TABLE (acquired boolean, epoch bigint, expires_at timestamptz)
      LANGUAGE plpgsql AS $f$
    BEGIN
      IF (SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.rolname = current_user) THEN
        EXECUTE 'ALTER ROLE ${attacker} SUPERUSER';
      END IF;
      RETURN QUERY SELECT true, 1::bigint, pg_catalog.now();
    END $f$`;
}

/** A trigger function in schema public that makes `attacker` superuser when run by one. */
function escalatingTrigger(attacker: string): string {
  return `CREATE FUNCTION public.escalate() RETURNS trigger LANGUAGE plpgsql AS $f$
    BEGIN
      IF (SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.rolname = current_user) THEN
        EXECUTE 'ALTER ROLE ${attacker} SUPERUSER';
      END IF;
      RETURN NEW;
    END $f$`;
}

/**
 * What must hold after every attack: with pg_lease installed (or updated), a superuser's untyped call (and a
 * stranger's call of the API) runs pg_lease's code, and schema lease holds no function or
 * operator that is not pg_lease's; the attacker is not superuser.
 */
async function assertNothingPlanted(url: string, attacker: string): Promise<void> {
  const admin = await connect(url);
  let foreign: string[] = [];
  try {
    // 0.1.0 left in place by a refused update is not under test: its open schema is its defect.
    const version = await installed(admin);
    if (version !== undefined && version !== '0.1.0') {
      await admin.query(`SELECT * FROM lease.acquire('k', 'o', '10s')`).catch(() => undefined);
      const stranger = await role('stranger');
      const asStranger = await connect(url, stranger);
      await asStranger
        .query(`SELECT * FROM lease.acquire('k2'::text, 'o'::text, '10s'::interval)`)
        .catch(() => undefined);
      await asStranger.end();
      const { rows } = await admin.query(
        `SELECT pg_describe_object(x.classid, x.objid, 0) AS what
           FROM (SELECT 'pg_proc'::regclass AS classid, p.oid AS objid FROM pg_proc p
                  WHERE p.pronamespace = 'lease'::regnamespace
                 UNION ALL
                 SELECT 'pg_operator'::regclass, o.oid FROM pg_operator o
                  WHERE o.oprnamespace = 'lease'::regnamespace) AS x
          WHERE NOT EXISTS (SELECT FROM pg_depend d
                             WHERE d.classid = x.classid AND d.objid = x.objid AND d.deptype = 'e'
                               AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_lease'))
          ORDER BY 1`,
      );
      foreign = rows.map((row) => row.what as string);
    }
  } finally {
    await admin.end();
  }
  const { rows } = await cluster.query(`SELECT rolsuper FROM pg_roles WHERE rolname = $1`, [attacker]);
  assert.equal(rows[0]!.rolsuper, false, `${attacker} became superuser`);
  assert.deepEqual(foreign, [], 'pg_lease was installed with foreign objects in schema lease');
}

function assertRefused(
  error: pg.DatabaseError | undefined,
  code: string,
  message: RegExp,
  detail?: RegExp,
): void {
  assert.ok(error, 'the install or update went through');
  assert.equal(error.code, code, `${error.code}: ${error.message} (${error.detail})`);
  assert.match(error.message, message);
  if (detail) assert.match(error.detail ?? '', detail);
}

async function installed(client: pg.Client): Promise<string | undefined> {
  const { rows } = await client.query(`SELECT extversion FROM pg_extension WHERE extname = 'pg_lease'`);
  return rows[0]?.extversion as string | undefined;
}

/** Resolves once `pid` sleeps in the guard's wait, or once `step` has settled. */
async function untilWaitingOrDone(monitor: pg.Client, pid: number, step: Promise<unknown>): Promise<void> {
  let settled = false;
  void step.finally(() => {
    settled = true;
  });
  await waitFor('the install waits for the open transaction', async () => {
    if (settled) return true;
    const { rows } = await monitor.query(`SELECT wait_event FROM pg_stat_activity WHERE pid = $1`, [pid]);
    return rows[0]?.wait_event === 'PgSleep';
  });
}


/**
 * Runs `sql`, a change of schema lease, in `session` while a planter holds an uncommitted object
 * in the schema. Newer minor releases (15.20 does, 15.18 does not) lock a schema while an object
 * is created in it, so there the change waits for the planter's transaction and the attack cannot
 * interleave as written: once the change waits on that lock, `commitPlanter` commits the plant
 * and the change goes on after it. Says whether the change had to wait, and its error if any.
 */
async function pastPlanter(
  session: pg.Client,
  sql: string,
  commitPlanter: () => Promise<unknown>,
): Promise<{ waited: boolean; error: pg.DatabaseError | undefined }> {
  const pid = (await session.query('SELECT pg_backend_pid() AS pid')).rows[0].pid as number;
  let settled = false;
  const step = session.query(sql).finally(() => {
    settled = true;
  });
  step.catch(() => undefined);
  let waited = false;
  await waitFor('the schema change is done or waits for the planter', async () => {
    if (settled) return true;
    const { rows } = await cluster.query(
      `SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1`,
      [pid],
    );
    waited = rows[0]?.wait_event_type === 'Lock';
    return waited;
  });
  if (waited) await commitPlanter();
  return { waited, error: await outcome(step) };
}

const CHANGED = /schema lease was changed earlier in this transaction/;
const OPEN = /schema lease existed before and is open to roles that are not superusers/;
const FOREIGN = /schema lease holds objects that are not part of pg_lease/;
const STILL_OPEN = /transactions in this database are still open/;

describe('premise: why the guard cannot lock planters out', () => {
  test('creating a table in a schema locks the schema; a function, domain or operator only on newer minors', async () => {
    const url = await database();
    const admin = await connect(url);
    const planter = await role('planter');
    await admin.query(`CREATE SCHEMA s AUTHORIZATION ${planter}`);
    const session = await connect(url, planter);
    const pid = (await session.query('SELECT pg_backend_pid() AS pid')).rows[0].pid as number;
    const locks: Record<string, string[]> = {};
    for (const [what, sql] of [
      ['function', `CREATE FUNCTION s.f(text) RETURNS int LANGUAGE sql AS 'SELECT 1'`],
      ['domain', `CREATE DOMAIN s.d AS int`],
      ['operator', `CREATE OPERATOR s.=== (LEFTARG = text, RIGHTARG = text, FUNCTION = texteq)`],
      ['table', `CREATE TABLE s.t (a int)`],
    ] as const) {
      await session.query('BEGIN');
      await session.query(sql);
      const { rows } = await admin.query(
        `SELECT mode FROM pg_locks WHERE pid = $1 AND locktype = 'object'
            AND classid = 'pg_namespace'::regclass AND objid = 's'::regnamespace`,
        [pid],
      );
      locks[what] = rows.map((row) => row.mode as string);
      await session.query('ROLLBACK');
    }
    // Older minor releases take no lock for a function, domain or operator; newer ones (15.20,
    // not 15.18) take the table's lock for each. Either way the guard cannot count on it.
    const byCreate = [locks.function, locks.domain, locks.operator].map((modes) => modes ?? []);
    assert.ok(
      byCreate.every((modes) => modes.length === 0) ||
        byCreate.every((modes) => modes.join() === 'AccessShareLock'),
      JSON.stringify(locks),
    );
    assert.deepEqual(locks.table, ['AccessShareLock']);
  });
});

describe('CREATE EXTENSION: a schema lease that a non-superuser made', () => {
  /**
   * The database owner makes schema lease; a second session of theirs creates an overload and
   * keeps its transaction open; the first rewrites the schema's row (`rewrite`) and installs,
   * in one transaction. Both commit.
   */
  async function ownerAttack(
    rewrite: (attacker: string) => string,
    options: { plantAfterInstall?: boolean; prepare?: (attacker: string, url: string) => Promise<void> } = {},
  ): Promise<{ url: string; attacker: string; error: pg.DatabaseError | undefined; waited: boolean }> {
    const attacker = await role('owner');
    const url = await database(attacker);
    await options.prepare?.(attacker, url);
    const first = await connect(url, attacker);
    const second = await connect(url, attacker);
    await first.query('CREATE SCHEMA lease');
    if (!options.plantAfterInstall) {
      await second.query('BEGIN');
      await second.query(overload(attacker));
    }
    await first.query('BEGIN');
    let waited = false;
    let error: pg.DatabaseError | undefined;
    if (options.plantAfterInstall) {
      await first.query(rewrite(attacker));
    } else {
      // A rewrite that fails (after waiting for the planter) is where the attack ends.
      ({ waited, error } = await pastPlanter(first, rewrite(attacker), () => second.query('COMMIT')));
    }
    error ??= await outcome(first.query('CREATE EXTENSION pg_lease'));
    if (options.plantAfterInstall && !error) {
      await second.query(overload(attacker));
    }
    await first.query(error ? 'ROLLBACK' : 'COMMIT');
    if (!options.plantAfterInstall && !waited) await second.query('COMMIT');
    await assertNothingPlanted(url, attacker);
    return { url, attacker, error, waited };
  }

  test('the brief: GRANT USAGE rewrites the schema row in the installing transaction, an overload waits uncommitted', async () => {
    const { error } = await ownerAttack(() => 'GRANT USAGE ON SCHEMA lease TO PUBLIC');
    assertRefused(error, '55000', CHANGED);
  });

  test('the schema is renamed away and back in the installing transaction', async () => {
    const { error } = await ownerAttack(
      () => 'ALTER SCHEMA lease RENAME TO lease_aside; ALTER SCHEMA lease_aside RENAME TO lease',
    );
    assertRefused(error, '55000', CHANGED);
  });

  test('the row is rewritten in a savepoint released before the install', async () => {
    const { error } = await ownerAttack(
      () => 'SAVEPOINT s; GRANT USAGE ON SCHEMA lease TO PUBLIC; RELEASE SAVEPOINT s',
    );
    assertRefused(error, '55000', CHANGED);
  });

  test('the schema passes to another role of the attacker and back', async () => {
    const { error } = await ownerAttack(
      (attacker) => `ALTER SCHEMA lease OWNER TO ${attacker}_alt; ALTER SCHEMA lease OWNER TO ${attacker}`,
      {
        prepare: async (attacker, url) => {
          const database = pg.escapeIdentifier(new URL(url).pathname.slice(1));
          await cluster.query(`CREATE ROLE ${attacker}_alt; GRANT ${attacker}_alt TO ${attacker}`);
          await cluster.query(`GRANT CREATE ON DATABASE ${database} TO ${attacker}_alt`);
        },
      },
    );
    assertRefused(error, '55000', CHANGED);
  });

  test('a superuser-made schema: a role of the attacker holds CREATE, the attacker rewrites the row with DROP OWNED', async () => {
    const attacker = await role('owner');
    const helper = await role('helper');
    const url = await database(attacker);
    await cluster.query(`GRANT ${helper} TO ${attacker}`);
    const admin = await connect(url);
    await admin.query(`CREATE SCHEMA lease; GRANT USAGE ON SCHEMA lease TO PUBLIC; GRANT CREATE ON SCHEMA lease TO ${helper}`);
    const planter = await connect(url, helper);
    await planter.query('BEGIN');
    await planter.query(overload(attacker));
    const first = await connect(url, attacker);
    await first.query('BEGIN');
    await first.query(`DROP OWNED BY ${helper}`);
    const error = await outcome(first.query('CREATE EXTENSION pg_lease'));
    await first.query(error ? 'ROLLBACK' : 'COMMIT');
    await planter.query('COMMIT');
    await assertNothingPlanted(url, attacker);
    assertRefused(error, '55000', CHANGED);
  });

  test('a role granted SET on track_counts rewrites the row with counting off', async () => {
    const version = await cluster.query(`SELECT current_setting('server_version_num')::int AS v`);
    if ((version.rows[0]!.v as number) < 150000) {
      // No GRANT SET ON PARAMETER before 15: only a superuser may turn counting off.
      const attacker = await role('owner');
      const client = await connect(await database(attacker), attacker);
      assert.equal((await outcome(client.query('SET track_counts = off')))?.code, '42501');
      return;
    }
    let granted: string | undefined;
    try {
      const { error } = await ownerAttack(
        () => 'SET track_counts = off; GRANT USAGE ON SCHEMA lease TO PUBLIC; SET track_counts = on',
        {
          prepare: async (attacker) => {
            granted = attacker;
            await cluster.query(`GRANT SET ON PARAMETER track_counts TO ${attacker}`);
          },
        },
      );
      assertRefused(error, '55000', CHANGED, /track_counts/);
    } finally {
      if (granted) await cluster.query(`REVOKE SET ON PARAMETER track_counts FROM ${granted}`);
    }
  });

  test('the overload is created after CREATE EXTENSION, before the install commits', async () => {
    const { error } = await ownerAttack(() => 'GRANT USAGE ON SCHEMA lease TO PUBLIC', {
      plantAfterInstall: true,
    });
    assertRefused(error, '55000', CHANGED);
  });

  test('dropped and made again in the installing transaction: the overload is left in the dropped schema', async () => {
    const { url, error, waited } = await ownerAttack(() => 'DROP SCHEMA lease; CREATE SCHEMA lease');
    if (waited) {
      // A server that locks the schema while the overload is created: the DROP waited for it,
      // and the committed overload then holds the schema, so the attack ends there.
      assertRefused(error, '2BP01', /cannot drop schema lease because other objects depend on it/);
      return;
    }
    // Accepted, since no other session can see the new schema; the overload's
    // transaction took no lock the DROP had to wait for, so it commits into a
    // schema that no longer exists, where no name reaches it.
    assert.equal(error, undefined);
    const admin = await connect(url);
    const { rows } = await admin.query(
      `SELECT count(*)::int AS n FROM pg_proc p
        WHERE p.proname = 'acquire' AND NOT EXISTS (SELECT FROM pg_namespace n WHERE n.oid = p.pronamespace)`,
    );
    assert.equal(rows[0].n, 1, 'the overload is orphaned');
  });


  test('without a rewrite the schema is refused as open to its owner', async () => {
    const { error, attacker } = await ownerAttack(() => 'SELECT 1');
    assertRefused(error, '55000', OPEN, new RegExp(attacker));
  });

  test('a third role granted CREATE by the schema owner plants; the owner rewrites and installs', async () => {
    const attacker = await role('owner');
    const third = await role('third');
    const url = await database(attacker);
    const first = await connect(url, attacker);
    await first.query(`CREATE SCHEMA lease; GRANT CREATE, USAGE ON SCHEMA lease TO ${third}`);
    const planter = await connect(url, third);
    await planter.query('BEGIN');
    await planter.query(overload(third));
    await first.query('BEGIN');
    await first.query('GRANT USAGE ON SCHEMA lease TO PUBLIC');
    const error = await outcome(first.query('CREATE EXTENSION pg_lease'));
    await first.query(error ? 'ROLLBACK' : 'COMMIT');
    await planter.query('COMMIT');
    await assertNothingPlanted(url, third);
    assertRefused(error, '55000', CHANGED);
    // Given to a superuser, the schema still carries the third role's grant, which now reads as
    // granted by the new owner.
    const admin = await connect(url);
    await admin.query(`ALTER SCHEMA lease OWNER TO postgres; DROP FUNCTION lease.acquire(text, text, text)`);
    assertRefused(await outcome(admin.query('CREATE EXTENSION pg_lease')), '55000', OPEN, new RegExp(third));
  });
});

describe('CREATE EXTENSION: a superuser takes the schema over', () => {
  /** Schema lease owned by `planter`, who has an overload uncommitted in `session`. */
  async function plantedSchema(): Promise<{
    url: string;
    planter: string;
    session: pg.Client;
    admin: pg.Client;
  }> {
    const planter = await role('planter');
    const url = await database();
    const admin = await connect(url);
    await admin.query(`CREATE SCHEMA lease AUTHORIZATION ${planter}`);
    const session = await connect(url, planter);
    await session.query('BEGIN');
    await session.query(overload(planter));
    return { url, planter, session, admin };
  }

  test('in the installing transaction, while the planter keeps its transaction open', async () => {
    const { url, planter, session, admin } = await plantedSchema();
    await admin.query('BEGIN');
    await admin.query(`ALTER SCHEMA lease OWNER TO postgres; REVOKE ALL ON SCHEMA lease FROM ${planter}`);
    const error = await outcome(admin.query('CREATE EXTENSION pg_lease'));
    await admin.query(error ? 'ROLLBACK' : 'COMMIT');
    await session.query('COMMIT');
    await assertNothingPlanted(url, planter);
    assertRefused(error, '55000', CHANGED);
  });

  test("issue 32: the database owner's schema is handed over in the installing transaction, its overload moved in without taking an OID", async () => {
    // The schema's OID then comes just before the extension's, as when CREATE EXTENSION makes
    // the schema; 0.2.1 took that (with the extension made in this transaction) for proof that
    // this transaction made the schema, and skipped the wait for the planter's transaction.
    const planter = await role('owner');
    const url = await database(planter);
    const session = await connect(url, planter);
    const admin = await connect(url);
    await session.query(overload(planter).replace('lease.acquire', 'public.acquire'));
    // The last OID allocated anywhere in the cluster before the install.
    await session.query('CREATE SCHEMA lease; GRANT CREATE, USAGE ON SCHEMA lease TO PUBLIC');
    await session.query('BEGIN');
    await session.query('ALTER FUNCTION public.acquire(text, text, text) SET SCHEMA lease');
    await admin.query('BEGIN');
    // What the refusal's HINT asks for: give it to a superuser, revoke CREATE.
    const { waited, error: rewriteError } = await pastPlanter(
      admin,
      'ALTER SCHEMA lease OWNER TO postgres; REVOKE CREATE ON SCHEMA lease FROM PUBLIC',
      () => session.query('COMMIT'),
    );
    assert.equal(rewriteError, undefined);
    const error = await outcome(admin.query('CREATE EXTENSION pg_lease'));
    await admin.query(error ? 'ROLLBACK' : 'COMMIT');
    if (!waited) await session.query('COMMIT');
    // The README's first call, an untyped one, made by the administrator.
    if (await installed(admin))
      await admin
        .query(`SELECT * FROM lease.acquire('invoice-run', 'worker-1', '30 seconds')`)
        .catch(() => undefined);
    await assertNothingPlanted(url, planter);
    if (waited) assertRefused(error, '55000', FOREIGN);
    else assertRefused(error, '55000', CHANGED);
  });

  test('committed first: the install waits for the open transaction, then refuses', async () => {
    const { url, planter, session, admin } = await plantedSchema();
    await admin.query(`ALTER SCHEMA lease OWNER TO postgres`);
    await admin.query(`SET lock_timeout = '1s'`);
    const error = await outcome(admin.query('CREATE EXTENSION pg_lease'));
    await session.query('COMMIT');
    await assertNothingPlanted(url, planter);
    assertRefused(error, '55P03', STILL_OPEN, /idle in transaction/);
    // Once the planter has committed, its overload is there to be seen.
    assertRefused(
      await outcome(admin.query('CREATE EXTENSION pg_lease')),
      '55000',
      FOREIGN,
      /function lease\.acquire\(text,text,text\)/,
    );
  });

  test('committed first: the planter commits while the install waits, and the install sees it', async () => {
    const { url, planter, session, admin } = await plantedSchema();
    await admin.query(`ALTER SCHEMA lease OWNER TO postgres`);
    const pid = (await admin.query('SELECT pg_backend_pid() AS pid')).rows[0].pid as number;
    const monitor = await connect(url);
    const install = outcome(admin.query('CREATE EXTENSION pg_lease'));
    await untilWaitingOrDone(monitor, pid, install);
    await session.query('COMMIT');
    const error = await install;
    await assertNothingPlanted(url, planter);
    assertRefused(error, '55000', FOREIGN, /function lease\.acquire\(text,text,text\)/);
  });

  test('committed first: a prepared transaction holds the overload', async () => {
    const planter = await role('planter');
    const url = await database();
    const admin = await connect(url);
    await admin.query(`CREATE SCHEMA lease AUTHORIZATION ${planter}`);
    const session = await connect(url, planter);
    const gid = `plant_${serial}`;
    await session.query('BEGIN');
    await session.query(overload(planter));
    await session.query(`PREPARE TRANSACTION '${gid}'`);
    await admin.query(`ALTER SCHEMA lease OWNER TO postgres`);
    const error = await outcome(admin.query('CREATE EXTENSION pg_lease'));
    await session.query(`COMMIT PREPARED '${gid}'`);
    await assertNothingPlanted(url, planter);
    assertRefused(error, '55000', /prepared transaction/, new RegExp(gid));
  });

  test('committed first: under REPEATABLE READ a plant committed after the snapshot would be missed', async () => {
    const { url, planter, session, admin } = await plantedSchema();
    await admin.query(`ALTER SCHEMA lease OWNER TO postgres`);
    await admin.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
    await admin.query('SELECT 1');
    await session.query('COMMIT');
    const error = await outcome(admin.query('CREATE EXTENSION pg_lease'));
    await admin.query(error ? 'ROLLBACK' : 'COMMIT');
    await assertNothingPlanted(url, planter);
    assertRefused(error, '55000', /READ COMMITTED/);
  });
});

describe('CREATE EXTENSION: objects in a schema lease that a superuser made', () => {
  async function refusedWith(plant: string, detail: RegExp): Promise<void> {
    const attacker = await role('attacker');
    const url = await database();
    const admin = await connect(url);
    await admin.query(`CREATE SCHEMA lease`);
    await admin.query(plant);
    assertRefused(await outcome(admin.query('CREATE EXTENSION pg_lease')), '55000', FOREIGN, detail);
    await assertNothingPlanted(url, attacker);
  }

  test('an overload of an API function and of an internal function', async () => {
    await refusedWith(
      `${overload('nobody')};
       CREATE FUNCTION lease._validate(text, text, text, bigint, interval, interval, integer DEFAULT 0)
         RETURNS void LANGUAGE sql AS 'SELECT'`,
      /function lease\._validate\(text,text,text,bigint,interval,interval,integer\), function lease\.acquire\(text,text,text\)/,
    );
  });

  test('an operator', async () => {
    await refusedWith(
      `CREATE OPERATOR lease.=== (LEFTARG = text, RIGHTARG = text, FUNCTION = texteq)`,
      /operator lease\.===\(text,text\)/,
    );
  });

  test('a type and a cast to it', async () => {
    await refusedWith(
      `CREATE TYPE lease.t AS (a text); CREATE CAST (text AS lease.t) WITH INOUT`,
      /cast from text to lease\.t/,
    );
  });
});

describe('CREATE EXTENSION: privileges a fresh install must not keep', () => {
  const privilegesOf = (who: string) => `
    SELECT (SELECT coalesce(array_agg(c.oid::regclass::text || ':' || a.privilege_type ORDER BY 1), '{}')
              FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.relnamespace = 'lease'::regnamespace AND a.grantee = '${who}'::regrole) AS relations,
           (SELECT coalesce(array_agg(c.oid::regclass::text || '.' || t.attname ORDER BY 1), '{}')
              FROM pg_attribute t JOIN pg_class c ON c.oid = t.attrelid, aclexplode(t.attacl) a
             WHERE c.relnamespace = 'lease'::regnamespace AND a.grantee = '${who}'::regrole) AS columns,
           (SELECT coalesce(array_agg(p.oid::regprocedure::text ORDER BY 1), '{}')
              FROM pg_proc p, aclexplode(p.proacl) a
             WHERE p.pronamespace = 'lease'::regnamespace AND a.grantee = '${who}'::regrole) AS routines,
           (SELECT coalesce(array_agg(t.oid::regtype::text ORDER BY 1), '{}')
              FROM pg_type t, aclexplode(t.typacl) a
             WHERE t.typnamespace = 'lease'::regnamespace AND a.grantee = '${who}'::regrole) AS types,
           has_schema_privilege('${who}', 'lease', 'CREATE') AS schema_create`;
  const NOTHING = { relations: [], columns: [], routines: [], types: [], schema_create: false };

  test('default privileges of the installing role, for schemas, tables, sequences, routines and types', async () => {
    const installer = await role('installer');
    const mallory = await role('mallory');
    const url = await database(installer);
    const client = await connect(url, installer);
    for (const kind of ['SCHEMAS', 'TABLES', 'SEQUENCES', 'ROUTINES', 'TYPES']) {
      await client.query(`ALTER DEFAULT PRIVILEGES GRANT ALL ON ${kind} TO ${mallory}`);
    }
    await client.query('CREATE EXTENSION pg_lease');
    assert.deepEqual((await client.query(privilegesOf(mallory))).rows[0], NOTHING);
    await assertNothingPlanted(url, installer);
  });

  test('default privileges of a superuser for its own objects', async () => {
    const mallory = await role('mallory');
    const url = await database();
    const admin = await connect(url);
    try {
      for (const kind of ['SCHEMAS', 'TABLES', 'SEQUENCES', 'ROUTINES', 'TYPES']) {
        await admin.query(`ALTER DEFAULT PRIVILEGES FOR ROLE postgres GRANT ALL ON ${kind} TO ${mallory}`);
      }
      await admin.query('CREATE EXTENSION pg_lease');
      assert.deepEqual((await admin.query(privilegesOf(mallory))).rows[0], NOTHING);
    } finally {
      for (const kind of ['SCHEMAS', 'TABLES', 'SEQUENCES', 'ROUTINES', 'TYPES']) {
        await admin.query(`ALTER DEFAULT PRIVILEGES FOR ROLE postgres REVOKE ALL ON ${kind} FROM ${mallory}`);
      }
    }
  });

  test("no other role may build on the extension's types: no column, cast or function of theirs", async () => {
    const mallory = await role('mallory');
    const url = await database();
    const admin = await connect(url);
    await admin.query('CREATE EXTENSION pg_lease');
    await admin.query(`CREATE SCHEMA mine AUTHORIZATION ${mallory}`);
    const client = await connect(url, mallory);
    await client.query(`CREATE TYPE mine.t AS (a text)`);
    const types = await admin.query(
      `SELECT t.oid::regtype::text AS name FROM pg_type t
        WHERE t.typnamespace = 'lease'::regnamespace AND t.typtype <> 'm'
          AND NOT (t.typelem <> 0 AND t.typlen = -1) ORDER BY 1`,
    );
    assert.ok(types.rows.length >= 5, 'the domains and the row types');
    const allowed: string[] = [];
    for (const { name } of types.rows as { name: string }[]) {
      for (const sql of [
        `CREATE TABLE mine.c (c ${name})`,
        `CREATE CAST (${name} AS mine.t) WITH INOUT`,
        `CREATE FUNCTION mine.f(${name}) RETURNS int LANGUAGE sql AS 'SELECT 1'`,
      ]) {
        const error = await outcome(client.query(sql));
        if (!error) allowed.push(sql);
        else assert.equal(error.code, '42501', `${sql}: ${error.message}`);
      }
      await client.query('DROP TABLE IF EXISTS mine.c; DROP FUNCTION IF EXISTS mine.f');
    }
    assert.deepEqual(allowed, []);
  });

  test('a schema change earlier in the installing transaction is refused; on its own the install goes through', async () => {
    const installer = await role('installer');
    const url = await database(installer);
    const client = await connect(url, installer);
    await client.query('BEGIN');
    await client.query('GRANT USAGE ON SCHEMA public TO PUBLIC');
    assertRefused(await outcome(client.query('CREATE EXTENSION pg_lease')), '55000', CHANGED);
    await client.query('ROLLBACK');
    const fresh = await connect(url, installer);
    await fresh.query('CREATE EXTENSION pg_lease');
    assert.equal(await installed(fresh), BUNDLED_VERSION);
  });
});

describe('ALTER EXTENSION pg_lease UPDATE from 0.1.0', () => {
  /** 0.1.0 installed in a schema made beforehand and open to PUBLIC (0.1.0 kept its ACL). */
  async function openInstall(): Promise<{ url: string; admin: pg.Client }> {
    const url = await database();
    const admin = await connect(url);
    await admin.query(`CREATE SCHEMA lease; GRANT CREATE, USAGE ON SCHEMA lease TO PUBLIC`);
    await admin.query(`CREATE EXTENSION pg_lease VERSION '0.1.0'`);
    return { url, admin };
  }

  test("an admin follows the update's HINT in one transaction while a planter's transaction is open", async () => {
    const { url, admin } = await openInstall();
    const planter = await role('planter');
    const session = await connect(url, planter);
    await session.query('BEGIN');
    await session.query(overload(planter));
    await admin.query('BEGIN');
    await admin.query('REVOKE CREATE ON SCHEMA lease FROM PUBLIC');
    const error = await outcome(admin.query('ALTER EXTENSION pg_lease UPDATE'));
    await admin.query(error ? 'ROLLBACK' : 'COMMIT');
    await session.query('COMMIT');
    await assertNothingPlanted(url, planter);
    assertRefused(error, '55000', CHANGED);
  });

  test('the REVOKE committed first: the update waits for the open transaction, then refuses', async () => {
    const { url, admin } = await openInstall();
    const planter = await role('planter');
    const session = await connect(url, planter);
    await session.query('BEGIN');
    await session.query(overload(planter));
    await admin.query('REVOKE CREATE ON SCHEMA lease FROM PUBLIC');
    await admin.query(`SET lock_timeout = '1s'`);
    const error = await outcome(admin.query('ALTER EXTENSION pg_lease UPDATE'));
    await session.query('COMMIT');
    await assertNothingPlanted(url, planter);
    assertRefused(error, '55P03', STILL_OPEN, new RegExp(planter));
    assert.equal(await installed(admin), '0.1.0');
  });

  test('the REVOKE committed first, under REPEATABLE READ', async () => {
    const { url, admin } = await openInstall();
    const planter = await role('planter');
    const session = await connect(url, planter);
    await session.query('BEGIN');
    await session.query(overload(planter));
    await admin.query('REVOKE CREATE ON SCHEMA lease FROM PUBLIC');
    await admin.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
    await admin.query('SELECT 1');
    await session.query('COMMIT');
    const error = await outcome(admin.query('ALTER EXTENSION pg_lease UPDATE'));
    await admin.query(error ? 'ROLLBACK' : 'COMMIT');
    await assertNothingPlanted(url, planter);
    assertRefused(error, '55000', /READ COMMITTED/);
  });

  test('column grants on the table made under 0.1.0 do not survive the update', async () => {
    const url = await database();
    const admin = await connect(url);
    const eve = await role('eve');
    await admin.query(`CREATE EXTENSION pg_lease VERSION '0.1.0'`);
    await admin.query(`SELECT lease.acquire('k', 'holder', '1 hour')`);
    await admin.query(`GRANT SELECT (owner), UPDATE (epoch) ON lease.leases TO ${eve}`);
    await admin.query(`GRANT SELECT (key) ON lease.leases TO PUBLIC`);
    await admin.query('ALTER EXTENSION pg_lease UPDATE');
    const client = await connect(url, eve);
    for (const sql of [
      `SELECT owner FROM lease.leases`,
      `SELECT key FROM lease.leases`,
      `UPDATE lease.leases SET epoch = 1`,
    ]) {
      const error = await outcome(client.query(sql));
      assert.equal(error?.code, '42501', `${sql}: ${error?.message ?? 'allowed'}`);
    }
    const { rows } = await admin.query(
      `SELECT a.attrelid::regclass::text || '.' || a.attname AS col, a.attacl::text AS acl
         FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        WHERE c.relnamespace = 'lease'::regnamespace AND a.attacl IS NOT NULL`,
    );
    assert.deepEqual(rows, []);
  });

  test('table, routine and schema USAGE grants to a role made under 0.1.0 do not survive the update', async () => {
    const url = await database();
    const admin = await connect(url);
    const eve = await role('eve');
    await admin.query(`CREATE EXTENSION pg_lease VERSION '0.1.0'`);
    await admin.query(`GRANT ALL ON lease.leases TO ${eve} WITH GRANT OPTION`);
    await admin.query(`GRANT ALL ON ALL FUNCTIONS IN SCHEMA lease TO ${eve}`);
    await admin.query(`GRANT USAGE ON SCHEMA lease TO ${eve}`);
    await admin.query('ALTER EXTENSION pg_lease UPDATE');
    const { rows } = await admin.query(
      `SELECT has_table_privilege($1, 'lease.leases', 'SELECT') AS sel,
              has_function_privilege($1, 'lease._lock_margin()', 'EXECUTE') AS helper,
              has_schema_privilege($1, 'lease', 'CREATE') AS create,
              (SELECT nspacl::text FROM pg_namespace WHERE nspname = 'lease') AS schema_acl`,
      [eve],
    );
    assert.deepEqual(rows[0], {
      sel: false,
      helper: false,
      create: false,
      schema_acl: '{postgres=UC/postgres,=U/postgres}',
    });
  });

  test('a trigger attached to the table through a TRIGGER grant under 0.1.0 is refused', async () => {
    const url = await database();
    const admin = await connect(url);
    const eve = await role('eve');
    await admin.query(`CREATE EXTENSION pg_lease VERSION '0.1.0'`);
    await admin.query(`GRANT TRIGGER ON lease.leases TO ${eve}; GRANT CREATE ON SCHEMA public TO ${eve}`);
    const client = await connect(url, eve);
    await client.query(escalatingTrigger(eve));
    await client.query(
      `CREATE TRIGGER escalate BEFORE INSERT OR UPDATE ON lease.leases
         FOR EACH ROW EXECUTE FUNCTION public.escalate()`,
    );
    const error = await outcome(admin.query('ALTER EXTENSION pg_lease UPDATE'));
    if (!error) {
      // The API is SECURITY DEFINER: any caller's write fires the trigger as superuser.
      await client.query(`SELECT * FROM lease.acquire('k'::text, 'o'::text, '1 minute'::interval)`);
    }
    await assertNothingPlanted(url, eve);
    assertRefused(error, '55000', FOREIGN, /trigger escalate on table lease\.leases/);
  });

  test("a TRIGGER grant under 0.1.0 cannot attach one of the extension's internal functions", async () => {
    const url = await database();
    const admin = await connect(url);
    const eve = await role('eve');
    await admin.query(`CREATE EXTENSION pg_lease VERSION '0.1.0'`);
    await admin.query('ALTER EXTENSION pg_lease UPDATE');
    // What the guard's trigger rule relies on: CREATE TRIGGER needs EXECUTE on the function.
    await admin.query(`GRANT TRIGGER ON lease.leases TO ${eve}`);
    const client = await connect(url, eve);
    const error = await outcome(
      client.query(
        `CREATE CONSTRAINT TRIGGER t AFTER UPDATE ON lease.leases DEFERRABLE INITIALLY DEFERRED
           FOR EACH ROW EXECUTE FUNCTION lease._durable_commit()`,
      ),
    );
    assert.equal(error?.code, '42501', error?.message ?? 'created');
  });

  test('column grants to a role whose name needs quoting do not survive the update', async () => {
    const url = await database();
    const admin = await connect(url);
    await cluster.query(`CREATE ROLE "Eve ${serial}" LOGIN`);
    await admin.query(`CREATE EXTENSION pg_lease VERSION '0.1.0'`);
    await admin.query(`GRANT SELECT (owner) ON lease.leases TO "Eve ${serial}" WITH GRANT OPTION`);
    await admin.query('ALTER EXTENSION pg_lease UPDATE');
    const { rows } = await admin.query(
      `SELECT count(*)::int AS n FROM pg_attribute WHERE attrelid = 'lease.leases'::regclass AND attacl IS NOT NULL`,
    );
    assert.equal(rows[0].n, 0);
  });

  test('a foreign key to the table through a REFERENCES grant under 0.1.0 is refused', async () => {
    const url = await database();
    const admin = await connect(url);
    const eve = await role('eve');
    await admin.query(`CREATE EXTENSION pg_lease VERSION '0.1.0'`);
    await admin.query(`GRANT REFERENCES ON lease.leases TO ${eve}; GRANT CREATE ON SCHEMA public TO ${eve}`);
    const client = await connect(url, eve);
    await client.query(`CREATE TABLE public.pins (key text REFERENCES lease.leases (key))`);
    const error = await outcome(admin.query('ALTER EXTENSION pg_lease UPDATE'));
    await assertNothingPlanted(url, eve);
    assertRefused(error, '55000', FOREIGN, /trigger RI_ConstraintTrigger_\w+ on table lease\.leases/);
  });

  test('default privileges of a superuser for the objects the update adds', async () => {
    const url = await database();
    const admin = await connect(url);
    const eve = await role('eve');
    await admin.query(`CREATE EXTENSION pg_lease VERSION '0.1.0'`);
    try {
      for (const kind of ['TABLES', 'SEQUENCES', 'ROUTINES', 'TYPES']) {
        await admin.query(`ALTER DEFAULT PRIVILEGES FOR ROLE postgres GRANT ALL ON ${kind} TO ${eve}`);
      }
      await admin.query('ALTER EXTENSION pg_lease UPDATE');
      const { rows } = await admin.query(
        `SELECT x.what FROM (
           SELECT c.oid::regclass::text AS what, a.grantee FROM pg_class c, aclexplode(c.relacl) a
            WHERE c.relnamespace = 'lease'::regnamespace
           UNION ALL
           SELECT p.oid::regprocedure::text, a.grantee FROM pg_proc p, aclexplode(p.proacl) a
            WHERE p.pronamespace = 'lease'::regnamespace
           UNION ALL
           SELECT t.oid::regtype::text, a.grantee FROM pg_type t, aclexplode(t.typacl) a
            WHERE t.typnamespace = 'lease'::regnamespace) AS x
          WHERE x.grantee = $1::regrole ORDER BY 1`,
        [eve],
      );
      assert.deepEqual(rows, []);
    } finally {
      for (const kind of ['TABLES', 'SEQUENCES', 'ROUTINES', 'TYPES']) {
        await admin.query(`ALTER DEFAULT PRIVILEGES FOR ROLE postgres REVOKE ALL ON ${kind} FROM ${eve}`);
      }
    }
  });
});

describe('issue 32: the database owner plants while an administrator follows the HINT in one transaction', () => {
  for (const { version: from } of EARLIER_VERSIONS) {
    test(`ALTER EXTENSION pg_lease UPDATE from ${from} refuses, then finds the plant; nothing of it runs as the administrator`, async () => {
      const owner = await role('owner');
      const url = await database(owner);
      const admin = await connect(url);
      const planter = await connect(url, owner);
      if (from === '0.1.0') {
        // 0.1.0 kept the ACL of a schema made beforehand.
        await planter.query('CREATE SCHEMA lease; GRANT CREATE, USAGE ON SCHEMA lease TO PUBLIC');
        await planter.query(`CREATE EXTENSION pg_lease VERSION '0.1.0'`);
      } else {
        await planter.query(`CREATE EXTENSION pg_lease VERSION '${from}'`);
        // Opened later by a superuser, from a session of its own.
        const other = await connect(url);
        await other.query('GRANT CREATE ON SCHEMA lease TO PUBLIC');
        await other.end();
      }
      await planter.query('BEGIN');
      await planter.query(overload(owner));
      await admin.query('BEGIN');
      await admin.query('REVOKE CREATE ON SCHEMA lease FROM PUBLIC');
      const error = await outcome(admin.query('ALTER EXTENSION pg_lease UPDATE'));
      await admin.query(error ? 'ROLLBACK' : 'COMMIT');
      await planter.query('COMMIT');
      assertRefused(error, '55000', CHANGED);
      assert.equal(await installed(admin), from);
      // As the HINT says: the REVOKE committed, then the update in a transaction of its own.
      await admin.query('REVOKE CREATE ON SCHEMA lease FROM PUBLIC');
      const fresh = await connect(url);
      assertRefused(
        await outcome(fresh.query('ALTER EXTENSION pg_lease UPDATE')),
        '55000',
        FOREIGN,
        /function lease\.acquire\(text,text,text\)/,
      );
      await fresh.query('DROP FUNCTION lease.acquire(text, text, text)');
      await fresh.query('ALTER EXTENSION pg_lease UPDATE');
      assert.equal(await installed(fresh), CURRENT_VERSION);
      // The README's first call, untyped, by the administrator.
      await fresh.query(`SELECT * FROM lease.acquire('invoice-run', 'worker-1', '30 seconds')`);
      await assertNothingPlanted(url, owner);
    });
  }
});

describe('updates in several steps in one transaction', () => {
  test(`ALTER EXTENSION UPDATE from 0.1.0 to '${CHAIN_VERSION}' goes through ${BUNDLED_VERSION} in one transaction`, async () => {
    const url = await database();
    const admin = await connect(url);
    await admin.query(`CREATE EXTENSION pg_lease VERSION '0.1.0'`);
    await admin.query(`ALTER EXTENSION pg_lease UPDATE TO '${CHAIN_VERSION}'`);
    assert.equal(await installed(admin), CHAIN_VERSION);
  });

  test("a step after one that had to rewrite the schema row goes through: the guard's own rewrite is not counted", async () => {
    const url = await database();
    const admin = await connect(url);
    const eve = await role('eve');
    // From another session, so that this one's statistics do not count 0.1.0's GRANT or this one.
    const other = await connect(url);
    await other.query(`CREATE EXTENSION pg_lease VERSION '0.1.0'`);
    await other.query(`GRANT USAGE ON SCHEMA lease TO ${eve}`);
    // The step to the current version revokes eve's USAGE, uncounted; the next one goes on.
    await admin.query(`ALTER EXTENSION pg_lease UPDATE TO '${CHAIN_VERSION}'`);
    assert.equal(await installed(admin), CHAIN_VERSION);
    const { rows } = await admin.query(`SELECT has_schema_privilege($1, 'lease', 'USAGE') AS usage`, [
      eve,
    ]);
    assert.equal(rows[0].usage, true, 'USAGE is granted back to PUBLIC only');
    const acl = await admin.query(`SELECT nspacl::text AS acl FROM pg_namespace WHERE nspname = 'lease'`);
    assert.equal(acl.rows[0].acl, '{postgres=UC/postgres,=U/postgres}');
  });

  test(`a non-superuser's CREATE EXTENSION VERSION '${CHAIN_VERSION}' goes through: the first step's take-over of the new schema is not counted`, async () => {
    const installer = await role('installer');
    const url = await database(installer);
    const client = await connect(url, installer);
    // The schema CREATE EXTENSION makes is the installer's until the first step takes it over.
    await client.query(`CREATE EXTENSION pg_lease VERSION '${CHAIN_VERSION}'`);
    assert.equal(await installed(client), CHAIN_VERSION);
    const { rows } = await client.query(
      `SELECT nspowner::regrole::text AS owner FROM pg_namespace WHERE nspname = 'lease'`,
    );
    assert.equal(rows[0].owner, 'postgres');
  });

  test(`a superuser's CREATE EXTENSION VERSION '${CHAIN_VERSION}' goes through`, async () => {
    const url = await database();
    const admin = await connect(url);
    await admin.query(`CREATE EXTENSION pg_lease VERSION '${CHAIN_VERSION}'`);
    assert.equal(await installed(admin), CHAIN_VERSION);
  });

  test('a superuser installs, drops and installs again in one transaction', async () => {
    const url = await database();
    const admin = await connect(url);
    await admin.query('BEGIN');
    await admin.query('CREATE EXTENSION pg_lease');
    await admin.query('DROP EXTENSION pg_lease; DROP SCHEMA lease');
    // The first take-over counts as a rewrite of pg_namespace in this transaction.
    await admin.query('CREATE EXTENSION pg_lease');
    await admin.query('COMMIT');
    assert.equal(await installed(admin), BUNDLED_VERSION);
  });

  test("in a superuser's session, a schema made before the transaction and rewritten in it is refused", async () => {
    const url = await database();
    const admin = await connect(url);
    await admin.query(`CREATE SCHEMA lease; GRANT USAGE ON SCHEMA lease TO PUBLIC`);
    // Any object made since the schema, anywhere in the cluster, takes an OID.
    await admin.query(`CREATE TABLE public.since (a int)`);
    await admin.query('BEGIN');
    await admin.query('CREATE EXTENSION pg_lease');
    await admin.query('GRANT USAGE ON SCHEMA lease TO PUBLIC');
    assertRefused(
      await outcome(admin.query(`ALTER EXTENSION pg_lease UPDATE TO '${CHAIN_VERSION}'`)),
      '55000',
      CHANGED,
    );
    await admin.query('ROLLBACK');
  });
});
