/**
 * SEMANTICS.md §10 "Durable commits" with a synchronous standby configured: a grant, renewal
 * or release is never acknowledged before the standby has it, whatever `synchronous_commit`
 * the caller chose. `local` does not wait for a standby and `off` waits for nothing, so 0.2.0
 * raises both to `on` at commit (a deferred constraint trigger on lease.leases). 0.1.0 only
 * raised `off` to `local`, and its acknowledged grant is lost in the promotion: the same
 * epoch is then granted to another owner. The standby is stopped first, as a lagging standby
 * would be at the moment of failure.
 */
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { describe, test } from 'node:test';
import pg from 'pg';
import { LeaseClient, LeaseError } from '../../src/index.js';
import { PACKAGE_ROOT } from 'pg-lease-testing';
import { acquire, inspect, release, renew } from '../support/lease-calls.js';
import { waitFor as waitUntil } from '../support/helpers.js';
import { backendPid, connect, disconnect, rejectsSomehow } from '../failure/support/sessions.js';
import { startPair, track, waitUntilWaitingForStandby, type Pair } from './support.js';

const FIXTURE_0_1_0 = path.join(
  PACKAGE_ROOT,
  'extension',
  'test',
  'fixtures',
  'pg_lease--0.1.0.sql',
);

/** Settings that do not wait for a synchronous standby's flush on their own. */
const WEAK_SETTINGS = ['local', 'off', 'remote_write'] as const;

interface Caller {
  setting: string;
  db: pg.Client;
  pid: number;
  notices: string[];
}

async function callers(pair: Pair, settings: readonly string[]): Promise<Caller[]> {
  return Promise.all(
    settings.map(async (setting) => {
      const db = await connect(pair.url(), `caller-${setting}`);
      const notices: string[] = [];
      db.on('notice', (notice) => notices.push(notice.message ?? ''));
      await db.query(`SET synchronous_commit = ${setting}`);
      return { setting, db, pid: await backendPid(db), notices };
    }),
  );
}

/**
 * On a primary whose synchronous standby is stopped, each weak-setting caller acquires one
 * key, renews a grant taken before and releases another. Returns the pending calls.
 */
async function writeWhileStandbyIsDown(pair: Pair, weak: Caller[]) {
  const setup = await connect(pair.url());
  const before = new Map<
    string,
    { renewEpoch: bigint; releaseEpoch: bigint; renewExpiry: bigint }
  >();
  try {
    for (const { setting } of weak) {
      const toRenew = await acquire(setup, `renew/${setting}`, `holder-${setting}`, '60 seconds');
      const toRelease = await acquire(
        setup,
        `release/${setting}`,
        `holder-${setting}`,
        '60 seconds',
      );
      before.set(setting, {
        renewEpoch: toRenew.epoch!,
        releaseEpoch: toRelease.epoch!,
        renewExpiry: toRenew.expiresAt!,
      });
    }
  } finally {
    await disconnect(setup);
  }
  await pair.standby.cluster.stop();
  const calls = weak.map((caller) => {
    const { setting, db } = caller;
    const { renewEpoch, releaseEpoch } = before.get(setting)!;
    // One connection runs its statements one after another: each must commit before the next.
    const run = async () => {
      const grant = await acquire(db, `acquire/${setting}`, `holder-${setting}`, '60 seconds');
      const renewed = await renew(
        db,
        `renew/${setting}`,
        `holder-${setting}`,
        renewEpoch,
        '90 seconds',
      );
      const released = await release(db, `release/${setting}`, `holder-${setting}`, releaseEpoch);
      return { grant, renewed, released };
    };
    return { caller, pending: track(run()) };
  });
  return { calls, before };
}

describe('synchronous_commit with a synchronous standby', () => {
  test('a caller on local, off or remote_write is not told a grant, renewal or release committed before the standby has it', async () => {
    await using pair = await startPair({ synchronous: true });
    const weak = await callers(pair, WEAK_SETTINGS);
    try {
      const { calls, before } = await writeWhileStandbyIsDown(pair, weak);
      // Each caller's first write waits for the standby; none has been acknowledged.
      for (const { caller, pending } of calls) {
        await waitUntilWaitingForStandby(pair.primary, caller.pid);
        assert.equal(
          pending.settled(),
          false,
          `${caller.setting}: acknowledged without the standby`,
        );
      }

      // A cancel ends the wait, but PostgreSQL has committed locally by then: the call
      // returns with a WARNING that the commit may not be on the standby. That reply is not
      // an acknowledgement of a durable grant (README: "Failover").
      const cancelled = calls[0]!;
      await pair.primary.query('SELECT pg_cancel_backend($1)', [cancelled.caller.pid]);
      await waitUntil('the cancelled caller hears why', () =>
        cancelled.caller.notices.some((n) => /canceling wait for synchronous replication/.test(n)),
      );
      await waitUntilWaitingForStandby(pair.primary, cancelled.caller.pid); // its renew now waits

      await pair.failOver(); // kill -9 of the primary with every call still waiting
      for (const { pending } of calls) await rejectsSomehow(pending.promise);

      const db = await connect(pair.url());
      try {
        for (const { setting } of weak.slice(1)) {
          const { renewEpoch, releaseEpoch, renewExpiry } = before.get(setting)!;
          assert.equal(await inspect(db, `acquire/${setting}`), undefined, `${setting}: grant`);
          assert.equal((await inspect(db, `renew/${setting}`))?.expiresAt, renewExpiry);
          assert.equal((await inspect(db, `renew/${setting}`))?.epoch, renewEpoch);
          assert.equal(
            (await inspect(db, `release/${setting}`))?.held,
            true,
            `${setting}: release`,
          );
          assert.equal((await inspect(db, `release/${setting}`))?.epoch, releaseEpoch);
        }
        // What was never acknowledged may be granted again; nothing acknowledged was lost.
        const next = await acquire(db, 'acquire/off', 'someone-else', '60 seconds');
        assert.equal(next.epoch, 1n);
      } finally {
        await disconnect(db);
      }
    } finally {
      await disconnect(...weak.map((c) => c.db));
    }
  });

  test('a caller on local, off or remote_write is acknowledged once the standby is back, and the promoted standby has it', async () => {
    await using pair = await startPair({ synchronous: true });
    const weak = await callers(pair, WEAK_SETTINGS);
    try {
      const { calls, before } = await writeWhileStandbyIsDown(pair, weak);
      for (const { caller } of calls) await waitUntilWaitingForStandby(pair.primary, caller.pid);
      await pair.standby.cluster.start();
      const results = await Promise.all(calls.map(({ pending }) => pending.promise));
      for (const [n, { caller }] of calls.entries()) {
        assert.deepEqual(caller.notices, [], `${caller.setting}: warned`);
        assert.equal(results[n]!.grant.epoch, 1n);
        assert.equal(results[n]!.renewed.status, 'ok');
        assert.equal(results[n]!.released.status, 'ok');
      }

      await pair.failOver();
      const db = await connect(pair.url());
      try {
        for (const [n, { setting }] of weak.entries()) {
          const { renewEpoch, releaseEpoch } = before.get(setting)!;
          assert.deepEqual(await inspect(db, `acquire/${setting}`), {
            held: true,
            owner: `holder-${setting}`,
            epoch: 1n,
            expiresAt: results[n]!.grant.expiresAt,
          });
          assert.equal(
            (await inspect(db, `renew/${setting}`))?.expiresAt,
            results[n]!.renewed.expiresAt,
          );
          assert.equal((await inspect(db, `renew/${setting}`))?.epoch, renewEpoch);
          assert.equal((await inspect(db, `release/${setting}`))?.epoch, releaseEpoch + 1n);
          assert.equal(
            (await acquire(db, `acquire/${setting}`, 'someone-else', '60 seconds')).acquired,
            false,
          );
        }
      } finally {
        await disconnect(db);
      }
    } finally {
      await disconnect(...weak.map((c) => c.db));
    }
  });

  test('a same-owner re-acquire of a grant whose wait for the standby was cancelled waits for the standby too', async () => {
    await using pair = await startPair({ synchronous: true });
    const holder = await connect(pair.url(), 'holder');
    const notices: string[] = [];
    holder.on('notice', (notice) => notices.push(notice.message ?? ''));
    try {
      const pid = await backendPid(holder);
      await pair.standby.cluster.stop();
      const first = track(acquire(holder, 'again', 'A', '60 seconds'));
      await waitUntilWaitingForStandby(pair.primary, pid);
      await pair.primary.query('SELECT pg_cancel_backend($1)', [pid]);
      // PostgreSQL has committed locally and says so with a WARNING: the grant is on the
      // primary only.
      const granted = await first.promise;
      assert.equal(granted.acquired, true);
      assert.ok(notices.some((n) => /canceling wait for synchronous replication/.test(n)));

      // Asking again must not confirm that grant before the standby has it.
      const again = track(acquire(holder, 'again', 'A', '60 seconds'));
      await waitUntilWaitingForStandby(pair.primary, pid);
      assert.equal(again.settled(), false, 'the re-acquire was confirmed without the standby');
      await pair.standby.cluster.start();
      const confirmed = await again.promise;
      assert.deepEqual([confirmed.acquired, confirmed.epoch], [true, granted.epoch]);
    } finally {
      await disconnect(holder);
    }
  });

  test('acquire_many re-acquiring a grant whose wait for the standby was cancelled waits for the standby too', async () => {
    await using pair = await startPair({ synchronous: true });
    const holder = await connect(pair.url(), 'holder');
    const notices: string[] = [];
    holder.on('notice', (notice) => notices.push(notice.message ?? ''));
    try {
      const pid = await backendPid(holder);
      await pair.standby.cluster.stop();
      const first = track(acquire(holder, 'again-many', 'A', '60 seconds'));
      await waitUntilWaitingForStandby(pair.primary, pid);
      await pair.primary.query('SELECT pg_cancel_backend($1)', [pid]);
      const granted = await first.promise;
      assert.equal(granted.acquired, true);
      assert.ok(notices.some((n) => /canceling wait for synchronous replication/.test(n)));

      // The batch's same-owner answer must not be confirmed before the standby has the grant.
      const again = track(
        holder
          .query(
            "SELECT acquired, epoch::text AS epoch FROM lease.acquire_many(ARRAY['again-many'], 'A', '60 seconds')",
          )
          .then((r) => r.rows[0] as { acquired: boolean; epoch: string }),
      );
      await waitUntilWaitingForStandby(pair.primary, pid);
      assert.equal(again.settled(), false, 'acquire_many confirmed the grant without the standby');
      await pair.standby.cluster.start();
      const confirmed = await again.promise;
      assert.deepEqual([confirmed.acquired, BigInt(confirmed.epoch)], [true, granted.epoch]);
    } finally {
      await disconnect(holder);
    }
  });

  test('on 0.1.0 a caller on local or off is acknowledged without the standby, and after promotion another owner gets the same epoch', async () => {
    await using pair = await startPair({
      synchronous: true,
      extraExtensionFiles: [FIXTURE_0_1_0],
      extensionVersion: '0.1.0',
    });
    const weak = await callers(pair, ['local', 'off']);
    try {
      const { calls, before } = await writeWhileStandbyIsDown(pair, weak);
      const results = await Promise.all(calls.map(({ pending }) => pending.promise));
      for (const result of results) assert.equal(result.grant.epoch, 1n);

      await pair.failOver();
      const db = await connect(pair.url());
      try {
        for (const { setting } of weak) {
          assert.equal(
            await inspect(db, `acquire/${setting}`),
            undefined,
            `${setting}: grant kept`,
          );
          const again = await acquire(db, `acquire/${setting}`, 'someone-else', '60 seconds');
          assert.deepEqual([again.acquired, again.epoch], [true, 1n], `${setting}: epoch 1 twice`);
          assert.equal(
            (await inspect(db, `renew/${setting}`))?.expiresAt,
            before.get(setting)!.renewExpiry,
          );
          assert.equal((await inspect(db, `release/${setting}`))?.held, true);
        }
      } finally {
        await disconnect(db);
      }
    } finally {
      await disconnect(...weak.map((c) => c.db));
    }
  });

  test('the client counts a grant or renewal whose wait for the standby was cancelled as not done', async () => {
    await using pair = await startPair({ synchronous: true });
    const pool = new pg.Pool({ connectionString: pair.url(), max: 1 });
    pool.on('error', () => undefined);
    try {
      const client = new LeaseClient(pool, { owner: 'holder' });
      const held = (await client.acquire('client/renewed', { ttl: '60s' }))!;
      await pair.standby.cluster.stop();
      const calls: (() => Promise<unknown>)[] = [
        () => client.acquire('client/acquired', { ttl: '60s' }),
        () => held.renew(),
      ];
      for (const call of calls) {
        const pending = track(call());
        const pid = await waitForWaiter(pair);
        assert.equal(pending.settled(), false);
        await pair.primary.query('SELECT pg_cancel_backend($1)', [pid]);
        const error = await pending.promise.then(
          () => assert.fail('a commit the standby never confirmed was reported done'),
          (caught: unknown) => caught,
        );
        assert.ok(error instanceof LeaseError, String(error));
        assert.equal(error.code, 'unconfirmed_commit');
        assert.match(error.message, /synchronous standby was cancelled/);
      }
      assert.equal(held.signal.aborted, false, 'an unconfirmed renew does not end the handle');
    } finally {
      await pool.end();
    }
  });
});

/** The pid of the one backend of the leases database that waits for the standby. */
async function waitForWaiter(pair: Pair): Promise<number> {
  let pid: number | undefined;
  await waitUntil('a call waits for the standby', async () => {
    const { rows } = await pair.primary.query<{ pid: number }>(
      "SELECT pid FROM pg_stat_activity WHERE datname = 'leases' AND wait_event = 'SyncRep'",
    );
    pid = rows[0]?.pid;
    return pid !== undefined;
  });
  return pid!;
}
