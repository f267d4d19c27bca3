/**
 * SEMANTICS.md §1: the table is closed to PUBLIC, the four functions are SECURITY DEFINER with
 * search_path pinned to `pg_catalog, pg_temp`, and objects a caller plants in its own search path
 * (a `public.=(text, text)` operator, a `public.clock_timestamp()`, a temp table named `leases`)
 * are never used by them.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type pg from 'pg';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { acquire, inspect, leaseTable, pgError, release, renew } from '../support/lease-calls.js';
import { uniqueKey } from '../support/helpers.js';
import { createRole, type TestRole } from '../support/roles.js';

const API = [
  'lease.acquire(text,text,interval,interval)',
  'lease.renew(text,text,bigint,interval)',
  'lease.release(text,text,bigint)',
  'lease.inspect(text)',
  'lease.bind_owners(boolean)',
  'lease.list(text,boolean)',
  'lease.fence(text,bigint)',
  'lease.acquire_many(text[],text,interval)',
  'lease.renew_many(text[],text,bigint[],interval)',
  'lease.renew_many(text[],text,bigint[],interval,boolean)',
  'lease.release_many(text[],text,bigint[])',
  'lease.watch(text,interval)',
  // 0.3.0, §13.
  'lease.set_limit(text,integer)',
  'lease.holders(text)',
  // 0.3.0, §13 shared and exclusive.
  'lease.acquire_shared(text,text,interval,interval)',
  // Takes no argument; only the extension's owner and superusers get past its check.
  'lease.distribute()',
];

let db: TestDatabase;
let stranger: TestRole;
before(async () => {
  db = await createTestDatabase();
  stranger = await createRole(db);
});
after(async () => {
  await stranger.drop();
  await db.close();
});

describe('privileges', () => {
  test('a fresh role cannot select, insert, update, delete or truncate the lease table', async () => {
    const table = await leaseTable(db.pool);
    await acquire(db.pool, uniqueKey('privileges'), 'worker-a', '1 minute');
    const client = await stranger.connect();
    for (const sql of [
      `SELECT * FROM ${table}`,
      `SELECT count(*) FROM ${table}`,
      `INSERT INTO ${table} (key, owner, epoch, expires_at) VALUES ('forged', 'mallory', 1, now())`,
      `UPDATE ${table} SET epoch = 1`,
      `DELETE FROM ${table}`,
      `TRUNCATE ${table}`,
      `COPY ${table} TO STDOUT`,
    ]) {
      const error = await pgError(client.query(sql));
      assert.equal(error.code, '42501', `${sql}: ${error.message}`);
    }
  });

  test('PUBLIC holds no privilege on any relation of schema lease', async () => {
    const { rows } = await db.pool.query(
      `SELECT c.oid::regclass::text AS relation, acl.privilege_type
         FROM pg_class c, LATERAL aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) acl
        WHERE c.relnamespace = 'lease'::regnamespace AND acl.grantee = 0`,
    );
    assert.deepEqual(rows, []);
  });

  test('a fresh role cannot create objects in schema lease', async () => {
    const client = await stranger.connect();
    const error = await pgError(client.query('CREATE TABLE lease.planted (n int)'));
    assert.equal(error.code, '42501');
    const fn = await pgError(
      client.query('CREATE FUNCTION lease.planted() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$'),
    );
    assert.equal(fn.code, '42501');
  });

  test("a fresh role may not call lease.distribute(), which runs with the definer's rights", async () => {
    const client = await stranger.connect();
    const error = await pgError(client.query('SELECT lease.distribute()'));
    assert.equal(error.code, '42501', error.message);
    // Who may: without Citus it goes on to say so.
    assert.equal((await pgError(db.pool.query('SELECT lease.distribute()'))).code, '0A000');
  });

  test('a fresh role uses all four functions without any grant on the table', async () => {
    const client = await stranger.connect();
    const key = uniqueKey('stranger');
    const granted = await acquire(client, key, 'worker-a', '1 minute');
    assert.deepEqual([granted.acquired, granted.epoch], [true, 1n]);
    assert.equal((await renew(client, key, 'worker-a', granted.epoch, '1 minute')).status, 'ok');
    assert.equal((await inspect(client, key))?.owner, 'worker-a');
    assert.equal((await release(client, key, 'worker-a', granted.epoch)).status, 'ok');
    assert.equal((await inspect(db.pool, key))?.epoch, 2n);
  });
});

describe('SECURITY DEFINER and search_path', () => {
  test('the API functions are SECURITY DEFINER with search_path pinned to pg_catalog, pg_temp', async () => {
    for (const signature of API) {
      const { rows } = await db.pool.query(
        `SELECT prosecdef, proconfig FROM pg_proc WHERE oid = $1::regprocedure`,
        [signature],
      );
      assert.equal(rows[0].prosecdef, true, `${signature} is SECURITY DEFINER`);
      const paths = ((rows[0].proconfig ?? []) as string[]).filter((setting) =>
        setting.startsWith('search_path='),
      );
      assert.equal(paths.length, 1, `${signature} pins search_path`);
      const pinned = paths[0]!
        .slice('search_path='.length)
        .split(',')
        .map((part) => part.trim().replace(/^"(.*)"$/, '$1'));
      assert.deepEqual(pinned, ['pg_catalog', 'pg_temp'], signature);
    }
  });

  test('every function of the extension whose body is resolved at run time pins search_path', async () => {
    const { rows } = await db.pool.query(
      `SELECT p.oid::regprocedure::text AS fn, p.proconfig
         FROM pg_proc p
        WHERE p.pronamespace = 'lease'::regnamespace AND p.prosqlbody IS NULL`,
    );
    assert.ok(rows.length >= 4);
    for (const row of rows) {
      const pinned = ((row.proconfig ?? []) as string[]).some((setting) =>
        /^search_path="?pg_catalog"?,\s*"?pg_temp"?$/.test(setting),
      );
      assert.ok(pinned, `${row.fn} runs with the caller's search_path`);
    }
  });

  test('no SECURITY DEFINER function but the API functions is executable by PUBLIC', async () => {
    const { rows } = await db.pool.query(
      `SELECT p.oid::regprocedure::text AS fn
         FROM pg_proc p, LATERAL aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) acl
        WHERE p.pronamespace = 'lease'::regnamespace AND p.prosecdef
          AND acl.grantee = 0 AND acl.privilege_type = 'EXECUTE'`,
    );
    const exposed = rows.map((row) => row.fn as string).sort();
    assert.deepEqual(
      exposed.filter((fn) => !API.includes(fn.replace(/ /g, ''))),
      [],
      'helpers must not be callable with the definer rights',
    );
  });
});

describe('hostile objects in the caller search_path are not used', () => {
  let caller: TestRole;
  let client: pg.Client;

  before(async () => {
    caller = await createRole(db, 'GRANT CREATE, USAGE ON SCHEMA public TO %I');
    client = await caller.connect();
    await client.query(`
      CREATE TABLE public.hijack_log (what text, query text);
      CREATE FUNCTION public.hijacked(what text) RETURNS boolean LANGUAGE sql VOLATILE
        AS $$ INSERT INTO public.hijack_log VALUES (what, pg_catalog.current_query()) RETURNING true $$;

      CREATE FUNCTION public.clock_timestamp() RETURNS timestamptz LANGUAGE sql VOLATILE
        AS $$ SELECT CASE WHEN public.hijacked('clock_timestamp()') THEN timestamptz '2000-01-01' END $$;
      CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE sql VOLATILE
        AS $$ SELECT CASE WHEN public.hijacked('now()') THEN timestamptz '2000-01-01' END $$;
      CREATE FUNCTION public.octet_length(text) RETURNS integer LANGUAGE sql VOLATILE
        AS $$ SELECT CASE WHEN public.hijacked('octet_length(text)') THEN 1 END $$;
      CREATE FUNCTION public.length(text) RETURNS integer LANGUAGE sql VOLATILE
        AS $$ SELECT CASE WHEN public.hijacked('length(text)') THEN 1 END $$;
      CREATE FUNCTION public.isfinite(interval) RETURNS boolean LANGUAGE sql VOLATILE
        AS $$ SELECT public.hijacked('isfinite(interval)') $$;
      CREATE FUNCTION public.pg_sleep(double precision) RETURNS void LANGUAGE sql VOLATILE
        AS $$ SELECT public.hijacked('pg_sleep(float8)'); SELECT $$;

      CREATE FUNCTION public.evil_text_eq(text, text) RETURNS boolean LANGUAGE sql VOLATILE
        AS $$ SELECT public.hijacked('=(text,text)') $$;
      CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.evil_text_eq);
      CREATE FUNCTION public.evil_text_ne(text, text) RETURNS boolean LANGUAGE sql VOLATILE
        AS $$ SELECT NOT public.hijacked('<>(text,text)') $$;
      CREATE OPERATOR public.<> (LEFTARG = text, RIGHTARG = text, FUNCTION = public.evil_text_ne);
      CREATE FUNCTION public.evil_bigint_eq(bigint, bigint) RETURNS boolean LANGUAGE sql VOLATILE
        AS $$ SELECT public.hijacked('=(bigint,bigint)') $$;
      CREATE OPERATOR public.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = public.evil_bigint_eq);
      CREATE FUNCTION public.evil_bigint_ne(bigint, bigint) RETURNS boolean LANGUAGE sql VOLATILE
        AS $$ SELECT NOT public.hijacked('<>(bigint,bigint)') $$;
      CREATE OPERATOR public.<> (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = public.evil_bigint_ne);
      CREATE FUNCTION public.evil_ts_cmp(timestamptz, timestamptz) RETURNS boolean LANGUAGE sql VOLATILE
        AS $$ SELECT public.hijacked('comparison of timestamptz') $$;
      CREATE OPERATOR public.< (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = public.evil_ts_cmp);
      CREATE OPERATOR public.<= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = public.evil_ts_cmp);
      CREATE OPERATOR public.> (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = public.evil_ts_cmp);
      CREATE OPERATOR public.>= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = public.evil_ts_cmp);
      CREATE FUNCTION public.evil_ts_plus(timestamptz, interval) RETURNS timestamptz LANGUAGE sql VOLATILE
        AS $$ SELECT CASE WHEN public.hijacked('+(timestamptz,interval)') THEN timestamptz '2000-01-01' END $$;
      CREATE OPERATOR public.+ (LEFTARG = timestamptz, RIGHTARG = interval, FUNCTION = public.evil_ts_plus);
      CREATE FUNCTION public.evil_interval_cmp(interval, interval) RETURNS boolean LANGUAGE sql VOLATILE
        AS $$ SELECT NOT public.hijacked('comparison of interval') $$;
      CREATE OPERATOR public.<= (LEFTARG = interval, RIGHTARG = interval, FUNCTION = public.evil_interval_cmp);
      CREATE OPERATOR public.< (LEFTARG = interval, RIGHTARG = interval, FUNCTION = public.evil_interval_cmp);
      CREATE OPERATOR public.= (LEFTARG = interval, RIGHTARG = interval, FUNCTION = public.evil_interval_cmp);

      -- Unqualified table names inside a function pinned to "pg_catalog, pg_temp" would find this.
      CREATE TEMP TABLE leases (key text, owner text, epoch bigint, expires_at timestamptz);
      SET search_path = public, pg_catalog;
    `);
  });
  after(async () => {
    await client.end();
    await caller.drop();
  });

  async function hijacks(): Promise<string[]> {
    const { rows } = await client.query(
      `SELECT DISTINCT what || ' in: ' || query AS hijack FROM public.hijack_log ORDER BY 1`,
    );
    return rows.map((row) => row.hijack as string);
  }

  async function realNow(): Promise<bigint> {
    const { rows } = await client.query(
      `SELECT (pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) * 1000000)::bigint::text AS t`,
    );
    return BigInt(rows[0].t);
  }

  test('the planted objects do capture unqualified calls (the trap is armed)', async () => {
    const { rows } = await client.query(
      `SELECT 'a'::text = 'b'::text AS eq, clock_timestamp() < timestamptz '2001-01-01' AS old`,
    );
    assert.deepEqual(rows, [{ eq: true, old: true }]);
    assert.ok((await hijacks()).length > 0);
    await client.query('TRUNCATE public.hijack_log');
  });

  test('no planted operator, function or temp table is used by any API call', async () => {
    const key = uniqueKey('hostile');
    await client.query(
      `INSERT INTO pg_temp.leases VALUES ($1, 'mallory', 99, timestamptz '2999-01-01')`,
      [key],
    );

    const t0 = await realNow();
    const granted = await acquire(client, key, 'alice', '1 minute');
    const t1 = await realNow();
    assert.deepEqual([granted.acquired, granted.epoch], [true, 1n]);
    const x = granted.expiresAt!;
    assert.ok(x >= t0 + 60_000_000n && x <= t1 + 60_000_000n, 'expiry from the real server clock');

    assert.equal((await acquire(client, key, 'mallory', '1 minute')).acquired, false);
    assert.equal((await renew(client, key, 'mallory', 1, '1 minute')).status, 'not_owner');
    assert.equal((await renew(client, key, 'alice', 2, '1 minute')).status, 'epoch_mismatch');
    assert.equal((await release(client, key, 'mallory', 1)).status, 'not_owner');
    const timedOut = await pgError(acquire(client, key, 'mallory', '1 minute', '120 milliseconds'));
    assert.equal(timedOut.code, '57014');
    assert.equal((await pgError(acquire(client, key, 'alice', '0'))).code, '22023');
    assert.equal((await pgError(acquire(client, 'x'.repeat(1001), 'alice', '1 minute'))).code, '22023');
    assert.deepEqual(await inspect(client, key), {
      held: true,
      owner: 'alice',
      epoch: 1n,
      expiresAt: x,
    });
    assert.equal((await release(client, key, 'alice', 1)).status, 'ok');
    assert.equal((await inspect(client, key))?.epoch, 2n);

    assert.deepEqual(await hijacks(), [], 'planted objects were called by pg_lease');
  });

  test('no planted operator, function or temp table is used by lease.fence or the fence_row trigger', async () => {
    await client.query(`
      CREATE FUNCTION public.evil_jsonb_get(jsonb, text) RETURNS text LANGUAGE sql VOLATILE
        AS $$ SELECT CASE WHEN public.hijacked('->>(jsonb,text)') THEN 'planted' END $$;
      CREATE OPERATOR public.->> (LEFTARG = jsonb, RIGHTARG = text, FUNCTION = public.evil_jsonb_get);
      CREATE FUNCTION public.evil_oid_eq(oid, oid) RETURNS boolean LANGUAGE sql VOLATILE
        AS $$ SELECT public.hijacked('=(oid,oid)') $$;
      CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = oid, FUNCTION = public.evil_oid_eq);
      CREATE TABLE public.hostile_jobs (id int, lease_key text, lease_epoch bigint);
      CREATE TRIGGER hostile_jobs_fence BEFORE INSERT OR UPDATE ON public.hostile_jobs
        FOR EACH ROW EXECUTE FUNCTION lease.fence_row('lease_key', 'lease_epoch');
    `);
    const key = uniqueKey('hostile-fence');
    await client.query(
      `INSERT INTO pg_temp.leases VALUES ($1, 'mallory', 7, timestamptz '2999-01-01')`,
      [key],
    );
    const granted = await acquire(client, key, 'alice', '1 minute');
    await client.query('SELECT lease.fence($1, $2)', [key, String(granted.epoch)]);
    assert.equal((await pgError(client.query('SELECT lease.fence($1, 7)', [key]))).code, 'PLF01');
    await client.query('INSERT INTO public.hostile_jobs VALUES (1, $1, $2)', [key, String(granted.epoch)]);
    const stale = await pgError(client.query('INSERT INTO public.hostile_jobs VALUES (2, $1, 7)', [key]));
    assert.equal(stale.code, 'PLF01');
    assert.equal((await pgError(client.query("INSERT INTO public.hostile_jobs VALUES (3, 'x', NULL)"))).code, '22023');
    assert.deepEqual(await hijacks(), [], 'planted objects were called by pg_lease');
  });
});
