/**
 * A primary and its standby for one failover check, and the failover itself: `kill -9` of
 * the primary's postmaster and every backend, then promotion of the standby. Both are
 * durable (fsync on), as production servers are.
 */
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { PgCluster, promote, startStandby, type Standby } from 'pg-lease-testing';
import { DURABLE_SETTINGS } from '../failure/support/sessions.js';

export const DATABASE = 'leases';

export interface Pair extends AsyncDisposable {
  primary: PgCluster;
  standby: Standby;
  /** The leases database on the primary, then (after {@link failOver}) on the promoted standby. */
  url(): string;
  /** Kill -9 of the primary, then promotion of the standby; url() names the new primary. */
  failOver(): Promise<void>;
}

export interface PairOptions {
  synchronous: boolean;
  /** Extra extension scripts for the server (`ClusterOptions.extraExtensionFiles`). */
  extraExtensionFiles?: string[];
  /** `CREATE EXTENSION pg_lease VERSION ...`; default: the default version. */
  extensionVersion?: string;
}

export async function startPair(options: PairOptions): Promise<Pair> {
  const primary = await PgCluster.start({
    settings: { ...DURABLE_SETTINGS },
    ...(options.extraExtensionFiles ? { extraExtensionFiles: options.extraExtensionFiles } : {}),
  });
  try {
    await primary.createDatabase(DATABASE, { extension: false });
    await primary.query(
      options.extensionVersion
        ? `CREATE EXTENSION pg_lease VERSION '${options.extensionVersion}'`
        : 'CREATE EXTENSION pg_lease',
      [],
      DATABASE,
    );
    const standby = await startStandby(primary, { synchronous: options.synchronous });
    let current: PgCluster = primary;
    return {
      primary,
      standby,
      url: () => current.url(DATABASE),
      failOver: async () => {
        await primary.crash();
        if (!standby.cluster.running) await standby.cluster.start();
        await promote(standby.cluster);
        current = standby.cluster;
      },
      [Symbol.asyncDispose]: async () => {
        await standby.cluster.destroy();
        await primary.destroy();
      },
    };
  } catch (error) {
    await primary.destroy();
    throw error;
  }
}

/** Waits until the backend waits for a synchronous standby to confirm its commit. */
export async function waitUntilWaitingForStandby(primary: PgCluster, pid: number): Promise<void> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const { rows } = await primary.query(
      "SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'SyncRep'",
      [pid],
    );
    if (rows.length === 1) return;
    if (Date.now() > deadline)
      assert.fail(`backend ${pid} never waited for the synchronous standby (wait_event SyncRep)`);
    await sleep(25);
  }
}

/** Tracks whether a promise has settled, without awaiting it. */
export function track<T>(promise: Promise<T>): { promise: Promise<T>; settled: () => boolean } {
  let done = false;
  promise.then(
    () => (done = true),
    () => (done = true),
  );
  return { promise, settled: () => done };
}
