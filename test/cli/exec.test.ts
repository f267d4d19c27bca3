import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { LeaseClient } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { uniqueKey, waitFor } from '../support/helpers.js';
import { runCli, startCli } from './helpers.js';

let db: TestDatabase;
let client: LeaseClient;

before(async () => {
  db = await createTestDatabase();
  client = new LeaseClient(db.pool);
});
after(() => db.close());

/** `node -e script` as the command to run under the lease. */
/** `pg-lease exec` against the test database, up to and including the `--` before the command. */
function execArgs(key: string, ttl: string, ...options: string[]): string[] {
  return ['exec', '--url', db.url, '--key', key, '--ttl', ttl, ...options, '--'];
}

function node(script: string): string[] {
  return [process.execPath, '-e', script];
}

/** Prints its lease environment and pid, then waits for a line on stdin and exits with it. */
const REPORT_THEN_EXIT_WITH_STDIN = `
  const { PG_LEASE_KEY: key, PG_LEASE_OWNER: owner, PG_LEASE_EPOCH: epoch } = process.env;
  console.log('ready ' + JSON.stringify({ key, owner, epoch, pid: process.pid }));
  process.stdin.once('data', (line) => process.exit(Number(String(line).trim())));
`;

function readyInfo(stdout: string): { key: string; owner: string; epoch: string; pid: number } {
  const line = stdout.split('\n').find((l) => l.startsWith('ready '));
  assert.ok(line, `no ready line in ${stdout}`);
  return JSON.parse(line.slice('ready '.length)) as ReturnType<typeof readyInfo>;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Takes the key away from whoever holds it: an operator's release, then another owner. */
async function takeOver(key: string): Promise<void> {
  const state = (await client.inspect(key))!;
  assert.equal(await client.release(key, { owner: state.owner!, epoch: state.epoch }), 'ok');
  assert.ok(await client.acquire(key, { ttl: '1 min', owner: 'intruder' }));
}

describe('pg-lease exec', () => {
  test('gives the command the key, owner and epoch, holds the lease meanwhile and exits with its status', async () => {
    const key = uniqueKey();
    const cli = startCli([
      ...execArgs(key, '30s', '--owner', 'runner'),
      ...node(REPORT_THEN_EXIT_WITH_STDIN),
    ]);
    await cli.waitForOutput('ready ');
    const info = readyInfo(cli.stdout());
    assert.deepEqual(
      { key: info.key, owner: info.owner, epoch: info.epoch },
      {
        key,
        owner: 'runner',
        epoch: '1',
      },
    );
    const state = await client.inspect(key);
    assert.deepEqual([state?.held, state?.owner, state?.epoch], [true, 'runner', 1n]);
    cli.child.stdin.write('3\n');
    const result = await cli.done;
    assert.equal(result.code, 3, result.stderr);
    // Released once the command exited.
    assert.deepEqual(await client.inspect(key), {
      held: false,
      owner: null,
      epoch: 2n,
      expiresAt: null,
    });
  });

  test('exits 75 without running the command when another owner holds the key', async () => {
    const key = uniqueKey();
    const holder = (await client.acquire(key, { ttl: '30s' }))!;
    const result = await runCli([
      ...execArgs(key, '30s', '--wait', '200ms'),
      ...node("console.log('ran')"),
    ]);
    assert.equal(result.code, 75);
    assert.equal(result.stdout, '');
    assert.match(result.stderr, /not acquired/);
    await holder.release();
  });

  test('on loss the command gets SIGTERM and pg-lease exits 76', async () => {
    const key = uniqueKey();
    const cli = startCli([
      ...execArgs(key, '2s'),
      ...node(`
        process.on('SIGTERM', () => { console.log('got SIGTERM'); process.exit(0); });
        console.log('ready ' + JSON.stringify({ pid: process.pid }));
        setInterval(() => {}, 1000);
      `),
    ]);
    await cli.waitForOutput('ready ');
    await takeOver(key);
    const result = await cli.done;
    assert.equal(result.code, 76, result.stderr);
    assert.match(result.stdout, /got SIGTERM/);
    assert.match(result.stderr, /lost: another owner holds the key/);
    assert.equal((await client.inspect(key))?.owner, 'intruder');
  });

  test('a command that ignores SIGTERM is killed after the grace period', async () => {
    const key = uniqueKey();
    const cli = startCli([
      ...execArgs(key, '2s', '--grace', '500ms'),
      ...node(`
        process.on('SIGTERM', () => console.log('ignoring SIGTERM'));
        console.log('ready ' + JSON.stringify({ pid: process.pid }));
        setInterval(() => {}, 1000);
      `),
    ]);
    await cli.waitForOutput('ready ');
    const { pid } = readyInfo(cli.stdout());
    await takeOver(key);
    const result = await cli.done;
    assert.equal(result.code, 76, result.stderr);
    assert.match(result.stdout, /ignoring SIGTERM/);
    await waitFor('the command is gone', () => !alive(pid), 5_000);
  });

  test('signals sent to pg-lease reach the command, and the lease is released after it exits', async () => {
    const key = uniqueKey();
    const cli = startCli([
      ...execArgs(key, '30s'),
      ...node(`
        process.on('SIGUSR1', () => console.log('got SIGUSR1'));
        process.on('SIGTERM', () => { console.log('got SIGTERM'); setTimeout(() => process.exit(7), 200); });
        console.log('ready ' + JSON.stringify({ pid: process.pid }));
        setInterval(() => {}, 1000);
      `),
    ]);
    await cli.waitForOutput('ready ');
    cli.child.kill('SIGUSR1');
    await cli.waitForOutput('got SIGUSR1');
    assert.equal((await client.inspect(key))?.held, true);
    cli.child.kill('SIGTERM');
    await cli.waitForOutput('got SIGTERM');
    const result = await cli.done;
    assert.equal(result.code, 7, result.stderr);
    assert.equal((await client.inspect(key))?.held, false);
  });

  test('a command ended by a forwarded signal makes pg-lease exit 128 + its number', async () => {
    const key = uniqueKey();
    const cli = startCli([
      ...execArgs(key, '30s'),
      ...node(`console.log('ready {}'); setInterval(() => {}, 1000);`),
    ]);
    await cli.waitForOutput('ready ');
    cli.child.kill('SIGINT');
    const result = await cli.done;
    assert.equal(result.code, 130, result.stderr);
    assert.equal((await client.inspect(key))?.held, false);
  });

  test('a command that does not exist exits 127 and releases the lease', async () => {
    const key = uniqueKey();
    const result = await runCli([...execArgs(key, '30s'), 'pg-lease-no-such-command']);
    assert.equal(result.code, 127);
    assert.match(result.stderr, /cannot run pg-lease-no-such-command/);
    assert.deepEqual(await client.inspect(key), {
      held: false,
      owner: null,
      epoch: 2n,
      expiresAt: null,
    });
  });

  test('exec without a command after -- is a usage error', async () => {
    const result = await runCli(['exec', '--url', db.url, '--key', 'k', '--ttl', '30s']);
    assert.equal(result.code, 64);
    assert.match(result.stderr, /needs a command after --/);
  });
});
