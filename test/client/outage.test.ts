/**
 * Keep-alive across server outages, on a cluster of this file's own that it stops and crashes.
 */
import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { LeaseClient, LeaseError, LeaseLostError } from '../../src/index.js';
import { PgCluster } from 'pg-lease-testing';
import { abortReason, assertRodeOut, uniqueKey } from '../support/helpers.js';

let cluster: PgCluster;
let pool: pg.Pool;
let client: LeaseClient;

before(async () => {
  cluster = await PgCluster.start();
  const url = await cluster.createDatabase();
  pool = new pg.Pool({ connectionString: url, connectionTimeoutMillis: 2_000 });
  pool.on('error', () => undefined); // idle connections die with the server
  client = new LeaseClient(pool);
});
after(async () => {
  await pool.end();
  await cluster.destroy();
});

describe('server outages', () => {
  test('a stopped server makes the lease lost by its deadline, with the connection error as cause', async () => {
    await cluster.start();
    const key = uniqueKey();
    const lease = (await client.acquire(key, { ttl: '2s', keepAlive: true }))!;
    const stoppedAt = performance.now();
    await cluster.stop('immediate');
    const reason = await abortReason(lease.signal, 15_000);
    const lostAfter = performance.now() - stoppedAt;
    assert.ok(reason instanceof LeaseLostError);
    assert.equal(reason.status, 'expired');
    assert.ok(lostAfter <= 2_000 + 2_000, `lost ${lostAfter} ms after the stop`);
    // The renewals failed on the connection, and the last failure is kept for diagnosis.
    assert.ok(reason.cause instanceof Error);
    assert.ok(!(reason.cause instanceof LeaseError));
    await cluster.start();
    // The server kept the grant, which lapses on its own; a new owner gets a newer epoch.
    const next = (await client.acquire(key, { ttl: '30s', wait: '10s' }))!;
    assert.equal(next.epoch, lease.epoch + 1n);
    await next.release();
  });

  test('an outage shorter than the ttl is ridden out: renewals resume after a crash and restart', async () => {
    await cluster.start();
    const key = uniqueKey();
    const lease = (await client.acquire(key, { ttl: '12s', keepAlive: true }))!;
    const before = lease.expiresAt.getTime();
    await cluster.crash();
    await cluster.start();
    await assertRodeOut(client, lease, before);
    assert.equal(await lease.release(), 'ok');
  });
});
