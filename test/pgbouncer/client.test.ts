/**
 * The client behind PgBouncer in transaction mode, with far more clients than server
 * connections: every call is one autocommitted statement, so it needs nothing of a session
 * and any server connection will do. The client's named statements are refused on the first
 * server connection that does not know them, and it goes on unnamed (README: "Running behind
 * PgBouncer").
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { LeaseClient, LeaseTimeoutError, type Lease } from '../../src/index.js';
import {
  POOL_SIZE,
  assertNothingLeftOnServer,
  bouncedPool,
  sampled,
  skipWithoutPgBouncer,
  startBounced,
  type Bounced,
} from './support.js';

const skip = skipWithoutPgBouncer();

describe('client behind PgBouncer (transaction pooling)', { skip }, () => {
  let bounced: Bounced;
  before(async () => {
    bounced = await startBounced();
  });
  after(() => bounced?.close());

  /** `n` clients through PgBouncer, each with a pool of its own. */
  function clients(n: number, perClient = 2) {
    const pools = Array.from({ length: n }, () => bouncedPool(bounced.url, perClient));
    return {
      leases: pools.map((pool) => new LeaseClient(pool)),
      end: () => Promise.all(pools.map((pool) => pool.end())),
    };
  }

  test('forty clients cycle acquire, renew and release over six keys through four server connections, with no error and no epoch granted twice', async () => {
    const { leases, end } = clients(40);
    const grants: { key: string; epoch: bigint; owner: string }[] = [];
    const statuses = new Map<string, number>();
    const stopAt = Date.now() + 3_000;
    try {
      const { maxServer, maxClients } = await sampled(
        bounced,
        Promise.all(
          leases.map(async (client) => {
            while (Date.now() < stopAt) {
              const key = `cycle/${Math.floor(Math.random() * 6)}`;
              const lease = await client.acquire(key, { ttl: '10s' });
              if (!lease) {
                await sleep(Math.random() * 10);
                continue;
              }
              grants.push({ key, epoch: lease.epoch, owner: lease.owner });
              await lease.renew();
              const status = await lease.release();
              statuses.set(status, (statuses.get(status) ?? 0) + 1);
            }
          }),
        ),
      );
      const seen = new Set<string>();
      for (const grant of grants) {
        const id = `${grant.key}#${grant.epoch}`;
        assert.ok(!seen.has(id), `${id} granted twice`);
        seen.add(id);
      }
      assert.deepEqual([...statuses.keys()], ['ok'], 'every release of a renewed grant is ok');
      assert.ok(grants.length >= 30, `only ${grants.length} grants`);
      assert.ok(
        maxServer <= POOL_SIZE,
        `${maxServer} server connections for a pool of ${POOL_SIZE}`,
      );
      assert.ok(maxClients > POOL_SIZE * 3, `only ${maxClients} clients at once`);
      await assertNothingLeftOnServer(bounced.admin);
    } finally {
      await end();
    }
  });

  test('keep-alive leases and withLease hold through the pooler while thirty other clients compete for the same keys', async () => {
    const holders = clients(6);
    const others = clients(30, 1);
    const keys = Array.from({ length: 6 }, (_, n) => `keep/${n}`);
    let stop = false;
    const releasing = new Set<string>();
    // Competitors start once every key is held, so that every grant they get is a violation.
    const allHeld = (async () => {
      const probe = others.leases[0]!;
      while (!stop) {
        const states = await Promise.all(keys.map((key) => probe.inspect(key)));
        if (states.every((state) => state?.held)) return;
        await sleep(20);
      }
    })();
    const competing = others.leases.map(async (client, n) => {
      await allHeld;
      let denied = 0;
      while (!stop) {
        const lease = await client.acquire(keys[n % keys.length]!, { ttl: '5s' });
        if (lease) {
          await lease.release();
          if (releasing.has(lease.key)) break; // its holder is done
          throw new Error(`${lease.key} granted to a competitor while held`);
        }
        denied++;
        await sleep(50);
      }
      return denied;
    });
    try {
      const held = await Promise.all(
        holders.leases.map((client, n) =>
          n % 2 === 0
            ? client.withLease(keys[n]!, { ttl: '3s' }, async (lease, signal) => {
                await sleep(6_000, undefined, { signal });
                releasing.add(lease.key);
                return lease;
              })
            : (async () => {
                const lease = (await client.acquire(keys[n]!, { ttl: '3s', keepAlive: true }))!;
                await sleep(6_000);
                assert.equal(lease.signal.aborted, false, `${lease.key} lost under keep-alive`);
                releasing.add(lease.key);
                assert.equal(await lease.release(), 'ok');
                return lease;
              })(),
        ),
      );
      stop = true;
      const denials = await Promise.all(competing);
      for (const lease of held) assert.equal(lease.lost, undefined, `${lease.key}: ${lease.lost}`);
      assert.ok(
        denials.every((n) => n > 0),
        'every competitor was turned away at least once',
      );
      await assertNothingLeftOnServer(bounced.admin);
    } finally {
      stop = true;
      await Promise.allSettled(competing);
      await holders.end();
      await others.end();
    }
  });

  test('client waits through the pooler hand the key on and keep no server connection busy', async () => {
    const { leases, end } = clients(POOL_SIZE);
    const [holderClient, ...waiterClients] = leases as [LeaseClient, ...LeaseClient[]];
    try {
      const holder = (await holderClient.acquire('wait/chain', { ttl: '30s' }))!;
      const waiters = waiterClients.map(async (client) => {
        const lease = await client.acquire('wait/chain', { ttl: '30s', wait: '60s' });
        await sleep(100);
        assert.equal(await lease!.release(), 'ok');
        return lease!;
      });
      // The waiters poll with short attempts: none of them sits in lease.acquire on the server.
      await sleep(2_500);
      assert.deepEqual(await serverWaiters(bounced.admin), []);
      await holder.renew();
      assert.equal(await holder.release(), 'ok');
      const got = await Promise.all(waiters);
      assert.equal(new Set(got.map((lease) => lease.epoch)).size, waiterClients.length);
      for (const lease of got) assert.ok(lease.epoch > holder.epoch);
      await assertNothingLeftOnServer(bounced.admin);
    } finally {
      await end();
    }
  });

  test('as many client waits as server connections do not starve the holder: its renew goes through at once', async () => {
    const { leases, end } = clients(POOL_SIZE + 1, 1);
    const [holderClient, ...waiterClients] = leases as [LeaseClient, ...LeaseClient[]];
    try {
      const holder: Lease = (await holderClient.acquire('wait/starved', { ttl: '60s' }))!;
      const waits = waiterClients.map((client) =>
        client.acquire('wait/starved', { ttl: '30s', wait: '3s' }).then(
          () => assert.fail('a waiter got a held key'),
          (error: unknown) => error,
        ),
      );
      await sleep(1_000);
      const started = performance.now();
      await holder.renew();
      // A wait that held a server connection would hold it for its whole 3 s.
      assert.ok(performance.now() - started < 2_000, 'the renew queued behind the waiters');
      for (const error of await Promise.all(waits)) assert.ok(error instanceof LeaseTimeoutError);
      assert.equal(await holder.release(), 'ok');
      await assertNothingLeftOnServer(bounced.admin);
    } finally {
      await end();
    }
  });

  /** Backends that have been in lease.acquire for over 100 ms (a wait held on the server). */
  async function serverWaiters(admin: Bounced['admin']): Promise<number[]> {
    const { rows } = await admin.query<{ pid: number }>(
      `SELECT pid FROM pg_stat_activity
        WHERE state = 'active' AND query LIKE '%lease.acquire%' AND pid <> pg_backend_pid()
          AND clock_timestamp() - query_start > interval '100 milliseconds'`,
    );
    return rows.map((row) => row.pid);
  }
});
