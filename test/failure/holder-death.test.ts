/**
 * Failure model, holders that die or stall: a session's end never releases its lease. The
 * lease stays held until its expiry, then lapses and is taken over with a greater epoch; a
 * holder that comes back too late is told so and cannot undo the takeover. The checks use
 * distinct keys and run in parallel in one database of the shared cluster.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import {
  acquireTimed as acquire,
  inspect,
  releaseTimed as release,
  renew,
  type Queryable,
} from '../support/lease-calls.js';
import {
  backendPid,
  connect,
  disconnect,
  rejectsSomehow,
  sleepUntilServerTime,
  waitUntilBackendGone,
} from './support/sessions.js';

/** Long enough that a check right after the holder's death is surely before the expiry. */
const TTL = '4 seconds';

const holdLeaseFixture = path.join(
  path.dirname(fileURLToPath(import.meta.url)),
  'fixtures',
  'hold-lease.js',
);

interface HeldGrant {
  key: string;
  owner: string;
  epoch: bigint;
  expiresAt: bigint;
}

/**
 * The lease is still held exactly as granted (the holder's end did not release it), then a
 * blocking acquire by another owner gets it only once it has expired, with the next epoch.
 */
async function assertHeldUntilExpiryThenTakenOver(db: Queryable, grant: HeldGrant): Promise<void> {
  assert.deepEqual(
    await inspect(db, grant.key),
    { held: true, owner: grant.owner, epoch: grant.epoch, expiresAt: grant.expiresAt },
    'the holder’s end released its lease',
  );
  assert.equal((await acquire(db, grant.key, 'taker', TTL)).acquired, false);

  const takeover = await acquire(db, grant.key, 'taker', TTL, '20 seconds');
  assert.equal(takeover.acquired, true);
  assert.equal(takeover.epoch, grant.epoch + 1n);
  assert.ok(
    takeover.grantedAt! >= grant.expiresAt,
    `taken over ${grant.expiresAt - takeover.grantedAt!} us before the old lease expired`,
  );
}

describe('holder death and stall', { concurrency: true }, () => {
  let database: TestDatabase;
  before(async () => {
    database = await createTestDatabase();
  });
  after(() => database?.close());

  test('a terminated holder backend does not release its lease; it lapses at expiry and is taken over with a greater epoch', async () => {
    const { pool } = database;
    const key = 'death/terminated-backend';
    const holder = await connect(database.url);
    try {
      const pid = await backendPid(holder);
      const grant = await acquire(holder, key, 'holder', TTL);
      assert.equal(grant.acquired, true);

      const { rows } = await pool.query<{ terminated: boolean }>(
        'SELECT pg_terminate_backend($1) AS terminated',
        [pid],
      );
      assert.equal(rows[0]!.terminated, true);
      await waitUntilBackendGone(pool, pid);
      await rejectsSomehow(holder.query('SELECT 1'));

      await assertHeldUntilExpiryThenTakenOver(pool, {
        key,
        owner: 'holder',
        epoch: grant.epoch!,
        expiresAt: grant.expiresAt!,
      });
    } finally {
      await disconnect(holder);
    }
  });

  test('a holder backend terminated before its acquire committed never held the key', async () => {
    const { pool } = database;
    const key = 'death/terminated-in-transaction';
    const holder = await connect(database.url);
    try {
      const pid = await backendPid(holder);
      await holder.query('BEGIN');
      assert.equal((await acquire(holder, key, 'holder', TTL)).epoch, 1n);
      await pool.query('SELECT pg_terminate_backend($1)', [pid]);
      await waitUntilBackendGone(pool, pid);

      assert.equal(await inspect(pool, key), undefined);
      const next = await acquire(pool, key, 'taker', TTL);
      assert.deepEqual([next.acquired, next.epoch], [true, 1n]);
    } finally {
      await disconnect(holder);
    }
  });

  test('a killed holder client process does not release its lease; it lapses at expiry and is taken over with a greater epoch', async () => {
    const { pool } = database;
    const key = 'death/killed-client';
    const child = spawn(process.execPath, [holdLeaseFixture, database.url, key, 'holder', TTL], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    const exited = new Promise<NodeJS.Signals | null>((resolve) =>
      child.once('exit', (_code, signal) => resolve(signal)),
    );
    try {
      const line = await new Promise<string>((resolve, reject) => {
        let buffer = '';
        child.stdout.on('data', (chunk: Buffer) => {
          buffer += chunk.toString();
          if (buffer.includes('\n')) resolve(buffer.split('\n')[0]!);
        });
        void exited.then((signal) => reject(new Error(`holder exited early (${signal})`)));
      });
      const held = JSON.parse(line) as {
        acquired: boolean;
        epoch: string;
        expiresAt: string;
        backendPid: number;
      };
      assert.equal(held.acquired, true);

      child.kill('SIGKILL');
      assert.equal(await exited, 'SIGKILL');
      // The server notices the closed socket and ends the session: the session is over.
      await waitUntilBackendGone(pool, held.backendPid);

      await assertHeldUntilExpiryThenTakenOver(pool, {
        key,
        owner: 'holder',
        epoch: BigInt(held.epoch),
        expiresAt: BigInt(held.expiresAt),
      });
    } finally {
      child.kill('SIGKILL');
    }
  });

  test('a hanging holder loses its lease at expiry: after a takeover its renew reports not_owner and its release changes nothing', async () => {
    const { pool } = database;
    const key = 'stall/taken-over';
    const holder = await connect(database.url);
    try {
      const grant = await acquire(holder, key, 'holder', TTL);
      // The holder keeps its connection and does nothing; another owner waits for the key.
      await assertHeldUntilExpiryThenTakenOver(pool, {
        key,
        owner: 'holder',
        epoch: grant.epoch!,
        expiresAt: grant.expiresAt!,
      });
      const taken = await inspect(pool, key);
      assert.equal(taken?.owner, 'taker');

      assert.deepEqual(await renew(holder, key, 'holder', grant.epoch!, TTL), {
        status: 'not_owner',
        expiresAt: null,
      });
      assert.equal((await release(holder, key, 'holder', grant.epoch!)).status, 'not_owner');
      assert.deepEqual(await inspect(pool, key), taken);
    } finally {
      await disconnect(holder);
    }
  });

  test('a hanging holder whose lease lapsed untaken gets lapsed from renew and release, which change nothing', async () => {
    const { pool } = database;
    const key = 'stall/lapsed';
    const holder = await connect(database.url);
    try {
      const grant = await acquire(holder, key, 'holder', '1 second');
      await sleepUntilServerTime(pool, grant.expiresAt!);
      const lapsed = await inspect(pool, key);
      assert.deepEqual(lapsed, { held: false, owner: null, epoch: grant.epoch, expiresAt: null });

      assert.deepEqual(await renew(holder, key, 'holder', grant.epoch!, TTL), {
        status: 'lapsed',
        expiresAt: null,
      });
      assert.equal((await release(holder, key, 'holder', grant.epoch!)).status, 'lapsed');
      assert.deepEqual(await inspect(pool, key), lapsed);
      // Lapse is final: even the former holder only gets the key back as a new grant.
      assert.equal((await acquire(holder, key, 'holder', TTL)).epoch, grant.epoch! + 1n);
    } finally {
      await disconnect(holder);
    }
  });

  test('a too-short TTL yields lapsed on the next renew and never a second holder', async () => {
    const { pool } = database;
    // The holder's work outlasts its TTL. Alone, it finds its lease lapsed and still unheld.
    const alone = await acquire(pool, 'short-ttl/alone', 'holder', '200 milliseconds');
    await sleepUntilServerTime(pool, alone.expiresAt!);
    assert.deepEqual(await renew(pool, 'short-ttl/alone', 'holder', alone.epoch!, '1 second'), {
      status: 'lapsed',
      expiresAt: null,
    });
    assert.deepEqual(await inspect(pool, 'short-ttl/alone'), {
      held: false,
      owner: null,
      epoch: alone.epoch,
      expiresAt: null,
    });

    // With a competitor waiting, the competitor gets it at the expiry, not earlier, and the
    // late renew cannot give the holder a second, overlapping grant.
    const contested = await acquire(pool, 'short-ttl/contested', 'holder', '200 milliseconds');
    const competitor = await acquire(
      pool,
      'short-ttl/contested',
      'competitor',
      '10 seconds',
      '10 seconds',
    );
    assert.equal(competitor.epoch, contested.epoch! + 1n);
    assert.ok(competitor.grantedAt! >= contested.expiresAt!);
    assert.equal(
      (await renew(pool, 'short-ttl/contested', 'holder', contested.epoch!, '1 second')).status,
      'not_owner',
    );
    const state = await inspect(pool, 'short-ttl/contested');
    assert.deepEqual(state, {
      held: true,
      owner: 'competitor',
      epoch: competitor.epoch,
      expiresAt: competitor.expiresAt,
    });

    // A TTL shorter than the statement itself: granted, and lapsed by the next call.
    const instant = await acquire(pool, 'short-ttl/instant', 'holder', '1 microsecond');
    assert.deepEqual([instant.acquired, instant.epoch], [true, 1n]);
    assert.equal((await inspect(pool, 'short-ttl/instant'))?.held, false);
    assert.equal(
      (await renew(pool, 'short-ttl/instant', 'holder', 1, '1 second')).status,
      'lapsed',
    );
    assert.equal((await acquire(pool, 'short-ttl/instant', 'competitor', TTL)).epoch, 2n);
  });
});
