/**
 * Failure model, a blocking acquire whose client has gone (SEMANTICS.md §10 Waiting): the
 * client process is killed (not just its backend) while its SQL wait sleeps. The backend must
 * stop waiting promptly, and the key must never be granted to the dead waiter, also when it is
 * released right after the kill. Both ways the wait learns of it are covered: its own probes
 * (the default) and PostgreSQL's client_connection_check_interval set by the session.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { acquire, inspect, release } from '../support/lease-calls.js';
import { waitUntilBackendGone, waitUntilWaiting } from './support/sessions.js';

const fixture = path.join(path.dirname(fileURLToPath(import.meta.url)), 'fixtures', 'sql-wait.js');

let database: TestDatabase;
before(async () => {
  database = await createTestDatabase();
});
after(() => database?.close());

/** Starts the waiting client; resolves once its backend sleeps inside lease.acquire. */
async function startWaiter(
  key: string,
  owner: string,
  checkInterval?: string,
): Promise<{ kill: () => void; backendPid: number; exited: Promise<void> }> {
  const child = spawn(
    process.execPath,
    [fixture, database.url, key, owner, '60 seconds', ...(checkInterval ? [checkInterval] : [])],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const line = await new Promise<string>((resolve, reject) => {
    let out = '';
    child.stdout.on('data', (chunk: Buffer) => {
      out += chunk.toString();
      if (out.includes('\n')) resolve(out.slice(0, out.indexOf('\n')));
    });
    child.once('exit', () => reject(new Error(`waiter exited early: ${out}`)));
  });
  const { backendPid } = JSON.parse(line) as { backendPid: number };
  await waitUntilWaiting(database.pool, backendPid, 300);
  return { kill: () => child.kill('SIGKILL'), backendPid, exited };
}

describe('a blocking acquire whose client was killed', { concurrency: true }, () => {
  for (const [mode, checkInterval] of [
    ['probing', undefined],
    ['client_connection_check_interval', '200ms'],
  ] as const) {
    test(`(${mode}) is never granted the key released right after the kill`, async () => {
      const { pool } = database;
      const key = `client-gone/now/${mode}`;
      const grant = await acquire(pool, key, 'holder', '60 seconds');
      const waiter = await startWaiter(key, 'dead-waiter', checkInterval);
      waiter.kill();
      await waiter.exited;
      assert.equal((await release(pool, key, 'holder', grant.epoch!)).status, 'ok');
      await waitUntilBackendGone(pool, waiter.backendPid);
      await sleep(200);
      const state = await inspect(pool, key);
      assert.deepEqual(
        state,
        { held: false, owner: null, epoch: grant.epoch! + 1n, expiresAt: null },
        'the key was granted to the killed waiter',
      );
    });

    test(`(${mode}) stops waiting promptly and grants nothing after the later release`, async () => {
      const { pool } = database;
      const key = `client-gone/later/${mode}`;
      const grant = await acquire(pool, key, 'holder', '60 seconds');
      const waiter = await startWaiter(key, 'dead-waiter', checkInterval);
      waiter.kill();
      // The wait asks for 60 s; its backend must end long before that.
      const killedAt = Date.now();
      await waitUntilBackendGone(pool, waiter.backendPid);
      assert.ok(Date.now() - killedAt < 15_000, 'the backend kept waiting after its client died');
      assert.equal((await release(pool, key, 'holder', grant.epoch!)).status, 'ok');
      const next = await acquire(pool, key, 'next', '1 second');
      assert.deepEqual([next.acquired, next.epoch], [true, grant.epoch! + 2n]);
    });
  }
});
