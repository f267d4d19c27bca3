/**
 * Leader election on one lease: one leader at a time, hand-over to a waiting candidate when the
 * leader resigns or loses its lease, step-down before the server's expiry, and observers that
 * see each new term.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  Election,
  LeaseClient,
  LeaseError,
  LeaseLostError,
  type Leader,
  type Leadership,
  type LeaseClientOptions,
} from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { abortReason, uniqueKey, waitFor } from '../support/helpers.js';

let db: TestDatabase;
let admin: LeaseClient;
before(async () => {
  db = await createTestDatabase();
  admin = new LeaseClient(db.pool);
});
after(async () => {
  await db.close();
});

/** A candidate process stand-in: its own pool and client. */
function candidate(options: LeaseClientOptions = {}): LeaseClient {
  return new LeaseClient(db.newPool(), options);
}

/** The `lost` and `resigned` events of `election`. */
function endings(election: Election): { lost: unknown[]; resigned: Leadership[] } {
  const seen = { lost: [] as unknown[], resigned: [] as Leadership[] };
  election.on('lost', (reason) => seen.lost.push(reason));
  election.on('resigned', (leadership) => seen.resigned.push(leadership));
  return seen;
}

describe('Election', { concurrency: true }, () => {
  test('a resignation is not a loss: resigned is emitted, lost is not, and the signal says resigned', async () => {
    const key = uniqueKey('election-resigned');
    const a = new Election(candidate(), key, { ttl: '30s', identity: 'a' });
    const seen = endings(a);
    const first = await a.campaign();
    await first.resign();
    const reason = await abortReason(first.signal);
    assert.ok(reason instanceof LeaseError && !(reason instanceof LeaseLostError), String(reason));
    assert.equal(reason.code, 'lease_released');
    assert.match(reason.message, /resigned/);
    assert.throws(() => first.assertLeader(), LeaseError);
    // Releasing the leadership's lease directly is a resignation too.
    const second = await a.campaign();
    await second.lease.release();
    await abortReason(second.signal);
    await first.resign(); // over already: nothing more is emitted
    assert.deepEqual(seen.lost, []);
    assert.deepEqual(seen.resigned, [first, second]);
  });

  test('run() stopped by its signal resigns: no lost event, the key is released', async () => {
    const key = uniqueKey('election-run-stop');
    const a = new Election(candidate(), key, { ttl: '30s', identity: 'a' });
    const seen = endings(a);
    const stop = new AbortController();
    let leading: Leadership | undefined;
    const running = a.run(
      async (leadership) => {
        leading = leadership;
        await abortReason(leadership.signal, 60_000);
      },
      { signal: stop.signal },
    );
    await waitFor('a leads', () => leading !== undefined);
    stop.abort();
    await running;
    assert.equal(leading!.signal.aborted, true);
    assert.deepEqual(seen.lost, []);
    assert.deepEqual(seen.resigned, [leading]);
    const state = await admin.inspect(key);
    assert.equal(state?.held, false);
    assert.equal(state?.epoch, leading!.epoch + 1n);
  });

  test('terms: a lapsed term is followed by the next number, a resigned one by the one after; denied attempts take none', async () => {
    const key = uniqueKey('election-terms');
    // A holder that stops renewing: its grant lapses on the server, nobody releases it.
    const holder = (await admin.acquire(key, { ttl: '1500ms', owner: 'gone' }))!;
    // b polls every 20 ms until the lapse: dozens of denied attempts.
    const b = new Election(candidate({ notifications: false, pollInterval: '20ms' }), key, {
      ttl: '30s',
      identity: 'b',
    });
    const afterLapse = await b.campaign();
    assert.equal(afterLapse.epoch, holder.epoch + 1n);
    await afterLapse.resign();
    // The release raised the key's epoch to fence the resigned term; the next term is above it.
    assert.equal((await admin.inspect(key))?.epoch, afterLapse.epoch + 1n);
    const afterResign = await b.campaign();
    assert.equal(afterResign.epoch, afterLapse.epoch + 2n);
    await afterResign.resign();
  });

  test('a waiting candidate takes over when the leader resigns, with the next term', async () => {
    const key = uniqueKey('election-resign');
    const a = new Election(candidate(), key, { ttl: '30s', identity: 'a' });
    const b = new Election(candidate(), key, { ttl: '30s', identity: 'b' });
    const leaderA = await a.campaign();
    assert.deepEqual(await b.leader(), {
      identity: 'a',
      epoch: leaderA.epoch,
      expiresAt: (await a.leader())!.expiresAt,
    });
    let elected = false;
    b.on('elected', () => (elected = true));
    const campaignB = b.campaign();
    await sleep(300);
    assert.equal(elected, false, 'b was elected while a led');
    await leaderA.resign();
    assert.equal(leaderA.signal.aborted, true);
    const leaderB = await campaignB;
    assert.equal(elected, true);
    assert.equal(leaderB.identity, 'b');
    assert.equal(leaderB.epoch, leaderA.epoch + 2n);
    await leaderB.resign();
  });

  test('a leader that loses its lease is told so and the waiting candidate leads', async () => {
    const key = uniqueKey('election-loss');
    const a = new Election(candidate(), key, { ttl: '2s', identity: 'a' });
    const b = new Election(candidate(), key, { ttl: '2s', identity: 'b' });
    const leaderA = await a.campaign();
    const lost: unknown[] = [];
    a.on('lost', (reason) => lost.push(reason));
    const campaignB = b.campaign();
    // An operator takes the key from a: its next renewal finds it gone.
    const state = (await admin.inspect(key))!;
    assert.equal(await admin.release(key, { owner: state.owner!, epoch: state.epoch }), 'ok');
    const leaderB = await campaignB;
    assert.equal(leaderB.identity, 'b');
    const reason = await abortReason(leaderA.signal);
    assert.ok(reason instanceof LeaseLostError, `a ended with ${String(reason)}`);
    assert.equal(lost.length, 1);
    assert.throws(() => leaderA.assertLeader(), LeaseLostError);
    await leaderB.resign();
  });

  test('a leader whose renewals stop steps down before its lease expires on the server', async () => {
    const key = uniqueKey('election-stepdown');
    // The first renewal would come after the step-down point (ttl - margin).
    const a = new Election(candidate(), key, {
      ttl: '1500ms',
      identity: 'a',
      keepAlive: { interval: '1400ms' },
      stepDownMargin: '600ms',
    });
    const seen = endings(a);
    const leaderA = await a.campaign();
    // The grant's server expiry (no renewal comes before the step-down). Not `a.leader()`: on a
    // loaded box the step-down may already have happened when it answers.
    const expiresAt = leaderA.lease.expiresAt.getTime();
    await abortReason(leaderA.signal);
    // A step-down is a loss, although the leader releases the key itself.
    assert.equal(seen.lost.length, 1);
    assert.deepEqual(seen.resigned, []);
    // Asked right after the step-down, the server's clock is still before the expiry.
    const { rows } = await db.pool.query<{ now: Date }>('SELECT clock_timestamp() AS now');
    assert.ok(
      rows[0]!.now.getTime() < expiresAt,
      `stepped down ${rows[0]!.now.getTime() - expiresAt} ms after the server's expiry`,
    );
    // And it let go of the key: released (epoch moved on), not left to lapse.
    await waitFor('the key is released', async () => (await admin.inspect(key))?.held === false);
    assert.equal((await admin.inspect(key))?.epoch, leaderA.epoch + 1n);
  });

  test('observers are notified of every new term, without polling', async () => {
    const key = uniqueKey('election-observe');
    const a = new Election(candidate(), key, { ttl: '30s', identity: 'a' });
    const b = new Election(candidate(), key, { ttl: '30s', identity: 'b' });
    // Polling once an hour: only notifications can show the changes in time.
    const watcher = new Election(candidate({ notifications: true, pollInterval: '1 hour' }), key, {
      ttl: '30s',
      identity: 'watcher',
    });
    const stop = new AbortController();
    const seen: (Leader | null)[] = [];
    const observing = (async () => {
      for await (const leader of watcher.observe({ signal: stop.signal })) seen.push(leader);
    })();
    await waitFor('the first observation', () => seen.length === 1);
    assert.equal(seen[0], null);
    const leaderA = await a.campaign();
    await waitFor('a is observed', () => seen.at(-1)?.identity === 'a');
    const campaignB = b.campaign();
    await sleep(200);
    await leaderA.resign();
    const leaderB = await campaignB;
    await waitFor('b is observed', () => seen.at(-1)?.identity === 'b');
    assert.deepEqual(
      seen.filter((leader) => leader !== null).map((leader) => [leader.identity, leader.epoch]),
      [
        ['a', leaderA.epoch],
        ['b', leaderB.epoch],
      ],
    );
    stop.abort();
    await observing;
    await leaderB.resign();
  });

  test('run() leads one candidate at a time, hands over on resignation and campaigns again', async () => {
    const key = uniqueKey('election-run');
    const stop = new AbortController();
    const terms: string[] = [];
    let leading = 0;
    let overlap = false;
    const runners = ['a', 'b'].map((identity) =>
      new Election(candidate(), key, { ttl: '2s', identity }).run(
        async (leadership) => {
          if (++leading > 1) overlap = true;
          terms.push(identity);
          await sleep(200);
          leading--;
          await leadership.resign();
        },
        { signal: stop.signal },
      ),
    );
    await waitFor('both candidates led', () => terms.includes('a') && terms.includes('b'), 20_000);
    await waitFor('six terms', () => terms.length >= 6, 20_000);
    stop.abort();
    await Promise.all(runners);
    assert.equal(overlap, false, `two leaders at once: ${terms.join(',')}`);
    assert.equal((await admin.inspect(key))?.held, false);
  });
});
