/**
 * Failover to an asynchronous standby, the hazard made visible: the primary acknowledges a
 * commit once it is on its own disk, so a standby that lags at the moment of failure is
 * promoted without it. The acknowledged grant is gone and its epoch is granted again to
 * another owner while the first holder still believes it holds the key. The standby is
 * stopped before the grant, as a standby that lags (or is cut off) would be. A fenced
 * resource in the same database fails over with the leases: it lost the write made under
 * the lost grant too.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { waitForReplay } from 'pg-lease-testing';
import { acquireTimed as acquire, inspect, renew } from '../support/lease-calls.js';
import { connect, disconnect } from '../failure/support/sessions.js';
import { startPair } from './support.js';

const FENCED_WRITE = `UPDATE report SET body = $1, fenced_epoch = $2
                       WHERE id = 1 AND fenced_epoch <= $2`;

describe('failover to an asynchronous standby', () => {
  test('an acknowledged grant the standby had not received is lost in promotion and its epoch is granted again', async () => {
    await using pair = await startPair({ synchronous: false });
    let db = await connect(pair.url());
    await db.query('CREATE TABLE report (id int PRIMARY KEY, body text, fenced_epoch bigint)');
    await db.query("INSERT INTO report VALUES (1, '', 0)");
    const replayed = await acquire(db, 'async/replayed', 'worker-a', '60 seconds');
    await waitForReplay(pair.standby);

    await pair.standby.cluster.stop();
    const lost = await acquire(db, 'async/lost', 'worker-a', '60 seconds');
    assert.deepEqual([lost.acquired, lost.epoch], [true, 1n]);
    assert.equal((await db.query(FENCED_WRITE, ['by worker-a', lost.epoch])).rowCount, 1);
    const renewed = await renew(db, 'async/replayed', 'worker-a', replayed.epoch!, '90 seconds');
    assert.equal(renewed.status, 'ok');
    await disconnect(db);

    await pair.failOver();
    db = await connect(pair.url());
    try {
      // What the standby had stands; what the primary acknowledged after that is gone.
      assert.equal((await inspect(db, 'async/replayed'))?.expiresAt, replayed.expiresAt);
      assert.equal(await inspect(db, 'async/lost'), undefined);
      // worker-a's grant runs for another minute by the old primary's word, yet:
      const again = await acquire(db, 'async/lost', 'worker-b', '60 seconds');
      assert.deepEqual([again.acquired, again.epoch], [true, 1n], 'epoch 1 granted a second time');
      assert.ok(again.grantedAt! < lost.expiresAt!, 'while the first grant was still live');
      // The guard in the same database lost worker-a's write with the grant, so it accepts
      // worker-b; a guard elsewhere that saw worker-a's epoch 1 could not tell them apart.
      const { rows } = await db.query('SELECT body, fenced_epoch::int AS epoch FROM report');
      assert.deepEqual(rows, [{ body: '', epoch: 0 }]);
      assert.equal((await db.query(FENCED_WRITE, ['by worker-b', again.epoch])).rowCount, 1);
    } finally {
      await disconnect(db);
    }
  });
});
