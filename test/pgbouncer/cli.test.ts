/**
 * The `pg-lease` command through PgBouncer in transaction mode: exec keeps its leases alive
 * through four server connections while a dozen commands run at once, and the one-shot
 * commands work as they do on a direct connection.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { LeaseClient } from '../../src/index.js';
import { runCli } from '../cli/helpers.js';
import {
  POOL_SIZE,
  bouncedPool,
  sampled,
  skipWithoutPgBouncer,
  startBounced,
  type Bounced,
} from './support.js';

const skip = skipWithoutPgBouncer();

/** A command that prints the lease it runs under, then works for `ms`. */
function worker(ms: number): string[] {
  return [
    process.execPath,
    '-e',
    `console.log(process.env.PG_LEASE_KEY + '#' + process.env.PG_LEASE_EPOCH); setTimeout(() => {}, ${ms})`,
  ];
}

describe('CLI behind PgBouncer (transaction pooling)', { skip }, () => {
  let bounced: Bounced;
  before(async () => {
    bounced = await startBounced();
  });
  after(() => bounced?.close());

  test('a dozen exec runs at once keep their leases alive through four server connections', async () => {
    const keys = Array.from({ length: 12 }, (_, n) => `cli/exec/${n}`);
    const { result, maxServer, maxClients } = await sampled(
      bounced,
      Promise.all(
        keys.map((key) =>
          runCli(
            ['exec', '--url', bounced.url, '--key', key, '--ttl', '3s', '--', ...worker(7_000)],
            {},
            60_000,
          ),
        ),
      ),
    );
    for (const [n, run] of result.entries()) {
      assert.equal(run.code, 0, `${keys[n]}: exit ${run.code}, stderr ${run.stderr}`);
      assert.equal(run.stdout.trim(), `${keys[n]}#1`);
    }
    assert.ok(maxServer <= POOL_SIZE, `${maxServer} server connections`);
    assert.ok(maxClients >= keys.length, `only ${maxClients} clients at once`);
    const pool = bouncedPool(bounced.url, 2);
    try {
      const client = new LeaseClient(pool);
      // Renewed throughout (a 3 s ttl over 7 s of work), then released: free at epoch 2.
      for (const key of keys)
        assert.deepEqual(await client.inspect(key), {
          held: false,
          owner: null,
          epoch: 2n,
          expiresAt: null,
        });
    } finally {
      await pool.end();
    }
  });

  test('exec with --wait takes turns on one key, fewer runs than server connections', async () => {
    const runs = await Promise.all(
      Array.from({ length: POOL_SIZE - 1 }, () =>
        runCli(
          [
            'exec',
            '--url',
            bounced.url,
            '--key',
            'cli/turns',
            '--ttl',
            '5s',
            '--wait',
            '60s',
            '--',
            ...worker(300),
          ],
          {},
          90_000,
        ),
      ),
    );
    for (const run of runs) assert.equal(run.code, 0, run.stderr);
    const epochs = runs.map((run) => run.stdout.trim()).sort();
    assert.deepEqual(epochs, ['cli/turns#1', 'cli/turns#3', 'cli/turns#5']);
  });

  test('acquire, renew, inspect and release through the pooler', async () => {
    const url = ['--url', bounced.url];
    const acquired = await runCli([
      'acquire',
      ...url,
      '--key',
      'cli/once',
      '--ttl',
      '30s',
      '--owner',
      'me',
      '--json',
    ]);
    assert.equal(acquired.code, 0, acquired.stderr);
    const grant = JSON.parse(acquired.stdout) as { epoch: string; owner: string };
    assert.deepEqual([grant.owner, grant.epoch], ['me', '1']);
    const renewed = await runCli([
      'renew',
      ...url,
      '--key',
      'cli/once',
      '--owner',
      'me',
      '--epoch',
      '1',
      '--ttl',
      '30s',
    ]);
    assert.equal(renewed.code, 0, renewed.stderr);
    const inspected = await runCli(['inspect', ...url, '--key', 'cli/once', '--json']);
    assert.equal((JSON.parse(inspected.stdout) as { owner: string }).owner, 'me');
    const released = await runCli([
      'release',
      ...url,
      '--key',
      'cli/once',
      '--owner',
      'me',
      '--epoch',
      '1',
    ]);
    assert.equal(released.code, 0, released.stderr);
    const listed = await runCli(['list', ...url, '--json']);
    if (listed.code !== 64) {
      // `list` exists in this build: it reads through the pooler like inspect.
      assert.equal(listed.code, 0, listed.stderr);
    }
  });
});
