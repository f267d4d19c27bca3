/**
 * A hot standby serves the advisory read (`inspect`, and `list` where it exists) from what it
 * has replayed, and refuses every writing call with 25006: leases are written on the primary
 * only. The client and the CLI say so in words when pointed at a standby.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { LeaseClient, LeaseReadOnlyError } from '../../src/index.js';
import { waitForReplay } from 'pg-lease-testing';
import { runCli } from '../cli/helpers.js';
import { acquire, inspect, release } from '../support/lease-calls.js';
import { connect, disconnect, rejectsWithCode } from '../failure/support/sessions.js';
import { DATABASE, startPair, type Pair } from './support.js';

describe('hot standby', () => {
  let pair: Pair;
  let standbyUrl: string;

  before(async () => {
    pair = await startPair({ synchronous: false });
    standbyUrl = pair.standby.cluster.url(DATABASE);
    const db = await connect(pair.url());
    try {
      await acquire(db, 'hot/held', 'worker-a', '10 minutes');
      const freed = await acquire(db, 'hot/free', 'worker-a', '10 minutes');
      await release(db, 'hot/free', 'worker-a', freed.epoch!);
    } finally {
      await disconnect(db);
    }
    await waitForReplay(pair.standby);
  });
  after(() => pair?.[Symbol.asyncDispose]());

  test('inspect on the standby reports what the primary committed and the standby replayed', async () => {
    const primary = await connect(pair.url());
    const standby = await connect(standbyUrl);
    try {
      for (const key of ['hot/held', 'hot/free', 'hot/never'])
        assert.deepEqual(await inspect(standby, key), await inspect(primary, key), key);
      const list = await standby.query(
        "SELECT to_regprocedure('lease.list(text, boolean)') IS NOT NULL AS present",
      );
      if (list.rows[0].present) {
        const { rows } = await standby.query(
          'SELECT key FROM lease.list(NULL, false) ORDER BY key',
        );
        assert.deepEqual(
          rows.map((r: { key: string }) => r.key),
          ['hot/free', 'hot/held'],
        );
      }
    } finally {
      await disconnect(primary, standby);
    }
  });

  test('acquire, renew, release and purge on the standby raise 25006 and change nothing', async () => {
    const standby = await connect(standbyUrl);
    try {
      const before = await inspect(standby, 'hot/held');
      // The holder re-acquiring its own grant would write nothing, and is refused all the same.
      for (const owner of ['worker-a', 'worker-b'])
        await rejectsWithCode(
          acquire(standby, 'hot/held', owner, '1 minute'),
          '25006',
          /pg_lease: acquire needs a read-write transaction/,
        );
      await rejectsWithCode(acquire(standby, 'hot/never', 'worker-b', '1 minute'), '25006');
      await rejectsWithCode(
        standby.query("SELECT * FROM lease.renew('hot/held', 'worker-a', 1, '1 minute')"),
        '25006',
      );
      await rejectsWithCode(
        standby.query("SELECT * FROM lease.release('hot/held', 'worker-a', 1)"),
        '25006',
      );
      const purge = await standby.query(
        "SELECT to_regprocedure('lease.purge(interval, bigint)') IS NOT NULL AS present",
      );
      if (purge.rows[0].present)
        await rejectsWithCode(standby.query("SELECT lease.purge('0 seconds')"), '25006');
      assert.deepEqual(await inspect(standby, 'hot/held'), before);
    } finally {
      await disconnect(standby);
    }
  });

  test('a client given the standby URL says it cannot write leases there, and still inspects and lists', async () => {
    await using client = new LeaseClient(standbyUrl);
    const error = await client.acquire('hot/new', { ttl: '30s' }).then(
      () => assert.fail('acquired on a standby'),
      (caught: unknown) => caught,
    );
    assert.ok(error instanceof LeaseReadOnlyError, `got ${String(error)}`);
    assert.equal(error.code, 'read_only');
    assert.match(error.message, /hot standby/);
    assert.match(error.message, /connect to the primary/);
    assert.equal((await client.inspect('hot/held'))?.owner, 'worker-a');
    assert.deepEqual(
      (await client.list({ all: true })).map((lease) => lease.key),
      ['hot/free', 'hot/held'],
    );
    await assert.rejects(client.purge({ olderThan: '0s' }), LeaseReadOnlyError);
  });

  test('the CLI given the standby URL fails with the same explanation', async () => {
    const result = await runCli([
      'acquire',
      '--url',
      standbyUrl,
      '--key',
      'hot/new',
      '--ttl',
      '30s',
    ]);
    assert.equal(result.code, 1);
    assert.match(result.stderr, /hot standby/);
    assert.match(result.stderr, /primary/);
  });
});
