/**
 * `pg-lease exec` as a waiter and as a parent: `--wait` waits outside any transaction and can be
 * stopped by SIGINT/SIGTERM with nothing acquired; the command runs in a process group of its
 * own, and loss or forwarded signals reach everything in it.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { LeaseClient } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { uniqueKey, waitFor } from '../support/helpers.js';
import { startCli } from './helpers.js';

let db: TestDatabase;
let client: LeaseClient;

before(async () => {
  db = await createTestDatabase();
  client = new LeaseClient(db.pool);
});
after(() => db.close());

/** `pg-lease exec` whose connections carry application_name = the key. */
function execArgs(key: string, ttl: string, ...options: string[]): string[] {
  const url = new URL(db.url);
  url.searchParams.set('application_name', key);
  return ['exec', '--url', url.toString(), '--key', key, '--ttl', ttl, ...options, '--'];
}

/** A shell whose child `sleep` runs in the background; prints the sleep's pid, then waits. */
const SHELL_WITH_CHILD = ['sh', '-c', 'sleep 30 & echo "ready $!"; wait'];

function readyPid(stdout: string): number {
  const match = /ready (\d+)/.exec(stdout);
  assert.ok(match, `no ready line in ${stdout}`);
  return Number(match[1]);
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Statements running for the `pg-lease exec` of `key` (see execArgs). */
async function cliStatementsRunning(key: string): Promise<number> {
  const { rows } = await db.pool.query<{ n: number }>(
    `SELECT count(*)::int AS n FROM pg_stat_activity
      WHERE application_name = $1 AND state = 'active'`,
    [key],
  );
  return rows[0]!.n;
}

describe('pg-lease exec --wait and process groups', { concurrency: true }, () => {
  test('exec --wait runs the command once the holder releases the key', async () => {
    const key = uniqueKey('exec-wait');
    const holder = (await client.acquire(key, { ttl: '1 min' }))!;
    const cli = startCli([
      ...execArgs(key, '30s', '--wait', '30s'),
      process.execPath,
      '-e',
      'console.log("ran " + process.env.PG_LEASE_EPOCH)',
    ]);
    await sleep(500);
    assert.equal(cli.stdout(), '', 'the command ran while the key was held');
    await holder.release();
    const result = await cli.done;
    assert.equal(result.code, 0, result.stderr);
    assert.equal(result.stdout.trim(), `ran ${holder.epoch + 2n}`);
  });

  for (const [signal, code] of [
    ['SIGINT', 130],
    ['SIGTERM', 143],
  ] as const) {
    test(`${signal} during --wait exits ${code} at once and acquires nothing`, async () => {
      const key = uniqueKey('exec-wait-signal');
      const holder = (await client.acquire(key, { ttl: '1 min' }))!;
      const cli = startCli([
        ...execArgs(key, '30s', '--wait', '60s', '--verbose'),
        process.execPath,
        '-e',
        'console.log("ran")',
      ]);
      await waitFor('pg-lease waits', () => cli.stderr().includes('waiting up to'));
      await sleep(300);
      cli.child.kill(signal);
      const result = await cli.done;
      assert.equal(result.code, code, result.stderr);
      assert.match(result.stderr, new RegExp(`${signal} stopped the wait`));
      assert.equal(result.stdout, '');
      assert.equal(await cliStatementsRunning(key), 0);
      // Once the holder lets go, the key stays free: the stopped wait left nothing behind.
      await holder.release();
      await sleep(300);
      const state = await client.inspect(key);
      assert.deepEqual([state?.held, state?.epoch], [false, holder.epoch + 1n]);
    });
  }

  test('on loss the whole process group of the command is stopped, not only its first process', async () => {
    const key = uniqueKey('exec-group-loss');
    const cli = startCli([...execArgs(key, '2s'), ...SHELL_WITH_CHILD]);
    await cli.waitForOutput('ready ');
    const sleepPid = readyPid(cli.stdout());
    assert.ok(alive(sleepPid));
    const state = (await client.inspect(key))!;
    assert.equal(await client.release(key, { owner: state.owner!, epoch: state.epoch }), 'ok');
    assert.ok(await client.acquire(key, { ttl: '1 min', owner: 'intruder' }));
    // Before pg-lease's output closes: the sleep holds it open for 30 s if it survives.
    await waitFor('the background sleep is gone', () => !alive(sleepPid), 10_000);
    const result = await cli.done;
    assert.equal(result.code, 76, result.stderr);
  });

  test('a signal forwarded by pg-lease reaches every process of the command’s group', async () => {
    const key = uniqueKey('exec-group-forward');
    const cli = startCli([...execArgs(key, '30s'), ...SHELL_WITH_CHILD]);
    await cli.waitForOutput('ready ');
    const sleepPid = readyPid(cli.stdout());
    cli.child.kill('SIGTERM');
    await waitFor('the background sleep is gone', () => !alive(sleepPid), 10_000);
    const result = await cli.done;
    assert.equal(result.code, 143, `${result.signal} ${result.stderr}`);
    assert.equal((await client.inspect(key))?.held, false);
  });
});
