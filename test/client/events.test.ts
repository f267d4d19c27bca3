/**
 * Client events on node:diagnostics_channel: what each event carries, and that the two kinds of
 * loss (a status from the server, the deadline passing while the server is unreachable) stay
 * apart. On a cluster of this file's own, which one test stops.
 */
import assert from 'node:assert/strict';
import diagnostics_channel from 'node:diagnostics_channel';
import { after, afterEach, before, describe, test } from 'node:test';
import pg from 'pg';
import {
  LEASE_CHANNELS,
  LeaseClient,
  LeaseLostError,
  LeaseTimeoutError,
  subscribeLeaseEvents,
  type LeaseEvents,
} from '../../src/index.js';
import { PgCluster } from 'pg-lease-testing';
import { abortReason, uniqueKey, waitFor } from '../support/helpers.js';

let cluster: PgCluster;
let pool: pg.Pool;
let client: LeaseClient;

before(async () => {
  cluster = await PgCluster.start();
  const url = await cluster.createDatabase();
  pool = new pg.Pool({ connectionString: url, connectionTimeoutMillis: 2_000 });
  pool.on('error', () => undefined);
  client = new LeaseClient(pool);
});
after(async () => {
  await pool.end();
  await cluster.destroy();
});

type Recorded = { [K in keyof LeaseEvents]: { kind: K; event: LeaseEvents[K] } }[keyof LeaseEvents];

/** Records every event of the given key (other tests' leases may publish meanwhile). */
function record(key: string): {
  events: Recorded[];
  of<K extends keyof LeaseEvents>(kind: K): LeaseEvents[K][];
} {
  const events: Recorded[] = [];
  const handlers = Object.fromEntries(
    (Object.keys(LEASE_CHANNELS) as (keyof LeaseEvents)[]).map((kind) => [
      kind,
      (event: LeaseEvents[typeof kind]) => {
        if ('key' in event ? event.key === key : 'keys' in event && event.keys.includes(key))
          events.push({ kind, event } as Recorded);
      },
    ]),
  );
  unsubscribers.push(subscribeLeaseEvents(handlers));
  return {
    events,
    of: <K extends keyof LeaseEvents>(kind: K) =>
      events.filter((e) => e.kind === kind).map((e) => e.event as LeaseEvents[K]),
  };
}
const unsubscribers: (() => void)[] = [];
afterEach(() => {
  for (const unsubscribe of unsubscribers.splice(0)) unsubscribe();
});

describe('lease events', () => {
  test('acquired, renewed and released carry key, owner, epoch and timings', async () => {
    const key = uniqueKey('events');
    const seen = record(key);
    const lease = (await client.acquire(key, { ttl: '30s', owner: 'events-owner' }))!;
    await lease.renew();
    assert.equal(await lease.release(), 'ok');

    assert.deepEqual(
      seen.events.map((e) => e.kind),
      ['acquired', 'renewed', 'released'],
    );
    const [acquired] = seen.of('acquired');
    assert.equal(acquired!.owner, 'events-owner');
    assert.equal(acquired!.epoch, lease.epoch);
    assert.ok(acquired!.expiresAt instanceof Date);
    assert.ok(acquired!.waitedMs >= 0);
    const [renewed] = seen.of('renewed');
    assert.equal(renewed!.epoch, lease.epoch);
    assert.ok(renewed!.latencyMs >= 0);
    assert.equal(renewed!.expiresAt.getTime(), lease.expiresAt.getTime());
    const [released] = seen.of('released');
    assert.equal(released!.status, 'ok');
    assert.ok(released!.heldMs >= released!.latencyMs);
  });

  test('an acquire that waited reports the wait; a denied one and a timed-out one say why', async () => {
    const key = uniqueKey('events-wait');
    const seen = record(key);
    const holder = (await client.acquire(key, { ttl: '30s' }))!;
    assert.equal(await client.acquire(key, { ttl: '30s' }), null);
    await assert.rejects(client.acquire(key, { ttl: '30s', wait: '200ms' }), LeaseTimeoutError);
    const waiting = client.acquire(key, { ttl: '30s', wait: '20s' });
    setTimeout(() => void holder.release(), 300);
    const next = (await waiting)!;
    await next.release();

    const denied = seen.of('notAcquired');
    assert.deepEqual(
      denied.map((e) => e.reason),
      ['held', 'timeout'],
    );
    assert.ok(denied[1]!.waitedMs >= 200);
    const acquired = seen.of('acquired');
    assert.equal(acquired.length, 2);
    assert.equal(acquired[1]!.epoch, next.epoch);
    assert.ok(acquired[1]!.waitedMs >= 250, `waited ${acquired[1]!.waitedMs} ms`);
  });

  test('lost by status: the reason is the server status and the source is the server', async () => {
    const key = uniqueKey('events-status');
    const seen = record(key);
    const lease = (await client.acquire(key, { ttl: '30s' }))!;
    // Someone releases the grant behind the handle's back (an operator, a second process).
    await pool.query('SELECT lease.release($1, $2, $3)', [
      key,
      lease.owner,
      lease.epoch.toString(),
    ]);
    await assert.rejects(lease.renew(), LeaseLostError);

    const lost = seen.of('lost');
    assert.equal(lost.length, 1);
    assert.equal(lost[0]!.reason, 'not_owner');
    assert.equal(lost[0]!.source, 'server');
    assert.equal(lost[0]!.error, lease.lost);
    assert.deepEqual(seen.of('renewalFailed'), []);
  });

  test('the server unreachable: renewal failures with time left and retrying, then lost by the deadline', async () => {
    const key = uniqueKey('events-outage');
    const seen = record(key);
    const lease = (await client.acquire(key, { ttl: '2s', keepAlive: true }))!;
    await cluster.stop('immediate');
    try {
      const reason = await abortReason(lease.signal, 15_000);
      assert.ok(reason instanceof LeaseLostError);
      await waitFor('the lost event', () => seen.of('lost').length > 0, 5_000);
    } finally {
      await cluster.start();
    }
    const failures = seen.of('renewalFailed');
    assert.ok(failures.length >= 1, 'at least one renewal failed');
    for (const failure of failures) {
      assert.ok(failure.error instanceof Error);
      assert.ok(failure.timeLeftMs >= 0 && failure.timeLeftMs <= 2_000);
    }
    assert.equal(failures[0]!.retrying, true, 'keep-alive retries while the deadline allows');
    const lost = seen.of('lost');
    assert.equal(lost.length, 1);
    assert.equal(lost[0]!.reason, 'expired');
    assert.equal(lost[0]!.source, 'deadline');
    assert.ok(lost[0]!.error.cause instanceof Error, 'the last connection error is the cause');
    assert.ok(
      failures.every((failure, i) => i === 0 || failure.timeLeftMs <= failures[i - 1]!.timeLeftMs),
      'time left only shrinks',
    );
  });

  test('with nobody subscribed no channel has subscribers, and events flow again once subscribed', async () => {
    for (const name of Object.values(LEASE_CHANNELS))
      assert.equal(diagnostics_channel.channel(name).hasSubscribers, false, name);
    const key = uniqueKey('events-raw');
    const messages: unknown[] = [];
    const listener = (message: unknown) => messages.push(message);
    diagnostics_channel.subscribe(LEASE_CHANNELS.acquired, listener);
    try {
      const lease = (await client.acquire(key, { ttl: '30s' }))!;
      await lease.release();
    } finally {
      diagnostics_channel.unsubscribe(LEASE_CHANNELS.acquired, listener);
    }
    assert.equal(messages.length, 1);
    assert.equal((messages[0] as { key: string }).key, key);
  });
});
