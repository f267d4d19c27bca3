/**
 * The examples under examples/ work as their comments say: Prometheus metrics that follow the
 * client's events, and one log line per event.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Registry } from 'prom-client';
import { LeaseClient, LeaseLostError } from '../../src/index.js';
import { logLeaseEvents } from '../../examples/log-events.js';
import { leaseMetrics } from '../../examples/prometheus-metrics.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { uniqueKey } from '../support/helpers.js';

let db: TestDatabase;
let client: LeaseClient;
before(async () => {
  db = await createTestDatabase();
  client = new LeaseClient(db.pool);
});
after(() => db.close());

/** One grant released, one held key denied, one grant lost to a release behind its back. */
async function someLeaseLife(prefix: string): Promise<void> {
  const first = (await client.acquire(`${prefix}:a`, { ttl: '30s' }))!;
  await first.renew();
  assert.equal(await client.acquire(`${prefix}:a`, { ttl: '30s' }), null);
  await first.release();
  const second = (await client.acquire(`${prefix}:b`, { ttl: '30s' }))!;
  await db.pool.query('SELECT lease.release($1, $2, $3)', [
    second.key,
    second.owner,
    second.epoch.toString(),
  ]);
  await assert.rejects(second.renew(), LeaseLostError);
}

/** The value of one sample in Prometheus text format, by metric name and exact label set. */
function sample(text: string, name: string, labels = ''): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${name}${labels ? `{${labels}}` : ''} `));
  return line === undefined ? undefined : Number(line.slice(line.lastIndexOf(' ') + 1));
}

describe('examples/prometheus-metrics', () => {
  test('counters, histograms and the held gauge follow the events', async () => {
    const registry = new Registry();
    const prefix = uniqueKey('metrics');
    const metrics = leaseMetrics({
      registry,
      keyLabel: (key) => key.slice(0, key.lastIndexOf(':')),
    });
    try {
      const mid = (await client.acquire(`${prefix}:held`, { ttl: '30s' }))!;
      let text = await registry.metrics();
      assert.equal(sample(text, 'pg_lease_held', `key="${prefix}"`), 1);
      await mid.release();
      await someLeaseLife(prefix);
      text = await registry.metrics();
      const key = `key="${prefix}"`;
      assert.equal(sample(text, 'pg_lease_acquired_total', key), 3);
      assert.equal(sample(text, 'pg_lease_not_acquired_total', `reason="held",${key}`), 1);
      assert.equal(sample(text, 'pg_lease_renew_latency_seconds_count', key), 1);
      assert.equal(sample(text, 'pg_lease_acquire_wait_seconds_count', key), 3);
      assert.equal(
        sample(text, 'pg_lease_lost_total', `reason="not_owner",source="server",${key}`),
        1,
      );
      assert.equal(sample(text, 'pg_lease_released_total', `status="ok",${key}`), 2);
      assert.equal(sample(text, 'pg_lease_held', key), 0, 'released and lost leases are not held');
    } finally {
      metrics.stop();
    }
    // Stopped: nothing counts any more.
    await client.acquire(`${prefix}:after`, { ttl: '30s' });
    const text = await registry.metrics();
    assert.equal(sample(text, 'pg_lease_acquired_total', `key="${prefix}"`), 3);
  });

  test('without keyLabel no metric has a key label', async () => {
    const registry = new Registry();
    const metrics = leaseMetrics({ registry });
    try {
      await someLeaseLife(uniqueKey('metrics-unlabelled'));
    } finally {
      metrics.stop();
    }
    const text = await registry.metrics();
    assert.equal(sample(text, 'pg_lease_acquired_total'), 2);
    assert.doesNotMatch(text, /key="/);
  });
});

describe('examples/log-events', () => {
  test('one line per event, warnings for the lost lease', async () => {
    const prefix = uniqueKey('logs');
    const info: string[] = [];
    const warn: string[] = [];
    const stop = logLeaseEvents({
      info: (line) => {
        if (line.includes(prefix)) info.push(line);
      },
      warn: (line) => {
        if (line.includes(prefix)) warn.push(line);
      },
    });
    try {
      await someLeaseLife(prefix);
    } finally {
      stop();
    }
    assert.deepEqual(
      info.map((line) => line.split(' key=')[0]),
      ['lease acquired', 'lease renewed', 'lease not acquired', 'lease released', 'lease acquired'],
    );
    assert.match(
      info[0]!,
      new RegExp(`^lease acquired key=${prefix}:a owner=\\S+ epoch=1 waited=\\d+ms$`),
    );
    assert.equal(warn.length, 1);
    assert.match(
      warn[0]!,
      new RegExp(`^lease lost key=${prefix}:b epoch=1 reason=not_owner source=server$`),
    );
  });
});
