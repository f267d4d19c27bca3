/**
 * `pg-lease exec --verbose`: one line per event on stderr (never stdout, which is the
 * command's), as text or with --json as JSON objects; a server outage while the command runs
 * shows the failed renewals, their retries and the renewal that got through again. Times are
 * never asserted, only the order and presence of events: ttls are generous.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { PgCluster } from 'pg-lease-testing';
import { LeaseClient } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { uniqueKey, waitFor } from '../support/helpers.js';
import { runCli, startCli, type RunningCli } from './helpers.js';

let db: TestDatabase;
let client: LeaseClient;

before(async () => {
  db = await createTestDatabase();
  client = new LeaseClient(db.pool);
});
after(() => db.close());

function execArgs(url: string, key: string, ttl: string, ...options: string[]): string[] {
  return ['exec', '--url', url, '--key', key, '--ttl', ttl, ...options, '--'];
}

/** Prints a ready line, then exits with the number it reads on stdin. */
const READY_THEN_EXIT_WITH_STDIN = [
  process.execPath,
  '-e',
  `console.log('ready');
   process.stdin.once('data', (line) => process.exit(Number(String(line).trim())));`,
];

type Event = Record<string, unknown> & { event: string };

/** Every stderr line as an event; fails on a line that is not one. */
function events(stderr: string): Event[] {
  return stderr
    .split('\n')
    .filter((line) => line !== '')
    .map((line) => {
      let value: unknown;
      try {
        value = JSON.parse(line);
      } catch {
        assert.fail(`stderr line is not JSON: ${line}\nstderr: ${stderr}`);
      }
      assert.ok(
        typeof value === 'object' && value !== null && typeof (value as Event).event === 'string',
        `not an event: ${line}`,
      );
      return value as Event;
    });
}

function names(list: Event[]): string[] {
  return list.map((event) => event.event);
}

/** Waits until the run has told `count` events named `name` (with --json). */
async function waitForEvent(cli: RunningCli, name: string, count = 1): Promise<void> {
  await waitFor(
    `${count} ${name} event(s) (stderr so far: ${cli.stderr()})`,
    () => events(cli.stderr()).filter((event) => event.event === name).length >= count,
    60_000,
  );
}

/** `names` holds `expected` in this order (other events may come between). */
function assertInOrder(actual: string[], expected: string[]): void {
  let at = 0;
  for (const name of expected) {
    const found = actual.indexOf(name, at);
    assert.ok(found !== -1, `${name} missing after position ${at} in ${actual.join(', ')}`);
    at = found + 1;
  }
}

function assertIsoTime(value: unknown, what: string): void {
  assert.equal(typeof value, 'string', what);
  assert.equal(new Date(value as string).toISOString(), value, what);
}

describe('pg-lease exec --verbose', () => {
  test('tells the grant, the start, renewals with the time left, the exit and the release on stderr', async () => {
    const key = uniqueKey('verbose');
    const cli = startCli([
      ...execArgs(db.url, key, '6s', '--owner', 'verbose-owner', '--verbose'),
      ...READY_THEN_EXIT_WITH_STDIN,
    ]);
    await waitFor(
      `two renewals told (stderr so far: ${cli.stderr()})`,
      () => (cli.stderr().match(/^pg-lease: renewed /gm) ?? []).length >= 2,
      60_000,
    );
    cli.child.stdin.write('0\n');
    const result = await cli.done;
    assert.equal(result.code, 0, result.stderr);
    // stdout is the command's alone.
    assert.equal(result.stdout, 'ready\n');
    const lines = result.stderr.trimEnd().split('\n');
    for (const line of lines) assert.match(line, /^pg-lease: /);
    // One line per event, in this order (more renewals may come between).
    let at = 0;
    for (const expected of [
      `holding ${key} as verbose-owner, epoch 1: \\S+ left \\(expires `,
      `started ${process.execPath.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')} \\(pid \\d+\\)`,
      `renewed ${key}: \\S+ left`,
      `renewed ${key}: \\S+ left`,
      'the command exited with status 0',
      `released ${key}: ok \\(held `,
    ]) {
      const found = lines.findIndex(
        (line, i) => i >= at && new RegExp(`^pg-lease: ${expected}`).test(line),
      );
      assert.ok(found !== -1, `no line ${expected} after line ${at} of:\n${result.stderr}`);
      at = found + 1;
    }
    assert.equal(at, lines.length, 'the release is the last line');
  });

  test('with --json every stderr line is a JSON event with the documented fields; stdout keeps the outcome', async () => {
    const key = uniqueKey('verbose-json');
    const cli = startCli([
      ...execArgs(db.url, key, '6s', '--verbose', '--json'),
      ...READY_THEN_EXIT_WITH_STDIN,
    ]);
    await waitForEvent(cli, 'renewed', 2);
    cli.child.stdin.write('3\n');
    const result = await cli.done;
    assert.equal(result.code, 3, result.stderr);

    const [ready, outcomeLine, ...rest] = result.stdout.trimEnd().split('\n');
    assert.equal(ready, 'ready');
    assert.deepEqual(rest, []);
    const outcome = JSON.parse(outcomeLine!) as Record<string, unknown>;
    assert.equal(outcome.exitCode, 3);

    const told = events(result.stderr);
    assert.deepEqual(names(told).slice(0, 2), ['acquired', 'started']);
    assert.deepEqual(names(told).slice(-2), ['exited', 'released']);
    assert.ok(names(told).filter((name) => name === 'renewed').length >= 2, names(told).join());
    for (const event of told) assertIsoTime(event.at, `${event.event}.at`);
    for (const event of told.filter((e) => 'key' in e)) {
      assert.equal(event.key, key, event.event);
      assert.equal(event.owner, outcome.owner, event.event);
      assert.equal(event.epoch, outcome.epoch, event.event);
    }
    const acquired = told[0]!;
    assertIsoTime(acquired.expiresAt, 'acquired.expiresAt');
    assert.equal(typeof acquired.timeLeftMs, 'number');
    assert.ok((acquired.timeLeftMs as number) > 0);
    assert.equal(typeof acquired.waitedMs, 'number');
    assert.equal(typeof told[1]!.pid, 'number');
    assert.deepEqual(told[1]!.command, READY_THEN_EXIT_WITH_STDIN);
    for (const renewed of told.filter((e) => e.event === 'renewed')) {
      assertIsoTime(renewed.expiresAt, 'renewed.expiresAt');
      assert.ok((renewed.timeLeftMs as number) > 0);
      assert.equal(typeof renewed.latencyMs, 'number');
    }
    assert.deepEqual(
      { exitCode: told.at(-2)!.exitCode, signal: told.at(-2)!.signal },
      { exitCode: 3, signal: null },
    );
    const released = told.at(-1)!;
    assert.equal(released.status, 'ok');
    assert.equal(typeof released.heldMs, 'number');
  });

  test('with --json, a loss is told before the SIGTERM it causes, then the exit and the release', async () => {
    const key = uniqueKey('verbose-lost');
    const cli = startCli([
      ...execArgs(db.url, key, '3s', '--verbose', '--json'),
      process.execPath,
      '-e',
      `process.on('SIGTERM', () => process.exit(0)); console.log('ready'); setInterval(() => {}, 1000);`,
    ]);
    await waitForEvent(cli, 'started');
    // An operator releases the grant and another owner takes the key.
    const state = (await client.inspect(key))!;
    assert.equal(await client.release(key, { owner: state.owner!, epoch: state.epoch }), 'ok');
    assert.ok(await client.acquire(key, { ttl: '1 min', owner: 'intruder' }));
    const result = await cli.done;
    assert.equal(result.code, 76, result.stderr);

    const told = events(result.stderr);
    assertInOrder(names(told), ['acquired', 'started', 'lost', 'signal', 'exited', 'released']);
    const lost = told.find((e) => e.event === 'lost')!;
    assert.deepEqual([lost.reason, lost.source], ['not_owner', 'server']);
    assert.equal((lost.error as { code: string }).code, 'lease_lost');
    const signal = told.find((e) => e.event === 'signal')!;
    assert.deepEqual([signal.signal, signal.reason], ['SIGTERM', 'lost']);
    assert.equal(told.at(-1)!.status, 'not_owner');
    // The outcome on stdout is the error, as without --verbose.
    const last = result.stdout.trimEnd().split('\n').at(-1)!;
    assert.equal((JSON.parse(last) as { error: { code: string } }).error.code, 'lease_lost');
  });

  test('with --json, a wait that runs out tells waiting and notAcquired; without --verbose stderr stays empty', async () => {
    const key = uniqueKey('verbose-wait');
    const holder = (await client.acquire(key, { ttl: '1 min' }))!;
    try {
      const verbose = await runCli([
        ...execArgs(db.url, key, '30s', '--wait', '300ms', '--verbose', '--json'),
        process.execPath,
        '-e',
        "console.log('ran')",
      ]);
      assert.equal(verbose.code, 75, verbose.stderr);
      const told = events(verbose.stderr);
      assert.deepEqual(names(told), ['waiting', 'notAcquired']);
      assert.deepEqual([told[0]!.wait, told[0]!.waitMs], ['300ms', 300]);
      assert.equal(told[1]!.reason, 'timeout');
      assert.deepEqual(JSON.parse(verbose.stdout), { acquired: false, key, reason: 'timeout' });

      const quiet = await runCli([
        ...execArgs(db.url, key, '30s', '--json'),
        process.execPath,
        '-e',
        "console.log('ran')",
      ]);
      assert.equal(quiet.code, 75);
      assert.equal(quiet.stderr, '');
    } finally {
      await holder.release();
    }
  });
});

describe('pg-lease exec --verbose through a server outage', () => {
  let cluster: PgCluster;
  let url: string;
  before(async () => {
    cluster = await PgCluster.start();
    url = await cluster.createDatabase();
  });
  after(() => cluster.destroy());

  test('a stopped server shows the connection lost, renewals failing and retried, then recovered; the lease is kept', async () => {
    const key = uniqueKey('verbose-outage');
    // ttl 20s: renewals every ~6s, a failed one retried after 1s; the outage is a few seconds.
    const cli = startCli([
      ...execArgs(url, key, '20s', '--verbose', '--json'),
      ...READY_THEN_EXIT_WITH_STDIN,
    ]);
    try {
      await waitForEvent(cli, 'started');
      await cluster.stop('fast');
      try {
        // Two failures: the first one and its retry.
        await waitForEvent(cli, 'renewalFailed', 2);
      } finally {
        await cluster.start();
      }
      await waitForEvent(cli, 'recovered');

      // The same grant is still held.
      const pool = new LeaseClient(url);
      try {
        const state = await pool.inspect(key);
        const acquired = events(cli.stderr())[0]!;
        assert.deepEqual(
          [state?.held, state?.owner, state?.epoch.toString()],
          [true, acquired.owner, acquired.epoch],
        );
      } finally {
        await pool.end();
      }
    } finally {
      cli.child.stdin.write('0\n');
    }
    const result = await cli.done;
    assert.equal(result.code, 0, result.stderr);

    const told = events(result.stderr);
    assert.ok(!names(told).includes('lost'), names(told).join());
    assertInOrder(names(told), [
      'acquired',
      'started',
      'connectionError',
      'renewalFailed',
      'renewalFailed',
      'renewed',
      'recovered',
      'exited',
      'released',
    ]);
    const connection = told.find((e) => e.event === 'connectionError')!;
    assert.equal(connection.connection, 'idle');
    assert.equal(typeof (connection.error as { message: unknown }).message, 'string');
    const failures = told.filter((e) => e.event === 'renewalFailed');
    for (const failure of failures) {
      assert.equal(failure.retrying, true);
      assert.equal(typeof failure.retryInMs, 'number');
      assert.ok((failure.retryInMs as number) > 0);
      assert.ok((failure.timeLeftMs as number) > 0);
      assert.equal(typeof (failure.error as { code: unknown }).code, 'string');
    }
    const recovered = told.find((e) => e.event === 'recovered')!;
    assert.equal(recovered.failedRenewals, failures.length);
    assert.ok((recovered.connectionErrors as number) >= 1);
    assert.equal(typeof recovered.outageMs, 'number');
    assert.ok((recovered.timeLeftMs as number) > 0);
    assert.equal(told.at(-1)!.status, 'ok');
  });
});
