/**
 * Failure model, crashes: `kill -9` of the postmaster and every backend, then crash recovery on
 * the same data directory. What was committed stands, what was not is gone, epochs never go
 * back, and the time the server was down never counts as time held. One durable cluster
 * (fsync on) serves the file; the checks run one after another because each crashes it.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import type pg from 'pg';
import type { PgCluster } from 'pg-lease-testing';
import {
  acquireTimed as acquire,
  inspect,
  inspectAll,
  micros,
  releaseTimed as release,
  renew,
  type Inspected,
} from '../support/lease-calls.js';
import { committedWatermarks, countTakeovers, findViolations, runLoad } from './support/load.js';
import {
  backendPid,
  connect,
  disconnect,
  rejectsSomehow,
  sleepPastWhileDown,
  startDurableCluster,
  waitUntilWaiting,
} from './support/sessions.js';

describe('crash', () => {
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

  async function reconnect(): Promise<pg.Client> {
    await disconnect(db);
    // A check that failed half-way may have left the server down; the next one starts it.
    if (!cluster.running) await cluster.start();
    db = await connect(url);
    return db;
  }

  async function crashAndRecover(): Promise<void> {
    await cluster.crash();
    await cluster.start();
    await reconnect();
  }

  test('a crash right after a committed acquire keeps the grant, and the renew and release committed before it', async () => {
    await reconnect();
    const renewedGrant = await acquire(db, 'crash/renewed', 'worker-a', '60 seconds');
    const renewed = await renew(db, 'crash/renewed', 'worker-a', renewedGrant.epoch!, '90 seconds');
    const releasedGrant = await acquire(db, 'crash/released', 'worker-a', '60 seconds');
    await release(db, 'crash/released', 'worker-a', releasedGrant.epoch!);
    const grant = await acquire(db, 'crash/acquired', 'worker-a', '60 seconds');
    assert.equal(grant.acquired, true);
    // Nothing in between: the acquire's reply is the last thing before the kill.
    await crashAndRecover();

    assert.deepEqual(await inspect(db, 'crash/acquired'), {
      held: true,
      owner: 'worker-a',
      epoch: grant.epoch,
      expiresAt: grant.expiresAt,
    });
    assert.deepEqual(await inspect(db, 'crash/renewed'), {
      held: true,
      owner: 'worker-a',
      epoch: renewedGrant.epoch,
      expiresAt: renewed.expiresAt,
    });
    assert.deepEqual(await inspect(db, 'crash/released'), {
      held: false,
      owner: null,
      epoch: releasedGrant.epoch! + 1n,
      expiresAt: null,
    });
    assert.equal((await acquire(db, 'crash/acquired', 'worker-b', '60 seconds')).acquired, false);
  });

  test('permits of a counted key survive kill -9 like exclusive grants: committed ones stand (also under synchronous_commit = off), an uncommitted one is gone, the limit holds', async () => {
    await reconnect();
    const key = 'crash/permits';
    await db.query('SELECT lease.set_limit($1, 2)', [key]);
    // Asynchronous commits would be lost in a crash; a permit's grant and renewal must not be.
    await db.query('SET synchronous_commit = off');
    const a = await acquire(db, key, 'worker-a', '60 seconds');
    const renewed = await renew(db, key, 'worker-a', a.epoch!, '90 seconds');
    assert.equal(renewed.status, 'ok');
    const open = await connect(url);
    await open.query('BEGIN');
    const { rows: pending } = await open.query(
      `SELECT acquired, epoch::text FROM lease.acquire($1, 'worker-b', '60 seconds')`,
      [key],
    );
    assert.equal(pending[0].acquired, true);
    await crashAndRecover();
    await disconnect(open);

    const { rows } = await db.query(
      `SELECT owner, epoch::text, ${micros('expires_at')}::text AS e FROM lease.holders($1)`,
      [key],
    );
    assert.deepEqual(rows, [
      { owner: 'worker-a', epoch: String(a.epoch), e: String(renewed.expiresAt) },
    ]);
    const c = await acquire(db, key, 'worker-c', '60 seconds');
    assert.equal(c.acquired, true);
    assert.ok(c.epoch! > a.epoch!);
    assert.equal((await acquire(db, key, 'worker-d', '60 seconds')).acquired, false);
  });

  test('shared grants survive kill -9 like exclusive grants: committed ones stand (also under synchronous_commit = off), an uncommitted one is gone, a waiting exclusive acquirer leaves no mark', async () => {
    await reconnect();
    const key = 'crash/shared';
    // The uncommitted shared grant is of a key of its own: its transaction holds the writers'
    // mark in share mode until it ends, so no exclusive acquirer could mark its key meanwhile.
    const uncommittedKey = 'crash/shared/uncommitted';
    await db.query('SET synchronous_commit = off');
    const shared = async (q: pg.Client, owner: string, k = key) => {
      const { rows } = await q.query(
        `SELECT acquired, epoch::text AS epoch, ${micros('expires_at')} AS e
           FROM lease.acquire_shared($1, $2, '60 seconds')`,
        [k, owner],
      );
      const row = rows[0] as { acquired: boolean; epoch: string | null; e: string | null };
      return {
        acquired: row.acquired,
        epoch: row.epoch === null ? null : BigInt(row.epoch),
        expiresAt: row.e,
      };
    };
    const a = await shared(db, 'worker-a');
    const renewed = await renew(db, key, 'worker-a', a.epoch!, '90 seconds');
    assert.equal(renewed.status, 'ok');
    const b = await shared(db, 'worker-b');
    const open = await connect(url);
    const waiter = await connect(url);
    await open.query('BEGIN');
    assert.equal((await shared(open, 'worker-c', uncommittedKey)).acquired, true);
    const waiterPid = await backendPid(waiter);
    const waiting = waiter
      .query(`SELECT acquired FROM lease.acquire($1, 'worker-x', '60 seconds', '60 seconds')`, [
        key,
      ])
      .catch(() => undefined);
    await waitUntilWaiting(db, waiterPid);
    const { rows: marks } = await db.query(
      `SELECT count(*)::int AS n FROM pg_locks WHERE pid = $1 AND locktype = 'advisory'`,
      [waiterPid],
    );
    assert.equal(marks[0].n, 1, 'the waiting exclusive acquirer marked the key');
    await crashAndRecover();
    await disconnect(open);
    await disconnect(waiter);
    await waiting;

    const { rows } = await db.query(
      `SELECT owner, epoch::text, ${micros('expires_at')}::text AS e FROM lease.holders($1)`,
      [key],
    );
    assert.deepEqual(rows, [
      { owner: 'worker-a', epoch: String(a.epoch), e: String(renewed.expiresAt) },
      { owner: 'worker-b', epoch: String(b.epoch), e: b.expiresAt },
    ]);
    const { rows: gone } = await db.query('SELECT owner FROM lease.holders($1)', [uncommittedKey]);
    assert.deepEqual(gone, [], 'the uncommitted shared grant is gone');
    assert.equal((await acquire(db, key, 'worker-x', '60 seconds')).acquired, false);
    const d = await shared(db, 'worker-d');
    assert.equal(d.acquired, true, 'no mark of the crashed waiter is left');
    assert.ok(d.epoch! > b.epoch!);
  });

  test('an acquire whose transaction had not committed at the crash is gone after recovery', async () => {
    await reconnect();
    const freed = await acquire(db, 'crash/uncommitted/free', 'worker-a', '60 seconds');
    await release(db, 'crash/uncommitted/free', 'worker-a', freed.epoch!);
    const contested = await acquire(db, 'crash/uncommitted/held', 'worker-a', '60 seconds');
    const keys = ['crash/uncommitted/free', 'crash/uncommitted/never', 'crash/uncommitted/held'];
    const before = await inspectAll(db, keys);

    // An open transaction that acquired two keys, and a blocking acquire in mid-wait.
    const open = await connect(url);
    const waiter = await connect(url);
    try {
      await open.query('BEGIN');
      const inFlight = await acquire(open, 'crash/uncommitted/free', 'worker-b', '60 seconds');
      assert.equal(inFlight.epoch, freed.epoch! + 2n);
      assert.equal(
        (await acquire(open, 'crash/uncommitted/never', 'worker-b', '60 seconds')).epoch,
        1n,
      );
      const waiterPid = await backendPid(waiter);
      const waiting = acquire(
        waiter,
        'crash/uncommitted/held',
        'worker-b',
        '60 seconds',
        '30 seconds',
      );
      waiting.catch(() => undefined);
      await waitUntilWaiting(db, waiterPid);

      await crashAndRecover();
      await rejectsSomehow(waiting);
    } finally {
      await disconnect(open, waiter);
    }

    assert.deepEqual(await inspectAll(db, keys), before);
    assert.equal(contested.acquired, true);
    // "Never happened" includes its epoch: the next grant is the next epoch after the
    // committed state, so an epoch seen only inside an uncommitted transaction is reused.
    const next = await acquire(db, 'crash/uncommitted/free', 'worker-c', '60 seconds');
    assert.equal(next.epoch, freed.epoch! + 2n);
  });

  test('under load, crash recovery keeps every epoch a client saw committed and never grants a key to two owners at once', async (t) => {
    await reconnect();
    const keys = Array.from({ length: 10 }, (_, n) => `crash/load/${n}`);
    const ttlMs = 300;

    const beforeCrash = new AbortController();
    const loaded = runLoad({
      url,
      keys,
      clients: 8,
      ownerPrefix: 'before',
      ttlMs,
      signal: beforeCrash.signal,
    });
    await sleep(1_500 + Math.random() * 500);
    await cluster.crash();
    const phase1 = await loaded;
    beforeCrash.abort();
    assert.equal(phase1.errors.length, 8, 'every client should have lost its connection');
    await cluster.start();
    await reconnect();

    const watermarks = committedWatermarks(phase1.grants);
    const recovered = new Map<string, Inspected | undefined>();
    for (const key of keys) {
      const state = await inspect(db, key);
      recovered.set(key, state);
      const floor = watermarks.get(key) ?? 0n;
      assert.ok(
        (state?.epoch ?? 0n) >= floor,
        `${key}: epoch ${state?.epoch} after recovery, a client saw ${floor} committed`,
      );
    }

    const afterCrash = new AbortController();
    const resumed = runLoad({
      url,
      keys,
      clients: 8,
      ownerPrefix: 'after',
      ttlMs,
      signal: afterCrash.signal,
    });
    await sleep(1_000);
    afterCrash.abort();
    const phase2 = await resumed;
    assert.deepEqual(phase2.errors, []);

    for (const grant of phase2.grants) {
      assert.ok(
        grant.epoch > (recovered.get(grant.key)?.epoch ?? 0n),
        `${grant.key}: epoch ${grant.epoch} granted after recovery is not above the recovered one`,
      );
    }
    const grants = [...phase1.grants, ...phase2.grants];
    assert.deepEqual(findViolations(grants), []);

    // The workload must have exercised what is judged: releases, and takeovers after lapse.
    const takeovers = countTakeovers(grants);
    t.diagnostic(
      `${phase1.calls} calls and ${phase1.grants.length} grants before the crash, ` +
        `${phase2.calls} calls and ${phase2.grants.length} grants after; ` +
        `${grants.filter((g) => g.released).length} released, ${takeovers} taken over after lapse, ` +
        `${grants.filter((g) => g.uncertain).length} in flight at the crash`,
    );
    assert.ok(phase1.grants.length >= 20, `only ${phase1.grants.length} grants before the crash`);
    assert.ok(phase2.grants.length >= 10, `only ${phase2.grants.length} grants after recovery`);
    assert.ok(takeovers >= 5, `only ${takeovers} takeovers after lapse`);
  });

  test('epochs never regress across repeated crash and restart cycles', async () => {
    await reconnect();
    const keys = {
      released: 'crash/cycles/released',
      lapsed: 'crash/cycles/lapsed',
      heldAcross: 'crash/cycles/held-across',
      untouched: 'crash/cycles/untouched',
    };
    await acquire(db, keys.untouched, 'worker-0', '1 microsecond');
    let heldAcross = {
      owner: 'worker-0',
      epoch: (await acquire(db, keys.heldAcross, 'worker-0', '60 seconds')).epoch!,
    };
    let previous = new Map<string, bigint>();

    const downtimes = ['crash', 'crash', 'immediate', 'fast', 'crash'] as const;
    for (const [cycle, downtime] of downtimes.entries()) {
      const owner = `worker-${cycle + 1}`;
      if (cycle % 2 === 1) await db.query('CHECKPOINT');
      const grant = await acquire(db, keys.released, owner, '60 seconds');
      await release(db, keys.released, owner, grant.epoch!);
      await acquire(db, keys.lapsed, owner, '1 microsecond');
      // The grant held across the last downtime is released now, and a new one taken.
      await release(db, keys.heldAcross, heldAcross.owner, heldAcross.epoch);
      heldAcross = {
        owner,
        epoch: (await acquire(db, keys.heldAcross, owner, '60 seconds')).epoch!,
      };

      const expected = new Map<string, Inspected | undefined>();
      for (const key of Object.values(keys)) expected.set(key, await inspect(db, key));

      if (downtime === 'crash') await cluster.crash();
      else await cluster.stop(downtime);
      await cluster.start();
      await reconnect();

      for (const [key, state] of expected) {
        const recovered = await inspect(db, key);
        assert.deepEqual(recovered, state, `${key} after ${downtime} in cycle ${cycle}`);
        assert.ok(recovered!.epoch >= (previous.get(key) ?? 0n), `${key} regressed`);
      }
      previous = new Map([...expected].map(([key, state]) => [key, state!.epoch]));
    }
    assert.equal(previous.get(keys.released), BigInt(2 * downtimes.length));
    assert.equal(previous.get(keys.lapsed), BigInt(downtimes.length));
    assert.equal(previous.get(keys.heldAcross), BigInt(2 * downtimes.length + 1));
    assert.equal(previous.get(keys.untouched), 1n);
  });

  test('a lease that expired while the server was down is acquirable on the first call after recovery, with a greater epoch', async () => {
    await reconnect();
    const key = 'crash/expired-while-down';
    const grant = await acquire(db, key, 'worker-a', '1 second');
    await cluster.crash();
    await sleepPastWhileDown(grant.expiresAt!);
    await cluster.start();
    await reconnect();

    const takeover = await acquire(db, key, 'worker-b', '60 seconds');
    assert.equal(takeover.acquired, true, 'downtime extended the old lease');
    assert.equal(takeover.epoch, grant.epoch! + 1n);
    assert.ok(takeover.grantedAt! >= grant.expiresAt!);
  });
});
