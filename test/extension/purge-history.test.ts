/**
 * A randomized history with a concurrent purger (SEMANTICS.md §4 purge, I2, I3).
 *
 * Workers acquire, renew, release and inspect a few keys with short ttls while another session
 * purges every dead key as fast as it can, so keys lose their rows and come back all the time.
 * Every call is stamped with the monotonic time it was sent and answered. The history is then
 * checked in real-time order, per key: an epoch returned by a call answered before another call
 * was sent is never above what that later call returns (I2: epochs never regress, also through
 * a purge, when inspect returns nothing instead), and every grant is strictly greater than every
 * epoch returned before it was sent (I3). Owners are unique per acquire, so every grant is a new
 * one. Bounded by a count of calls, not by time.
 */
import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, test } from 'node:test';
import pg from 'pg';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { uniqueKey } from '../support/helpers.js';
import { acquire, inspect, release, renew } from '../support/lease-calls.js';

const WORKERS = 4;
const CALLS_PER_WORKER = 150;
const KEYS = 3;

interface Observation {
  key: string;
  kind: 'grant' | 'inspect';
  epoch: bigint;
  sentAt: number;
  answeredAt: number;
  what: string;
}

let db: TestDatabase;
before(async () => {
  db = await createTestDatabase();
});
after(() => db.close());

test('with a concurrent purger, epochs never regress and every grant exceeds every epoch seen before it', async () => {
  const keys = Array.from({ length: KEYS }, (_, i) => uniqueKey(`history-${i}`));
  const observations: Observation[] = [];
  let ownerCounter = 0;
  let workersLeft = WORKERS;

  const connect = async () => {
    const client = new pg.Client({ connectionString: db.url });
    await client.connect();
    return client;
  };

  const worker = async (id: number) => {
    const client = await connect();
    const holding = new Map<string, { owner: string; epoch: bigint }>();
    try {
      for (let call = 0; call < CALLS_PER_WORKER; call++) {
        const key = keys[Math.floor(Math.random() * keys.length)]!;
        const mine = holding.get(key);
        const roll = Math.random();
        const sentAt = performance.now();
        if (mine && roll < 0.3) {
          const renewed = await renew(client, key, mine.owner, mine.epoch, '40 milliseconds');
          if (renewed.status !== 'ok') holding.delete(key);
        } else if (mine && roll < 0.6) {
          await release(client, key, mine.owner, mine.epoch);
          holding.delete(key);
        } else if (roll < 0.8) {
          const owner = `w${id}-${++ownerCounter}`;
          const ttl = `${10 + Math.floor(Math.random() * 40)} milliseconds`;
          const granted = await acquire(client, key, owner, ttl);
          if (granted.acquired) {
            holding.set(key, { owner, epoch: granted.epoch! });
            observations.push({
              key,
              kind: 'grant',
              epoch: granted.epoch!,
              sentAt,
              answeredAt: performance.now(),
              what: `acquire by ${owner}`,
            });
          }
        } else {
          const state = await inspect(client, key);
          if (state)
            observations.push({
              key,
              kind: 'inspect',
              epoch: state.epoch,
              sentAt,
              answeredAt: performance.now(),
              what: `inspect by w${id}`,
            });
        }
        if (Math.random() < 0.3) await sleep(Math.floor(Math.random() * 5));
      }
    } finally {
      workersLeft--;
      await client.end();
    }
  };

  let purged = 0;
  let purges = 0;
  const purger = async () => {
    const client = await connect();
    try {
      while (workersLeft > 0) {
        const { rows } = await client.query<{ n: string }>("SELECT lease.purge('0')::text AS n");
        purged += Number(rows[0]!.n);
        purges++;
        await sleep(1);
      }
    } finally {
      await client.end();
    }
  };

  await Promise.all([...Array.from({ length: WORKERS }, (_, i) => worker(i)), purger()]);

  assert.ok(purges > 0 && purged > 0, `the purger must have deleted keys (purges ${purges})`);
  const grants = observations.filter((o) => o.kind === 'grant').length;
  assert.ok(grants > KEYS * 3, `too few grants to mean anything: ${grants}`);

  for (const key of keys) {
    const seen = observations.filter((o) => o.key === key);
    for (const later of seen) {
      for (const earlier of seen) {
        if (earlier.answeredAt >= later.sentAt) continue;
        if (later.kind === 'grant')
          assert.ok(
            later.epoch > earlier.epoch,
            `I3: ${later.what} got epoch ${later.epoch} after ${earlier.what} had seen ${earlier.epoch}`,
          );
        else
          assert.ok(
            later.epoch >= earlier.epoch,
            `I2: ${later.what} saw epoch ${later.epoch} after ${earlier.what} had seen ${earlier.epoch}`,
          );
      }
    }
  }
});
