/**
 * Failure model, planned downtime: the server is stopped and started again on the same data
 * directory. The last committed state must stand, and downtime never extends ownership.
 * One durable cluster (fsync on) serves the whole file; the checks run one after another
 * because each of them restarts it.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type pg from 'pg';
import type { PgCluster } from 'pg-lease-testing';
import {
  acquireTimed as acquire,
  inspect,
  inspectAll,
  releaseTimed as release,
  renew,
} from '../support/lease-calls.js';
import {
  backendPid,
  connect,
  disconnect,
  rejectsSomehow,
  sleepPastWhileDown,
  startDurableCluster,
  waitUntilWaiting,
} from './support/sessions.js';

const ADMIN_SHUTDOWN = '57P01';

describe('restart', () => {
  let cluster: PgCluster;
  let url: string;
  let db: pg.Client;

  before(async () => {
    cluster = await startDurableCluster();
    url = await cluster.createDatabase('leases');
  });
  after(async () => {
    await disconnect(db);
    await cluster?.destroy();
  });

  /** Opens the test's connection; the previous one died with the server. */
  async function reconnect(): Promise<pg.Client> {
    await disconnect(db);
    // A check that failed half-way may have left the server down; the next one starts it.
    if (!cluster.running) await cluster.start();
    db = await connect(url);
    return db;
  }

  test('a clean restart keeps every holder, epoch and expiry', async () => {
    await reconnect();
    const held = await acquire(db, 'restart/held', 'worker-a', '60 seconds');
    const renewed = await renew(db, 'restart/held', 'worker-a', held.epoch!, '90 seconds');
    assert.equal(renewed.status, 'ok');
    const freed = await acquire(db, 'restart/free', 'worker-a', '60 seconds');
    assert.equal((await release(db, 'restart/free', 'worker-a', freed.epoch!)).status, 'ok');
    await acquire(db, 'restart/lapsed', 'worker-a', '1 microsecond');
    const keys = ['restart/held', 'restart/free', 'restart/lapsed', 'restart/never'];
    const before = await inspectAll(db, keys);
    assert.deepEqual(before[0], {
      held: true,
      owner: 'worker-a',
      epoch: 1n,
      expiresAt: renewed.expiresAt,
    });
    assert.deepEqual(before[1], { held: false, owner: null, epoch: 2n, expiresAt: null });
    assert.deepEqual(before[2], { held: false, owner: null, epoch: 1n, expiresAt: null });
    assert.equal(before[3], undefined);

    await cluster.restart();
    await reconnect();

    const afterRestart = await inspectAll(db, keys);
    assert.deepEqual(afterRestart, before);
    // The holder is still recognised by its epoch, and its expiry is the one it had.
    const again = await acquire(db, 'restart/held', 'worker-a', '60 seconds');
    assert.deepEqual(again, {
      acquired: true,
      epoch: 1n,
      expiresAt: renewed.expiresAt,
      grantedAt: again.grantedAt,
    });
    assert.equal((await renew(db, 'restart/held', 'worker-a', 1, '60 seconds')).status, 'ok');
  });

  for (const [how, downtime] of [
    ['a fast restart', (c: PgCluster) => c.restart()],
    ['an immediate stop and start', (c: PgCluster) => c.stop('immediate').then(() => c.start())],
    ['a crash and recovery', (c: PgCluster) => c.crash().then(() => c.start())],
  ] as const) {
    test(`a lease still valid after ${how} is still held by its owner`, async () => {
      await reconnect();
      const key = `restart/valid/${how}`;
      const grant = await acquire(db, key, 'worker-a', '60 seconds');
      assert.equal(grant.acquired, true);

      await downtime(cluster);
      await reconnect();

      assert.deepEqual(await acquire(db, key, 'worker-b', '60 seconds'), {
        acquired: false,
        epoch: null,
        expiresAt: null,
        grantedAt: null,
      });
      const same = await acquire(db, key, 'worker-a', '60 seconds');
      assert.equal(same.epoch, grant.epoch);
      assert.equal(same.expiresAt, grant.expiresAt);
      assert.equal((await renew(db, key, 'worker-a', grant.epoch!, '60 seconds')).status, 'ok');
      assert.equal((await release(db, key, 'worker-a', grant.epoch!)).status, 'ok');
      assert.equal((await inspect(db, key))?.epoch, grant.epoch! + 1n);
    });
  }

  test('a lease that expired while the server was stopped is acquirable on the first call after the restart, with a greater epoch', async () => {
    await reconnect();
    const key = 'restart/expired-while-down';
    const grant = await acquire(db, key, 'worker-a', '1 second');
    assert.equal(grant.acquired, true);

    await cluster.stop('fast');
    await sleepPastWhileDown(grant.expiresAt!);
    await cluster.start();
    await reconnect();

    const takeover = await acquire(db, key, 'worker-b', '60 seconds');
    assert.equal(takeover.acquired, true, 'downtime extended the old lease');
    assert.equal(takeover.epoch, grant.epoch! + 1n);
    assert.ok(takeover.grantedAt! >= grant.expiresAt!);
    assert.equal((await renew(db, key, 'worker-a', grant.epoch!, '1 second')).status, 'not_owner');
  });

  for (const mode of ['fast', 'immediate'] as const) {
    test(`a server stopped (${mode}) during a blocking acquire fails the waiter and keeps the state`, async () => {
      await reconnect();
      const key = `restart/stopped-while-waiting/${mode}`;
      const grant = await acquire(db, key, 'worker-a', '60 seconds');
      const before = await inspect(db, key);
      const waiter = await connect(url);
      try {
        const waiterPid = await backendPid(waiter);
        const waiting = acquire(waiter, key, 'worker-b', '60 seconds', '30 seconds');
        waiting.catch(() => undefined);
        await waitUntilWaiting(db, waiterPid);

        const stopped = Date.now();
        await cluster.stop(mode);
        const error = await rejectsSomehow(waiting);
        // The waiter learns promptly; it is not left hanging until its wait runs out.
        assert.ok(Date.now() - stopped < 20_000, `waiter failed only after its wait: ${error}`);
        if (mode === 'fast') assert.equal((error as { code?: string }).code, ADMIN_SHUTDOWN);

        await cluster.start();
        await reconnect();
        assert.deepEqual(await inspect(db, key), before);
        assert.equal((await acquire(db, key, 'worker-b', '60 seconds')).acquired, false);
        assert.equal((await renew(db, key, 'worker-a', grant.epoch!, '60 seconds')).status, 'ok');
      } finally {
        await disconnect(waiter);
      }
    });
  }
});
