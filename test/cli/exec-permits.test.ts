/**
 * `pg-lease exec --limit N` (a counted key: up to N runners at once, as `consul lock -n`) and
 * `pg-lease exec --shared` (readers beside each other, never beside an exclusive runner), the
 * holders of such keys in `pg-lease list`, and the flags that do not go together.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { LeaseClient } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { uniqueKey, waitFor } from '../support/helpers.js';
import { parseJson, runCli, startCli, type RunningCli } from './helpers.js';

let db: TestDatabase;
let client: LeaseClient;

before(async () => {
  db = await createTestDatabase();
  client = new LeaseClient(db.pool);
});
after(() => db.close());

function execArgs(key: string, ...options: string[]): string[] {
  return ['exec', '--url', db.url, '--key', key, '--ttl', '30s', ...options, '--'];
}

/** Prints its lease environment, then waits for a line on stdin and exits with it. */
const REPORT_THEN_EXIT_WITH_STDIN = [
  process.execPath,
  '-e',
  `
  const { PG_LEASE_KEY: key, PG_LEASE_OWNER: owner, PG_LEASE_EPOCH: epoch } = process.env;
  console.log('ready ' + JSON.stringify({ key, owner, epoch }));
  process.stdin.once('data', (line) => process.exit(Number(String(line).trim())));
`,
];

function readyInfo(cli: RunningCli): { key: string; owner: string; epoch: string } {
  const line = cli
    .stdout()
    .split('\n')
    .find((l) => l.startsWith('ready '));
  assert.ok(line, `no ready line in ${cli.stdout()}`);
  return JSON.parse(line.slice('ready '.length)) as ReturnType<typeof readyInfo>;
}

/** Lets a runner's command exit with `code` and waits for pg-lease to exit. */
async function finish(cli: RunningCli, code = 0) {
  cli.child.stdin.write(`${code}\n`);
  return cli.done;
}

describe('pg-lease exec --limit and --shared', () => {
  test('exec --limit 2 runs two of three runners at once, each with its own epoch; list shows both', async () => {
    const key = uniqueKey('exec-limit');
    const runners = [1, 2, 3].map(() =>
      startCli([...execArgs(key, '--limit', '2'), ...REPORT_THEN_EXIT_WITH_STDIN]),
    );
    // Exactly one of them finds both permits taken and exits 75; the other two run.
    const refused = await Promise.race(
      runners.map((cli, i) => cli.done.then((result) => ({ i, result }))),
    );
    assert.equal(refused.result.code, 75, refused.result.stdout + refused.result.stderr);
    assert.match(refused.result.stderr, /no free permit/);
    const running = runners.filter((_, i) => i !== refused.i);
    for (const cli of running) await cli.waitForOutput('ready ');
    const infos = running.map(readyInfo);
    assert.equal(new Set(infos.map((info) => info.epoch)).size, 2, 'each runner its own epoch');
    assert.equal(new Set(infos.map((info) => info.owner)).size, 2);
    for (const info of infos) assert.equal(info.key, key);

    const listed = await runCli(['list', '--url', db.url, '--prefix', key]);
    assert.equal(listed.code, 0, listed.stderr);
    const lines = listed.stdout.split('\n').filter((line) => line.startsWith(key));
    assert.equal(lines.length, 2, listed.stdout);
    for (const info of infos)
      assert.ok(
        lines.some((line) => line.includes(info.owner) && line.includes(` ${info.epoch} `)),
        `${info.owner} (epoch ${info.epoch}) not listed:\n${listed.stdout}`,
      );
    const json = parseJson(await runCli(['list', '--url', db.url, '--prefix', key, '--json'])) as {
      leases: { key: string; holders: { owner: string; epoch: number | string }[] }[];
    };
    assert.equal(json.leases.length, 1);
    assert.deepEqual(
      json.leases[0]!.holders.map((holder) => holder.owner).sort(),
      infos.map((info) => info.owner).sort(),
    );

    // A waiting runner gets the permit the first one gives back.
    const waiter = startCli([
      ...execArgs(key, '--limit', '2', '--wait', '30s'),
      ...REPORT_THEN_EXIT_WITH_STDIN,
    ]);
    await waitFor('the waiter marks the key', async () => {
      const { rows } = await db.pool.query<{ watched: boolean }>(
        'SELECT watched_until > now() AS watched FROM lease.leases WHERE key = $1',
        [key],
      );
      return rows[0]?.watched === true;
    });
    assert.equal((await finish(running[0]!, 0)).code, 0);
    await waiter.waitForOutput('ready ');
    assert.ok(BigInt(readyInfo(waiter).epoch) > BigInt(infos[1]!.epoch));
    assert.equal((await finish(running[1]!, 3)).code, 3, 'the command status is passed on');
    assert.equal((await finish(waiter, 0)).code, 0);
    assert.deepEqual(await client.holders(key), [], 'every permit released');
  });

  test('exec --shared runners run side by side and keep an exclusive runner out', async () => {
    const key = uniqueKey('exec-shared');
    const readers = [1, 2].map(() =>
      startCli([...execArgs(key, '--shared'), ...REPORT_THEN_EXIT_WITH_STDIN]),
    );
    for (const cli of readers) await cli.waitForOutput('ready ');
    const epochs = readers.map((cli) => readyInfo(cli).epoch);
    assert.notEqual(epochs[0], epochs[1]);
    const writer = await runCli([...execArgs(key), process.execPath, '-e', '']);
    assert.equal(writer.code, 75, writer.stderr);
    assert.equal((await client.holders(key)).length, 2);
    for (const cli of readers) assert.equal((await finish(cli)).code, 0);
    const after = await runCli([...execArgs(key), process.execPath, '-e', '']);
    assert.equal(after.code, 0, after.stderr);
  });

  test('watch shows every holder of a counted key and of a shared one', async () => {
    const counted = uniqueKey('watch-holders');
    const shared = `${counted}:shared`;
    const permits = await Promise.all(
      ['p1', 'p2'].map((owner) => client.acquire(counted, { ttl: '1 min', limit: 3, owner })),
    );
    const readers = await Promise.all(
      ['r1', 'r2'].map((owner) => client.acquire(shared, { ttl: '1 min', shared: true, owner })),
    );
    const result = await runCli(['watch', '--url', db.url, '--prefix', counted, '--count', '1']);
    assert.equal(result.code, 0, result.stderr);
    const lines = result.stdout.split('\n');
    for (const [key, owner] of [
      [counted, 'p1'],
      [counted, 'p2'],
      [shared, 'r1'],
      [shared, 'r2'],
    ])
      assert.ok(
        lines.some((line) => line.startsWith(`${key} `) && line.includes(` ${owner} `)),
        `${key} ${owner} not shown:\n${result.stdout}`,
      );
    await Promise.all([...permits, ...readers].map((lease) => lease!.release()));
  });

  test('bad flags are refused before anything is sent', async () => {
    for (const flags of [
      ['--limit', '2', '--shared'],
      ['--shared', '--limit', '2'],
      ['--limit', '0'],
      ['--limit', '1001'],
      ['--limit', 'two'],
      ['--limit', '1.5'],
    ]) {
      const key = uniqueKey('exec-bad');
      const result = await runCli([...execArgs(key, ...flags), process.execPath, '-e', '']);
      assert.equal(result.code, 64, `${flags.join(' ')}: ${result.stdout}${result.stderr}`);
      assert.match(result.stderr, /limit/);
      assert.equal(await client.inspect(key), null, 'nothing was written');
    }
  });

  test('--limit on a key held exclusively fails with the server error and changes nothing', async () => {
    const key = uniqueKey('exec-limit-held');
    const holder = (await client.acquire(key, { ttl: '1 min', owner: 'exclusive-holder' }))!;
    const result = await runCli([
      ...execArgs(key, '--limit', '3'),
      process.execPath,
      '-e',
      'process.exit(9)',
    ]);
    assert.notEqual(result.code, 0);
    assert.notEqual(result.code, 9, 'the command did not run');
    assert.match(result.stderr, /held exclusively/);
    const state = await client.inspect(key);
    assert.equal(state?.owner, 'exclusive-holder');
    assert.equal(state?.epoch, holder.epoch);
    await holder.release();
  });
});
