/**
 * The harness's standbys: a base backup made with the server alone streams, replays, can be
 * made synchronous, crashed and promoted.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  PgCluster,
  promote,
  setSynchronousStandbys,
  startStandby,
  waitForReplay,
  waitForStreaming,
} from 'pg-lease-testing';
import { waitFor } from '../support/helpers.js';

test('a standby made from a low-level base backup replays the primary and is read-only until promoted', async () => {
  await using primary = await PgCluster.start();
  const url = await primary.createDatabase('app');
  await primary.query('CREATE TABLE t (n int)', [], 'app');
  await primary.query('INSERT INTO t VALUES (1)', [], 'app');
  await using standby = await startStandby(primary);
  assert.ok(url);

  await primary.query('INSERT INTO t VALUES (2)', [], 'app');
  await waitForReplay(standby);
  const { rows } = await standby.cluster.query<{ n: number }>(
    'SELECT n FROM t ORDER BY n',
    [],
    'app',
  );
  assert.deepEqual(
    rows.map((r) => r.n),
    [1, 2],
  );
  await assert.rejects(standby.cluster.query('INSERT INTO t VALUES (3)', [], 'app'), {
    code: '25006',
  });
  assert.equal((await standby.cluster.query('SELECT pg_is_in_recovery() AS r')).rows[0]!.r, true);

  await primary.crash();
  await promote(standby.cluster);
  await standby.cluster.query('INSERT INTO t VALUES (3)', [], 'app');
  const after = await standby.cluster.query<{ n: number }>('SELECT n FROM t ORDER BY n', [], 'app');
  assert.deepEqual(
    after.rows.map((r) => r.n),
    [1, 2, 3],
  );
});

test('a synchronous standby is reported sync, and commits wait for it while it is down', async () => {
  await using primary = await PgCluster.start();
  await using standby = await startStandby(primary, { synchronous: true });
  const { rows } = await primary.query<{ sync_state: string }>(
    'SELECT sync_state FROM pg_stat_replication WHERE application_name = $1',
    [standby.name],
  );
  assert.equal(rows[0]!.sync_state, 'sync');
  await standby.cluster.stop();
  const pending = primary.query('CREATE TABLE waits (n int)');
  let settled = false;
  pending.then(
    () => (settled = true),
    () => (settled = true),
  );
  await waitFor('the commit waits for the standby', async () => {
    const waiting = await primary.query(
      "SELECT 1 FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND query LIKE 'CREATE TABLE waits%'",
    );
    return waiting.rows.length === 1;
  });
  assert.equal(settled, false, 'the commit must wait for the synchronous standby');
  await standby.cluster.start();
  await pending;

  // Without a synchronous standby named, commits no longer wait for the stopped one.
  await setSynchronousStandbys(primary, []);
  await standby.cluster.stop();
  await primary.query('CREATE TABLE goes_through (n int)');
});

test('a crashed standby recovers, streams again and catches up', async () => {
  await using primary = await PgCluster.start();
  await primary.createDatabase('app', { extension: false });
  await primary.query('CREATE TABLE t (n int)', [], 'app');
  await using standby = await startStandby(primary);
  await standby.cluster.crash();
  await primary.query('INSERT INTO t SELECT generate_series(1, 1000)', [], 'app');
  await standby.cluster.start();
  await waitForStreaming(standby);
  await waitForReplay(standby);
  const { rows } = await standby.cluster.query<{ n: number }>(
    'SELECT count(*)::int AS n FROM t',
    [],
    'app',
  );
  assert.equal(rows[0]!.n, 1000);
});
