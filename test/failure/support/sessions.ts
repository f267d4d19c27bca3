/**
 * Sessions, servers and what the server says about them: the failure suite's view of
 * connections that die, hang or wait, and of clusters that crash.
 */
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { PgCluster } from 'pg-lease-testing';
import { waitFor } from '../../support/helpers.js';
import { serverNow, type Queryable } from '../../support/lease-calls.js';

/** Settings for the clusters of durability checks: every commit really reaches the disk. */
export const DURABLE_SETTINGS = {
  fsync: 'on',
  full_page_writes: 'on',
  synchronous_commit: 'on',
} as const;

/** A throwaway cluster that is durable like a production server (fsync on). */
export async function startDurableCluster(): Promise<PgCluster> {
  return PgCluster.start({ settings: { ...DURABLE_SETTINGS } });
}

/**
 * A connected client whose connection may die under it (crash, terminate, shutdown):
 * connection errors surface on its next query instead of as an unhandled 'error' event.
 */
export async function connect(
  url: string,
  applicationName = 'pg-lease-failure',
): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: url, application_name: applicationName });
  client.on('error', () => undefined);
  await client.connect();
  return client;
}

/** Ends a client whose server may be gone; never throws. */
export async function disconnect(...clients: (pg.Client | undefined)[]): Promise<void> {
  await Promise.all(clients.map((client) => client?.end().catch(() => undefined)));
}

export async function backendPid(client: Queryable): Promise<number> {
  const { rows } = await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
  return rows[0]!.pid;
}

/** What pg_stat_activity and pg_locks say about one backend. */
export interface BackendState {
  /** `undefined` when the backend is gone. */
  state: string | undefined;
  /** Whether it has a transaction id or an open transaction. */
  inTransaction: boolean;
  /** Locks it holds (granted) or waits for. */
  locks: { locktype: string; mode: string; granted: boolean; relation: string | null }[];
}

export async function backendState(admin: Queryable, pid: number): Promise<BackendState> {
  const activity = await admin.query<{ state: string | null; in_transaction: boolean }>(
    `SELECT state, (xact_start IS NOT NULL OR backend_xid IS NOT NULL) AS in_transaction
       FROM pg_stat_activity WHERE pid = $1`,
    [pid],
  );
  const locks = await admin.query<{
    locktype: string;
    mode: string;
    granted: boolean;
    relation: string | null;
  }>(
    `SELECT locktype, mode, granted, relation::regclass::text AS relation
       FROM pg_locks WHERE pid = $1 ORDER BY locktype, mode`,
    [pid],
  );
  const row = activity.rows[0];
  return {
    state: row ? (row.state ?? undefined) : undefined,
    inTransaction: row?.in_transaction ?? false,
    locks: locks.rows,
  };
}

/** Asserts the backend is idle outside any transaction and holds no lock (or is gone). */
export async function assertNothingLeftBehind(
  admin: Queryable,
  pid: number,
  { gone }: { gone: boolean },
): Promise<void> {
  // A backend that was told to stop needs a moment to finish exiting; an idle one is instant.
  let observed = await backendState(admin, pid);
  const deadline = Date.now() + 10_000;
  while (
    (gone ? observed.state !== undefined : observed.state !== 'idle') &&
    Date.now() < deadline
  ) {
    await sleep(50);
    observed = await backendState(admin, pid);
  }
  assert.deepEqual(
    observed,
    gone
      ? { state: undefined, inTransaction: false, locks: [] }
      : { state: 'idle', inTransaction: false, locks: [] },
    `backend ${pid} left something behind`,
  );
}

/** Waits until the backend is inside a blocking `lease.acquire` that has been running a while. */
export async function waitUntilWaiting(admin: Queryable, pid: number, forMs = 150): Promise<void> {
  await waitFor(`backend ${pid} waits in lease.acquire`, async () => {
    const { rows } = await admin.query(
      `SELECT 1 FROM pg_stat_activity
        WHERE pid = $1 AND state = 'active' AND query LIKE '%lease.acquire%'
          AND clock_timestamp() - query_start > $2 * interval '1 millisecond'`,
      [pid, forMs],
    );
    return rows.length === 1;
  });
}

/** Waits until pg_stat_activity no longer lists the backend. */
export async function waitUntilBackendGone(admin: Queryable, pid: number): Promise<void> {
  await waitFor(`backend ${pid} exits`, async () => {
    const { rows } = await admin.query('SELECT 1 FROM pg_stat_activity WHERE pid = $1', [pid]);
    return rows.length === 0;
  });
}

/** Sleeps until the server's clock has passed `targetUs` (plus `marginMs`). */
export async function sleepUntilServerTime(
  db: Queryable,
  targetUs: bigint,
  marginMs = 50,
): Promise<void> {
  for (;;) {
    const remainingMs = Number(targetUs - (await serverNow(db))) / 1000;
    if (remainingMs < 0) break;
    await sleep(remainingMs + marginMs);
  }
}

/**
 * Sleeps until `us` (microseconds since the Unix epoch) has passed, by the local clock. Meant
 * for downtime, when the server's clock cannot be asked: the throwaway server runs on this
 * machine, so its clock is this clock.
 */
export async function sleepPastWhileDown(us: bigint, marginMs = 200): Promise<void> {
  const remainingMs = Number(us / 1000n) - Date.now();
  await sleep(Math.max(0, remainingMs) + marginMs);
}

/** Asserts that the promise rejects with a server error of this SQLSTATE; returns the error. */
export async function rejectsWithCode(
  promise: Promise<unknown>,
  code: string,
  message?: RegExp,
): Promise<Error & { code?: string }> {
  try {
    await promise;
  } catch (error) {
    const failure = error as Error & { code?: string };
    assert.equal(failure.code, code, `expected SQLSTATE ${code}, got: ${failure.message}`);
    if (message) assert.match(failure.message, message);
    return failure;
  }
  assert.fail(`expected an error with SQLSTATE ${code}`);
}

/** Asserts that the promise rejects at all (e.g. a connection killed under a query). */
export async function rejectsSomehow(promise: Promise<unknown>): Promise<Error> {
  try {
    await promise;
  } catch (error) {
    return error as Error;
  }
  assert.fail('expected the call to fail');
}
