/**
 * pg_lease on Citus: a coordinator and two workers (the system PostgreSQL with the Citus build,
 * started by pg-lease-testing's startCitusCluster), pg_lease installed the way
 * extension/README.md documents it, by the database owner (a role that is not a superuser):
 * `CREATE EXTENSION pg_lease` on the coordinator, then `SELECT lease.distribute()`; then the
 * contract's core behaviours and the 0.2.x API through the coordinator, as that owner, on keys
 * whose shards live on different workers.
 *
 * Without Citus installed the suite is skipped with the reason, except under CI=true or
 * PG_LEASE_NO_SKIP=1, where .ci/run installs it and its absence fails the run.
 */
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { LeaseClient } from 'pg-lease';
import {
  PgCluster,
  citusMissingReason,
  startCitusCluster,
  type CitusCluster,
} from 'pg-lease-testing';
import { formatViolations } from '../support/history-model.js';
import {
  PREFIX,
  coverage,
  createFencedTable,
  runHistory,
  seedFor,
} from '../support/history-run.js';
import { acquire, inspect, pgError, release, renew } from '../support/lease-calls.js';

/** Operations of the randomized history on the cluster (every call crosses to a worker). */
const HISTORY_OPERATIONS = 1_000;

function skipWithoutCitus(): string | false {
  const reason = citusMissingReason();
  if (!reason) return false;
  if (process.env.CI === 'true' || process.env.PG_LEASE_NO_SKIP === '1')
    throw new Error(
      `${reason}, and CI=true or PG_LEASE_NO_SKIP=1 forbids skipping: .ci/run installs Citus`,
    );
  const banner = '!'.repeat(78);
  console.log(`${banner}\n!!! SKIPPING the Citus suite: ${reason}\n${banner}`);
  return reason;
}

const skip = skipWithoutCitus();

/** The database owner: not a superuser; it installs and distributes pg_lease. */
const OWNER = 'citus_db_owner';

describe('pg_lease on Citus (coordinator + 2 workers)', { skip }, () => {
  let citus: CitusCluster;
  /** Connections to the coordinator as {@link OWNER}. */
  let pool: pg.Pool;
  /** Connections to the coordinator as the superuser, to read the table itself. */
  let admin: pg.Pool;
  /** What the owner's install on the coordinator met while another transaction was open on a worker. */
  let blocked: { error: pg.DatabaseError; blocker: number };
  /** Keys by the worker holding their shard: `keys[i]` are all on worker i. */
  let keys: string[][];
  let counter = 0;

  /** A fresh key on worker `w`. */
  function keyOn(w: number): string {
    const key = keys[w]![counter++ % keys[w]!.length]!;
    return `${key}`;
  }

  /** Connection string of the cluster's database on `node` (the coordinator) as `role`. */
  function urlAs(role: string, node = citus.coordinator): string {
    const url = new URL(citus.url(node));
    url.username = role;
    return url.toString();
  }

  before(async () => {
    citus = await startCitusCluster({ extension: false });
    // Citus propagates both to the workers.
    await citus.query(`CREATE ROLE ${OWNER} LOGIN`);
    await citus.query(`ALTER DATABASE ${citus.database} OWNER TO ${OWNER}`);
    // The guard still waits for a transaction on a worker that is not this install's own, even
    // a superuser's. The owner's sessions on that worker (those of this attempt only: Citus's
    // connections end with the coordinator's session) give up after lock_timeout.
    const worker = citus.workers[1]!;
    const setTimeoutOnWorker = (value: string) =>
      citus.query(
        `DO $$ BEGIN
           SET LOCAL citus.enable_ddl_propagation = off;
           ALTER ROLE ${OWNER} IN DATABASE ${citus.database} ${value};
         END $$`,
        [],
        worker,
      );
    await setTimeoutOnWorker(`SET lock_timeout = '1s'`);
    const early = new pg.Client({ connectionString: urlAs(OWNER) });
    const blocker = new pg.Client({ connectionString: citus.url(worker) });
    await early.connect();
    await blocker.connect();
    try {
      await blocker.query('BEGIN');
      const { rows } = await blocker.query<{ pid: number }>(
        'SELECT pg_backend_pid() AS pid, pg_current_xact_id()',
      );
      const error = await pgError(early.query('CREATE EXTENSION pg_lease'));
      blocked = { error, blocker: rows[0]!.pid };
    } finally {
      await blocker.end();
      await early.end();
      await setTimeoutOnWorker('RESET lock_timeout');
    }
    // The documented route, as the database owner (in a new session: the guard tells a schema
    // made in this transaction by this session's counts, which still hold the attempt's).
    const owner = new pg.Client({ connectionString: urlAs(OWNER) });
    await owner.connect();
    try {
      await owner.query('CREATE EXTENSION pg_lease');
      await owner.query('SELECT lease.distribute()');
    } finally {
      await owner.end();
    }
    pool = new pg.Pool({ connectionString: urlAs(OWNER), max: 8 });
    pool.on('error', () => undefined);
    admin = new pg.Pool({ connectionString: citus.url(), max: 2 });
    admin.on('error', () => undefined);
    // Enough keys on each worker for every test to use its own.
    keys = citus.workers.map(() => []);
    for (let i = 0; keys.some((list) => list.length < 40); i++) {
      const key = `citus-key-${i}`;
      const node = await citus.nodeOf('lease.leases', key);
      const w = citus.workers.indexOf(node);
      assert.ok(w >= 0, `the shard of ${key} is on a worker, not the coordinator`);
      if (keys[w]!.length < 40) keys[w]!.push(key);
    }
  });
  after(async () => {
    await pool?.end();
    await admin?.end();
    await citus?.destroy();
  });

  test('distribute() distributed the table by key and the floor as a reference table; every call stays on the coordinator', async () => {
    const { rows: tables } = await citus.query<{ rel: string; method: string }>(
      `SELECT logicalrelid::text AS rel, partmethod AS method FROM pg_dist_partition
        WHERE logicalrelid IN ('lease.leases'::regclass, 'lease.epoch_floor'::regclass) ORDER BY 1`,
    );
    assert.deepEqual(tables, [
      { rel: 'lease.epoch_floor', method: 'n' },
      { rel: 'lease.leases', method: 'h' },
    ]);
    const { rows: delegated } = await citus.query(
      `SELECT objid::regprocedure::text AS fn FROM pg_dist_object
        WHERE classid = 'pg_proc'::regclass AND distribution_argument_index IS NOT NULL`,
    );
    assert.deepEqual(delegated, []);
    // Idempotent.
    await citus.query('SELECT lease.distribute()');
    await citus.query('SELECT lease.distribute()');
  });

  test('the database owner, not a superuser, installed and distributed pg_lease on every node; the guard spares only its own Citus connections', async () => {
    const { rows: roles } = await citus.query<{ super: boolean; dbowner: string }>(
      `SELECT r.rolsuper AS super, d.datdba::regrole::text AS dbowner
         FROM pg_roles r, pg_database d WHERE r.rolname = $1 AND d.datname = current_database()`,
      [OWNER],
    );
    assert.deepEqual(roles, [{ super: false, dbowner: OWNER }]);
    for (const node of [citus.coordinator, ...citus.workers]) {
      const { rows } = await citus.query<{ extowner: string; tables: string; schema: string }>(
        `SELECT e.extowner::regrole::text AS extowner,
                (SELECT string_agg(DISTINCT c.relowner::regrole::text, ',') FROM pg_class c
                  WHERE c.relnamespace = 'lease'::regnamespace AND c.relkind = 'r'
                    AND c.relname IN ('leases', 'epoch_floor')) AS tables,
                (SELECT n.nspowner::regrole::text FROM pg_namespace n WHERE n.nspname = 'lease') AS schema
           FROM pg_extension e WHERE e.extname = 'pg_lease'`,
        [],
        node,
      );
      assert.deepEqual(
        rows,
        [
          {
            extowner: OWNER,
            tables: citus.coordinator.superuser,
            schema: citus.coordinator.superuser,
          },
        ],
        `port ${node.port}`,
      );
    }
    // Distributing again is the owner's too, and nobody else's.
    await pool.query('SELECT lease.distribute()');
    await citus.query(`CREATE ROLE citus_stranger LOGIN`);
    const stranger = new pg.Client({ connectionString: urlAs('citus_stranger') });
    await stranger.connect();
    try {
      const refused = await pgError(stranger.query('SELECT lease.distribute()'));
      assert.equal(refused.code, '42501', refused.message);
    } finally {
      await stranger.end();
    }
    // The install before the one that succeeded: an open transaction on a worker that was not
    // its own made the guard there wait, and lock_timeout end the wait.
    assert.equal(blocked.error.code, '55P03', blocked.error.message);
    assert.match(blocked.error.detail ?? '', new RegExp(`pid ${blocked.blocker} \\(`));
  });

  test('distribute() without Citus is a clear 0A000', async () => {
    await using plain = await PgCluster.start();
    const url = await plain.createDatabase();
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    try {
      const error = await pgError(client.query('SELECT lease.distribute()'));
      assert.equal(error.code, '0A000');
      assert.match(error.message, /needs Citus/);
    } finally {
      await client.end();
    }
  });

  for (const w of [0, 1]) {
    test(`the life of a grant on worker ${w + 1}: acquire, same owner, denial, renew, refusals, release, watermark`, async () => {
      const key = keyOn(w);
      assert.equal(await citus.nodeOf('lease.leases', key), citus.workers[w]);
      const first = await acquire(pool, key, 'w1', '30 seconds');
      assert.equal(first.acquired, true);
      assert.equal(first.epoch, 1n);
      assert.deepEqual(await acquire(pool, key, 'w1', '30 seconds'), first);
      assert.deepEqual(await acquire(pool, key, 'w2', '30 seconds'), {
        acquired: false,
        epoch: null,
        expiresAt: null,
      });
      const renewed = await renew(pool, key, 'w1', 1n, '60 seconds');
      assert.equal(renewed.status, 'ok');
      assert.ok(renewed.expiresAt! > first.expiresAt!);
      assert.equal((await renew(pool, key, 'w2', 1n, '30 seconds')).status, 'not_owner');
      assert.equal((await renew(pool, key, 'w1', 2n, '30 seconds')).status, 'epoch_mismatch');
      assert.equal((await release(pool, key, 'w1', 2n)).status, 'epoch_mismatch');
      assert.equal((await release(pool, key, 'w1', 1n)).status, 'ok');
      assert.deepEqual(await inspect(pool, key), {
        held: false,
        owner: null,
        epoch: 2n,
        expiresAt: null,
      });
      assert.equal((await release(pool, key, 'w1', 1n)).status, 'not_owner');
      // The row is on the worker's shard, not on the coordinator.
      const { rows } = await citus.query<{ n: string }>(
        `SELECT count(*)::text AS n FROM lease.leases WHERE key = $1`,
        [key],
      );
      assert.equal(rows[0]!.n, '1');
      const second = await acquire(pool, key, 'w2', '30 seconds');
      assert.equal(second.epoch, 3n);
      // Invalid input is 22023 as on one server (a NULL key included).
      assert.equal((await pgError(acquire(pool, null, 'w1', '30 seconds'))).code, '22023');
      assert.equal((await pgError(renew(pool, key, 'w2', null, '30 seconds'))).code, '22023');
    });
  }

  test('a lapsed grant is refused (lapsed) and taken over with the next epoch, on both workers', async () => {
    for (const w of [0, 1]) {
      const key = keyOn(w);
      const grant = await acquire(pool, key, 'w1', '200 milliseconds');
      await sleep(400);
      assert.equal((await renew(pool, key, 'w1', grant.epoch, '30 seconds')).status, 'lapsed');
      assert.equal((await inspect(pool, key))!.held, false);
      const next = await acquire(pool, key, 'w2', '30 seconds');
      assert.equal(next.acquired, true);
      assert.equal(next.epoch, grant.epoch! + 1n);
    }
  });

  test("acquire with wait > 0 takes the key at the holder's expiry, or when it is released", async () => {
    const key = keyOn(0);
    await acquire(pool, key, 'holder', '500 milliseconds');
    const started = Date.now();
    const waited = await acquire(pool, key, 'waiter', '30 seconds', '5 seconds');
    assert.equal(waited.acquired, true);
    assert.equal(waited.epoch, 2n);
    assert.ok(Date.now() - started < 4000);

    const other = keyOn(1);
    const held = await acquire(pool, other, 'holder', '30 seconds');
    const waiting = acquire(pool, other, 'waiter', '30 seconds', '10 seconds');
    await sleep(300);
    assert.equal((await release(pool, other, 'holder', held.epoch)).status, 'ok');
    const got = await waiting;
    assert.equal(got.acquired, true);
    assert.equal(got.epoch, 3n);
    const timedOut = await pgError(acquire(pool, other, 'third', '30 seconds', '200 milliseconds'));
    assert.equal(timedOut.code, '57014');
  });

  test('fence: a live epoch passes inside a transaction, a stale one is PLF01; REPEATABLE READ works', async () => {
    const key = keyOn(1);
    const grant = await acquire(pool, key, 'w1', '30 seconds');
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      await client.query('SELECT lease.fence($1, $2)', [key, String(grant.epoch)]);
      await client.query('COMMIT');
      await client.query('BEGIN');
      const stale = await pgError(client.query('SELECT lease.fence($1, $2)', [key, '7']));
      assert.equal(stale.code, 'PLF01');
      await client.query('ROLLBACK');

      await client.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
      const rr = keyOn(0);
      const mine = await acquire(client, rr, 'rr', '30 seconds');
      assert.equal(mine.acquired, true);
      assert.deepEqual(await acquire(client, rr, 'rr', '30 seconds'), mine);
      assert.equal((await renew(client, rr, 'rr', mine.epoch, '30 seconds')).status, 'ok');
      await client.query('SELECT lease.fence($1, $2)', [rr, String(mine.epoch)]);
      await client.query('COMMIT');
      assert.equal((await inspect(pool, rr))!.owner, 'rr');
    } finally {
      client.release();
    }
  });

  test('watch: a release through the coordinator notifies a waiter listening there', async () => {
    const key = keyOn(0);
    const held = await acquire(pool, key, 'holder', '30 seconds');
    const listener = new pg.Client({ connectionString: citus.url() });
    await listener.connect();
    try {
      await listener.query('LISTEN pg_lease');
      const woken = new Promise<string | undefined>((resolve) =>
        listener.on('notification', (message) => resolve(message.payload)),
      );
      const { rows } = await listener.query<{ held: boolean; notifies: boolean }>(
        'SELECT held, notifies FROM lease.watch($1, $2)',
        [key, '10 seconds'],
      );
      assert.deepEqual(rows[0], { held: true, notifies: true });
      assert.equal((await release(pool, key, 'holder', held.epoch)).status, 'ok');
      assert.equal(await woken, key);
    } finally {
      await listener.end();
    }
  });

  test('the client on the coordinator: acquire, renew, release, and a waiting acquire woken by a release', async () => {
    const leases = new LeaseClient(pool, { pollInterval: 5000 });
    const key = keyOn(1);
    const lease = await leases.acquire(key, { ttl: '30s', owner: 'client' });
    assert.ok(lease);
    assert.equal(lease.epoch, 1n);
    assert.ok((await lease.renew()).getTime() > Date.now());
    const started = Date.now();
    const waiting = leases.acquire(key, { ttl: '30s', owner: 'other', wait: '20s' });
    await sleep(500);
    await lease.release();
    const next = await waiting;
    assert.ok(next);
    assert.equal(next.epoch, 3n);
    // Woken by the notification, not by the 5 s poll.
    assert.ok(Date.now() - started < 4000, `waited ${Date.now() - started} ms`);
    await next.release();
  });

  test('the batches across shards: one row per key in input order; a rolled-back batch leaves nothing', async () => {
    const batch = [keyOn(1), keyOn(0), keyOn(1), keyOn(0)];
    const { rows: acquired } = await pool.query<{ key: string; acquired: boolean; epoch: string }>(
      'SELECT key, acquired, epoch::text AS epoch FROM lease.acquire_many($1, $2, $3)',
      [batch, 'batch', '30 seconds'],
    );
    assert.deepEqual(
      acquired.map((row) => [row.key, row.acquired, row.epoch]),
      batch.map((key) => [key, true, '1']),
    );
    const epochs = acquired.map((row) => row.epoch);
    const { rows: renewed } = await pool.query<{ key: string; status: string }>(
      'SELECT key, status FROM lease.renew_many($1, $2, $3, $4)',
      [batch, 'batch', epochs, '30 seconds'],
    );
    assert.deepEqual(
      renewed.map((row) => [row.key, row.status]),
      batch.map((key) => [key, 'ok']),
    );
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      await client.query('SELECT * FROM lease.release_many($1, $2, $3)', [batch, 'batch', epochs]);
      await client.query('ROLLBACK');
    } finally {
      client.release();
    }
    for (const key of batch) assert.equal((await inspect(pool, key))!.owner, 'batch');
    const { rows: released } = await pool.query<{ key: string; status: string }>(
      'SELECT key, status FROM lease.release_many($1, $2, $3)',
      [batch, 'batch', epochs],
    );
    assert.deepEqual(
      released.map((row) => [row.key, row.status]),
      batch.map((key) => [key, 'ok']),
    );
  });

  test('renew_many with skip_locked: a fenced key is answered locked at once, the keys of both workers are renewed', async () => {
    const keys = [keyOn(0), keyOn(1), keyOn(0), keyOn(1)];
    const grants = [];
    for (const key of keys) grants.push(await acquire(pool, key, 'skip', '30 seconds'));
    const fencer = await pool.connect();
    try {
      await fencer.query('BEGIN');
      await fencer.query('SELECT lease.fence($1, $2)', [keys[1], String(grants[1]!.epoch)]);
      const { rows } = await pool.query<{ key: string; status: string; expires_at: Date | null }>(
        `SELECT key, status, expires_at FROM lease.renew_many($1, 'skip', $2, '40 seconds', true)`,
        [keys, grants.map((g) => String(g.epoch))],
      );
      assert.deepEqual(
        rows.map((r) => [r.key, r.status]),
        keys.map((key, i) => [key, i === 1 ? 'locked' : 'ok']),
      );
      for (const [i, key] of keys.entries()) {
        const stored = await inspect(pool, key);
        if (i === 1)
          assert.deepEqual(stored!.expiresAt, grants[1]!.expiresAt, 'the locked key is unchanged');
        else assert.ok(stored!.expiresAt! > grants[i]!.expiresAt!, `${key} was renewed`);
      }
    } finally {
      await fencer.query('ROLLBACK');
      fencer.release();
    }
  });

  test('list: keys of every shard, in key order', async () => {
    const mine = [keyOn(0), keyOn(1), keyOn(0), keyOn(1)];
    for (const key of mine) await acquire(pool, key, 'lister', '30 seconds');
    const { rows } = await pool.query<{ key: string; owner: string }>(
      `SELECT key, owner FROM lease.list('citus-key-') WHERE owner = 'lister'`,
    );
    assert.deepEqual(
      rows.map((row) => row.key),
      [...mine].sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b))),
    );
  });

  test('purge deletes dead keys on every shard and raises the floor everywhere: epochs still grow', async () => {
    const dead = [keyOn(0), keyOn(1)];
    const live = keyOn(0);
    let highest = 0n;
    for (const key of dead) {
      let grant = await acquire(pool, key, 'p', '30 seconds');
      for (let i = 0; i < 3; i++) {
        await release(pool, key, 'p', grant.epoch);
        grant = await acquire(pool, key, 'p', '30 seconds');
      }
      await release(pool, key, 'p', grant.epoch);
      if (grant.epoch! + 1n > highest) highest = grant.epoch! + 1n;
    }
    await acquire(pool, live, 'p', '30 seconds');
    const { rows } = await pool.query<{ n: string }>(`SELECT lease.purge('0 seconds')::text AS n`);
    assert.ok(Number(rows[0]!.n) >= 2);
    for (const key of dead) assert.equal(await inspect(pool, key), undefined);
    assert.equal((await inspect(pool, live))!.held, true);
    // The floor is the same on every node (a reference table), and first grants on either
    // worker are above every purged epoch.
    for (const node of [citus.coordinator, ...citus.workers]) {
      const { rows: floor } = await citus.query<{ epoch: string }>(
        `SELECT epoch::text AS epoch FROM lease.epoch_floor`,
        [],
        node,
      );
      assert.ok(BigInt(floor[0]!.epoch) >= highest, `the floor on port ${node.port}`);
    }
    for (const key of [...dead, keyOn(1)]) {
      const grant = await acquire(pool, key, 'p', '30 seconds');
      assert.ok(grant.epoch! > highest, `${key} got ${grant.epoch}, not above ${highest}`);
    }
  });

  test('racing acquires through the coordinator: one winner per round, on each worker, epochs only grow', async () => {
    const racers = new pg.Pool({ connectionString: citus.url(), max: 12 });
    racers.on('error', () => undefined);
    try {
      for (const w of [0, 1]) {
        const key = keyOn(w);
        let last = 0n;
        for (let round = 0; round < 4; round++) {
          const results = await Promise.all(
            Array.from({ length: 12 }, (_, i) =>
              acquire(racers, key, `racer-${round}-${i}`, '30 seconds'),
            ),
          );
          const winners = results.filter((result) => result.acquired);
          assert.equal(winners.length, 1, `round ${round} on worker ${w + 1}`);
          const winner = winners[0]!;
          assert.ok(winner.epoch! > last);
          last = winner.epoch!;
          const owner = (await inspect(pool, key))!.owner!;
          assert.equal((await release(pool, key, owner, winner.epoch)).status, 'ok');
        }
      }
    } finally {
      await racers.end();
    }
  });

  // Last: it takes a worker down.
  test('fence_row: on a coordinator-local table it admits the live epoch and refuses a stale one; Citus refuses it on a distributed table', async () => {
    const key = keyOn(0);
    const grant = await acquire(pool, key, 'rows', '30 seconds');
    await pool.query(`CREATE SCHEMA IF NOT EXISTS biz`);
    await pool.query(
      `CREATE TABLE biz.local_rows (id int PRIMARY KEY, k text NOT NULL, e bigint NOT NULL)`,
    );
    await pool.query(
      `CREATE TRIGGER fenced BEFORE INSERT OR UPDATE ON biz.local_rows
         FOR EACH ROW EXECUTE FUNCTION lease.fence_row('k', 'e')`,
    );
    await pool.query(`INSERT INTO biz.local_rows VALUES (1, $1, $2)`, [key, String(grant.epoch)]);
    const stale = await pgError(
      pool.query(`INSERT INTO biz.local_rows VALUES (2, $1, $2)`, [key, String(grant.epoch! - 1n)]),
    );
    assert.equal(stale.code, 'PLF01', stale.message);
    const { rows } = await pool.query(`SELECT id FROM biz.local_rows ORDER BY id`);
    assert.deepEqual(rows, [{ id: 1 }]);

    // As extension/README.md says: on a distributed business table, lease.fence instead.
    await pool.query(
      `CREATE TABLE biz.dist_rows (k text COLLATE "C" NOT NULL, id int NOT NULL, e bigint NOT NULL)`,
    );
    await pool.query(
      `SELECT create_distributed_table('biz.dist_rows', 'k', colocate_with => 'lease.leases')`,
    );
    // Colocated: each business row's shard sits with its key's lease (the workers' own
    // lease.leases had kept the domain, and Citus refused the colocation).
    const groups = await citus.query(
      `SELECT count(DISTINCT colocationid)::int AS n FROM pg_dist_partition
        WHERE logicalrelid IN ('lease.leases'::regclass, 'biz.dist_rows'::regclass)`,
    );
    assert.equal(groups.rows[0]!.n, 1);
    const refused = await pgError(
      pool.query(
        `CREATE TRIGGER fenced BEFORE INSERT OR UPDATE ON biz.dist_rows
           FOR EACH ROW EXECUTE FUNCTION lease.fence_row('k', 'e')`,
      ),
    );
    assert.match(refused.message, /trigger/i, `${refused.code}: ${refused.message}`);
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      await client.query('SELECT lease.fence($1, $2)', [key, String(grant.epoch)]);
      await client.query(`INSERT INTO biz.dist_rows VALUES ($1, 1, $2)`, [
        key,
        String(grant.epoch),
      ]);
      await client.query('COMMIT');
    } finally {
      client.release();
    }
    assert.equal((await pool.query(`SELECT count(*)::int AS n FROM biz.dist_rows`)).rows[0]!.n, 1);
  });

  test('bind_owners(true): another role may not take, renew or release an owner bound to a role; off again, it may', async () => {
    await citus.query(`CREATE ROLE citus_alice LOGIN`);
    await citus.query(`CREATE ROLE citus_carol LOGIN`);
    const as = (role: string) => {
      const url = new URL(citus.url());
      url.username = role;
      return new pg.Client({ connectionString: url.toString() });
    };
    const alice = as('citus_alice');
    const carol = as('citus_carol');
    await alice.connect();
    await carol.connect();
    try {
      const key = keyOn(1);
      const owner = 'citus_alice/job';
      assert.equal((await pool.query(`SELECT lease.bind_owners(true) AS on`)).rows[0]!.on, true);
      const grant = await acquire(alice, key, owner, '30 seconds');
      assert.equal(grant.acquired, true);
      // One at a time: carol is one connection.
      for (const call of [
        () => carol.query(`SELECT * FROM lease.acquire($1, $2, '30 seconds')`, [key, owner]),
        () =>
          carol.query(`SELECT * FROM lease.renew($1, $2, $3, '30 seconds')`, [
            key,
            owner,
            String(grant.epoch),
          ]),
        () =>
          carol.query(`SELECT * FROM lease.release($1, $2, $3)`, [key, owner, String(grant.epoch)]),
      ]) {
        const error = await pgError(call());
        assert.equal(error.code, '42501', error.message);
      }
      assert.deepEqual(await inspect(pool, key), {
        held: true,
        owner,
        epoch: grant.epoch,
        expiresAt: grant.expiresAt,
      });
      assert.equal((await pool.query(`SELECT lease.bind_owners(false) AS on`)).rows[0]!.on, false);
      assert.equal((await release(carol, key, owner, grant.epoch)).status, 'ok');
    } finally {
      await pool.query(`SELECT lease.bind_owners(false)`);
      await alice.end();
      await carol.end();
    }
  });

  test('a randomized history of every call through the coordinator keeps every invariant', async (t) => {
    const client = await pool.connect();
    try {
      await createFencedTable(client);
    } finally {
      client.release();
    }
    const seed = seedFor();
    const started = performance.now();
    // READ COMMITTED only, and no list: under REPEATABLE READ each node takes its snapshot when
    // the transaction first reaches it, and list reads each shard at its own moment, where the
    // model assumes one instant (extension/README.md, "Running on Citus").
    const { history, violations, operations } = await runHistory(
      citus.url(),
      seed,
      HISTORY_OPERATIONS,
      {
        rowsOf: admin,
        repeatableRead: false,
        list: false,
      },
    );
    t.diagnostic(
      `seed ${seed}: ${operations} operations in ${Math.round(performance.now() - started)} ms; ` +
        JSON.stringify(coverage(history)),
    );
    assert.equal(
      violations.length,
      0,
      `seed ${seed}: ${formatViolations(history, violations, 6, PREFIX)}`,
    );
  });

  test('kill -9 of a worker mid-load: its keys fail with an error, the other worker goes on, nothing acknowledged is lost', async () => {
    const down = citus.workers[0]!;
    const onDown = Array.from({ length: 4 }, () => keyOn(0));
    const onUp = Array.from({ length: 4 }, () => keyOn(1));
    const acknowledged = new Map<string, bigint>();
    let stop = false;
    let failures = 0;
    const load = async (key: string) => {
      while (!stop) {
        try {
          const grant = await acquire(pool, key, 'loader', '60 seconds');
          if (grant.acquired) {
            acknowledged.set(key, grant.epoch!);
            assert.equal((await release(pool, key, 'loader', grant.epoch)).status, 'ok');
            acknowledged.set(key, grant.epoch! + 1n);
          }
        } catch {
          failures++;
          await sleep(50);
        }
      }
    };
    const loaders = [...onDown, ...onUp].map((key) => load(key));
    await sleep(500);
    await down.crash();
    const failuresAtCrash = failures;
    // While it is down: its keys fail with an error (never a wrong answer), the other's work.
    const error = await pgError(acquire(pool, onDown[0]!, 'probe', '1 second'));
    assert.ok(error.message.length > 0);
    for (const key of onUp) {
      const grant = await acquire(pool, key, 'probe', '30 seconds');
      if (grant.acquired) {
        acknowledged.set(key, grant.epoch!);
        assert.equal((await release(pool, key, 'probe', grant.epoch)).status, 'ok');
        acknowledged.set(key, grant.epoch! + 1n);
      }
    }
    await sleep(300);
    await down.start();
    await sleep(1000);
    stop = true;
    await Promise.all(loaders);
    assert.ok(failures > failuresAtCrash || failures > 0, 'the load saw the worker go');
    // Every acknowledged epoch (grant or release watermark) survived the crash.
    await citus.coordinator.pollQueryUntil(
      `SELECT count(*) >= 0 FROM lease.leases WHERE key = '${onDown[0]}'`,
      't',
      { database: citus.database, timeoutMs: 30_000 },
    );
    for (const [key, epoch] of acknowledged) {
      const row = await inspect(pool, key);
      assert.ok(row, `${key} has a row`);
      assert.ok(
        row.epoch >= epoch,
        `${key}: epoch ${row.epoch} after the crash, ${epoch} acknowledged`,
      );
    }
    for (const key of onDown) {
      const grant = await acquire(pool, key, 'after', '30 seconds');
      if (grant.acquired) assert.ok(grant.epoch! > (acknowledged.get(key) ?? 0n));
    }
  });
});
