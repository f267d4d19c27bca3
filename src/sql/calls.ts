/**
 * The client's statements, one typed function each: what it sends and how its answer is
 * decoded (epochs as bigints, expiries as Dates from milliseconds, time left in milliseconds
 * with the send time it counts from). Everything goes through the {@link Wire}.
 */
import { performance } from 'node:perf_hooks';
import type { LostStatus } from '../errors.js';
import type pg from 'pg';
import {
  dateFromMs,
  EXPIRES_MS,
  msFromUs,
  REMAINING_US,
  STATEMENTS,
  type Statement,
} from './statements.js';
import type { Wire } from './wire.js';

/** A pool or a connection: what a statement sent as it comes runs on. */
type Queryable = pg.Pool | pg.ClientBase;

/**
 * The answer of `lease.renew` and `lease.release`: `ok`, or why not, checked in this order:
 * `not_owner` (no grant, a free key, or another owner), `lapsed` (the caller's grant expired),
 * `epoch_mismatch` (the caller holds the key under another epoch).
 *
 * @example
 * import type { LeaseStatus } from 'pg-lease';
 * const stillMine = (status: LeaseStatus) => status === 'ok';
 */
export type LeaseStatus = 'ok' | Exclude<LostStatus, 'expired'>;

/** One renew as sent and answered; what the handle needs to move its deadline. @internal */
export interface RenewCall {
  status: LeaseStatus;
  expiresAt: Date | null;
  /** Monotonic time (performance.now()) just before the call was sent. */
  sentAt: number;
  /** Time left on the grant as the server measured it while answering, in milliseconds. */
  remainingMs: number | null;
}

/** What a denied attempt should also do: watch the key (mark it) or only inspect it. @internal */
export type Follow = { watchMicroseconds: number } | { inspect: true };

/** What the server said about the key after a denied attempt. @internal */
export interface HolderState {
  /** The key has a row (was ever granted). */
  found: boolean;
  held: boolean;
  /**
   * A release will notify: the key is marked (`lease.watch`). False when another transaction
   * had the row locked (a fenced one, say), so the waiter polls until the mark stands.
   */
  notifies: boolean;
  /**
   * Held by many: shared grants (the key's shared phase, §13) or a counted key's permits. An
   * exclusive waiter then waits in the server, where it holds new shared grants off.
   */
  many: boolean;
  /** Time left on the holder's grant as the server measured it, in milliseconds. */
  remainingMs: number | null;
  /**
   * For a key held by many: the time left on its earliest grant, where a place comes free
   * (`remainingMs` is the latest's), as read before the attempt (see ACQUIRE_FOLLOWING in
   * statements.ts). Otherwise the holder's, as `remainingMs`.
   */
  earliestMs: number | null;
}

/** One key's row of lease.acquire_many, with the send time its deadline starts from. @internal */
export interface AcquiredRow {
  key: string;
  acquired: boolean;
  epoch: bigint | null;
  expiresAt: Date | null;
  /** Monotonic time just before the statement was sent. */
  sentAt: number;
  remainingMs: number | null;
}

/**
 * What an acquire asks for (SEMANTICS §13): `exclusive` is lease.acquire as it always was (on a
 * counted key it grants a permit); `permit` is the same call for a key known to be counted, whose
 * waiter never waits in the server (wait.ts); `shared` is lease.acquire_shared.
 * @internal
 */
export type AcquireMode = 'exclusive' | 'permit' | 'shared';

const EXCLUSIVE_STATEMENTS = {
  plain: STATEMENTS.acquire,
  watching: STATEMENTS.acquireWatching,
  inspecting: STATEMENTS.acquireInspecting,
};

const ACQUIRE_STATEMENTS: Record<AcquireMode, typeof EXCLUSIVE_STATEMENTS> = {
  exclusive: EXCLUSIVE_STATEMENTS,
  permit: EXCLUSIVE_STATEMENTS,
  shared: {
    plain: STATEMENTS.acquireShared,
    watching: STATEMENTS.acquireSharedWatching,
    inspecting: STATEMENTS.acquireSharedInspecting,
  },
};

/** The columns every single acquire statement returns (ACQUIRE in statements.ts). */
interface AcquireColumns {
  acquired: boolean;
  epoch: string | null;
  expires_ms: number | null;
  remaining_us: number | null;
}

/** One acquire's answer, sent at `sentAt`, as the handle is made from it. */
function acquiredRow(key: string, row: AcquireColumns, sentAt: number): AcquiredRow {
  return {
    key,
    acquired: row.acquired,
    epoch: row.epoch === null ? null : BigInt(row.epoch),
    expiresAt: dateFromMs(row.expires_ms),
    sentAt,
    remainingMs: msFromUs(row.remaining_us),
  };
}

/** One non-blocking acquire; with `follow`, the holder's state after a denied attempt. @internal */
export async function acquireOne(
  wire: Wire,
  key: string,
  owner: string,
  ttlMicroseconds: number,
  follow?: Follow,
  signal?: AbortSignal,
  mode: AcquireMode = 'exclusive',
): Promise<AcquiredRow & { holder?: HolderState }> {
  const statements = ACQUIRE_STATEMENTS[mode];
  const [statement, values]: [Statement, unknown[]] =
    follow === undefined
      ? [statements.plain, [key, owner, ttlMicroseconds]]
      : 'watchMicroseconds' in follow
        ? [statements.watching, [key, owner, ttlMicroseconds, follow.watchMicroseconds]]
        : [statements.inspecting, [key, owner, ttlMicroseconds]];
  const sentAt = performance.now();
  const rows = await wire.query<
    AcquireColumns & {
      holder?: {
        held: boolean;
        notifies: boolean;
        many: boolean;
        remaining_us: number | null;
        earliest_us: number | null;
      } | null;
    }
  >(key, statement, values, signal);
  const row = rows[0]!;
  const answer = acquiredRow(key, row, sentAt);
  if (follow === undefined || row.acquired) return answer;
  return {
    ...answer,
    holder: {
      found: row.holder != null,
      held: row.holder?.held === true,
      notifies: row.holder?.notifies === true,
      many: row.holder?.many === true,
      remainingMs: msFromUs(row.holder?.remaining_us),
      earliestMs: msFromUs(row.holder?.earliest_us),
    },
  };
}

/**
 * An exclusive acquire that waits in the server for up to `waitMicroseconds` (lease.acquire
 * with `wait`), cancelled on the server when `signal` aborts. While the key is in its shared
 * phase the server marks it for the statement's transaction: no new shared grant meanwhile
 * (SEMANTICS §13). Rejects with LeaseTimeoutError when the server's wait runs out. @internal
 */
export async function acquireWaiting(
  wire: Wire,
  key: string,
  owner: string,
  ttlMicroseconds: number,
  waitMicroseconds: number,
  signal?: AbortSignal,
): Promise<AcquiredRow> {
  const sentAt = performance.now();
  const rows = await wire.query<AcquireColumns>(
    key,
    STATEMENTS.acquireWaiting,
    [key, owner, ttlMicroseconds, waitMicroseconds],
    signal,
  );
  return acquiredRow(key, rows[0]!, sentAt);
}

/** lease.renew of one grant. @internal */
export async function renewOne(
  wire: Wire,
  key: string,
  owner: string,
  epoch: bigint,
  ttlMicroseconds: number,
): Promise<RenewCall> {
  const sentAt = performance.now();
  const rows = await wire.query<{
    status: LeaseStatus;
    expires_ms: number | null;
    remaining_us: number | null;
  }>(key, STATEMENTS.renew, [key, owner, epoch.toString(), ttlMicroseconds]);
  const row = rows[0]!;
  return {
    status: row.status,
    expiresAt: dateFromMs(row.expires_ms),
    sentAt,
    remainingMs: msFromUs(row.remaining_us),
  };
}

/** lease.release of one grant. @internal */
export async function releaseOne(
  wire: Wire,
  key: string,
  owner: string,
  epoch: bigint,
): Promise<LeaseStatus> {
  const rows = await wire.query<{ status: LeaseStatus }>(key, STATEMENTS.release, [
    key,
    owner,
    epoch.toString(),
  ]);
  return rows[0]!.status;
}

/**
 * The grant's time left measured from a fresh send, if `owner` still holds `epoch`: the send
 * time and the server's measure, as the handle's deadline rule takes them. Best effort:
 * `undefined` when it cannot tell. @internal
 */
export async function measureRemaining(
  wire: Wire,
  key: string,
  owner: string,
  epoch: bigint,
): Promise<{ sentAt: number; remainingMs: number } | undefined> {
  const sentAt = performance.now();
  try {
    const rows = await wire.query<{
      owner: string | null;
      epoch: string;
      remaining_us: number | null;
    }>(key, STATEMENTS.measureDeadline, [key, owner, epoch.toString()]);
    const row = rows[0];
    if (row && row.owner === owner && BigInt(row.epoch) === epoch)
      return { sentAt, remainingMs: row.remaining_us! / 1000 };
  } catch {
    // keep the deadline measured from the acquire
  }
  return undefined;
}

/** A key's state as lease.inspect reports it; undefined for a key never granted. @internal */
export async function inspectOne(
  wire: Wire,
  key: string,
): Promise<
  { held: boolean; owner: string | null; epoch: bigint; expiresAt: Date | null } | undefined
> {
  const rows = await wire.query<{
    held: boolean;
    owner: string | null;
    epoch: string;
    expires_at: Date | null;
  }>(key, STATEMENTS.inspect, [key]);
  const row = rows[0];
  if (!row) return undefined;
  return { held: row.held, owner: row.owner, epoch: BigInt(row.epoch), expiresAt: row.expires_at };
}

/**
 * lease.set_limit: makes `key` counted with `limit` permits (or exclusive again, `null`);
 * resolves with the key's limit and how many of its permits are live. @internal
 */
export async function setLimit(
  wire: Wire,
  key: string,
  limit: number | null,
): Promise<{ limit: number | null; holders: number }> {
  const rows = await wire.query<{ permit_limit: number | null; holders: number }>(
    key,
    STATEMENTS.setLimit,
    [key, limit],
  );
  const row = rows[0]!;
  return { limit: row.permit_limit, holders: row.holders };
}

/** One live grant of a key as lease.holders reports it. @internal */
export interface HolderRow {
  owner: string;
  epoch: bigint;
  expiresAt: Date;
  /** Time left as the server measured it while answering, in milliseconds, never below 0. */
  remainingMs: number;
}

/** lease.holders: every live grant of `key`, in epoch order. @internal */
export async function holdersOf(wire: Wire, key: string): Promise<HolderRow[]> {
  const rows = await wire.query<{
    owner: string;
    epoch: string;
    expires_ms: number;
    remaining_us: number;
  }>(key, STATEMENTS.holders, [key]);
  return rows.map((row) => ({
    owner: row.owner,
    epoch: BigInt(row.epoch),
    expiresAt: dateFromMs(row.expires_ms)!,
    remainingMs: Math.max(0, row.remaining_us / 1000),
  }));
}

/** An acquire with wait 0 as a batch statement takes it. @internal */
export interface AcquireItem {
  key: string;
  owner: string;
  ttlMicroseconds: number;
}

/** lease.acquire_many for one owner and ttl: one statement, at most 10000 keys. @internal */
export async function acquireMany(
  wire: Wire,
  keys: readonly string[],
  owner: string,
  ttlMicroseconds: number,
): Promise<AcquiredRow[]> {
  const sentAt = performance.now();
  const result = await wire.query<AcquireColumns & { key: string }>(
    keys[0]!,
    STATEMENTS.acquireMany,
    [keys, owner, ttlMicroseconds],
  );
  const remainingMs = leastRemainingMs(result);
  return result.map((row) => ({
    key: row.key,
    acquired: row.acquired,
    epoch: row.epoch === null ? null : BigInt(row.epoch),
    expiresAt: dateFromMs(row.expires_ms),
    sentAt,
    remainingMs: row.remaining_us === null ? null : remainingMs,
  }));
}

/**
 * The time left of the grant that has least of it among one batch statement's rows. The server
 * grants the keys of a batch one after the other, each at its own clock reading, so their
 * expiries lie a little apart; every handle of the statement counts from the earliest, which
 * never claims more than the server granted, and keeps the handles on one keep-alive tick.
 */
function leastRemainingMs(rows: readonly { remaining_us: number | null }[]): number | null {
  let least: number | null = null;
  for (const row of rows) {
    if (row.remaining_us !== null && (least === null || row.remaining_us < least))
      least = row.remaining_us;
  }
  return msFromUs(least);
}

/** A renew as a batch statement takes it. @internal */
export interface RenewItem {
  key: string;
  owner: string;
  epoch: bigint;
  ttlMicroseconds: number;
}

/** One key's row of renew_many; `locked` only where the statement skips locked rows. */
interface RenewedRow<S extends string> {
  key: string;
  status: S;
  expires_ms: number | null;
  remaining_us: number | null;
}

/** One renew_many statement for renews of one owner and ttl: its rows, and its send time. */
async function renewManyRows<S extends string>(
  wire: Wire,
  statement: Statement,
  items: RenewItem[],
): Promise<{ rows: RenewedRow<S>[]; sentAt: number; remainingMs: number | null }> {
  const { owner, ttlMicroseconds } = items[0]!;
  const sentAt = performance.now();
  const rows = await wire.query<RenewedRow<S>>(items[0]!.key, statement, [
    items.map((p) => p.key),
    owner,
    items.map((p) => p.epoch.toString()),
    ttlMicroseconds,
  ]);
  // One row per key, in input order.
  return { rows, sentAt, remainingMs: leastRemainingMs(rows) };
}

/** lease.renew_many for renews of one owner and ttl; one RenewCall per item, in order. @internal */
export async function renewMany(wire: Wire, items: RenewItem[]): Promise<RenewCall[]> {
  const { rows, sentAt, remainingMs } = await renewManyRows<LeaseStatus>(
    wire,
    STATEMENTS.renewMany,
    items,
  );
  return rows.map((row) => ({
    status: row.status,
    expiresAt: dateFromMs(row.expires_ms),
    sentAt,
    remainingMs: row.remaining_us === null ? null : remainingMs,
  }));
}

/**
 * lease.renew_many with skip_locked for renews of one owner and ttl; one RenewCall per item, in
 * order. A key whose row another transaction holds locked (the holder's own fenced transaction,
 * say) is answered `locked` with nothing changed, instead of holding up the statement, and so
 * the renewals of every other key, until that transaction ends. Such a key is renewed again on
 * its own with lease.renew, which waits for the lock on a connection of its own: its RenewCall
 * is a promise that settles when that renew does, counted from that renew's send. @internal
 */
export async function renewManySkippingLocked(
  wire: Wire,
  items: RenewItem[],
): Promise<(RenewCall | Promise<RenewCall>)[]> {
  const { rows, sentAt, remainingMs } = await renewManyRows<LeaseStatus | 'locked'>(
    wire,
    STATEMENTS.renewManySkippingLocked,
    items,
  );
  return rows.map((row, i) => {
    if (row.status === 'locked') {
      const { key, owner, epoch, ttlMicroseconds } = items[i]!;
      return renewOne(wire, key, owner, epoch, ttlMicroseconds);
    }
    return {
      status: row.status,
      expiresAt: dateFromMs(row.expires_ms),
      sentAt,
      remainingMs: row.remaining_us === null ? null : remainingMs,
    };
  });
}

/** A release as a batch statement takes it. @internal */
export interface ReleaseItem {
  key: string;
  owner: string;
  epoch: bigint;
}

/** lease.release_many for releases of one owner; one status per item, in order. @internal */
export async function releaseMany(wire: Wire, items: ReleaseItem[]): Promise<LeaseStatus[]> {
  const rows = await wire.query<{ status: LeaseStatus }>(items[0]!.key, STATEMENTS.releaseMany, [
    items.map((p) => p.key),
    items[0]!.owner,
    items.map((p) => p.epoch.toString()),
  ]);
  return rows.map((row) => row.status);
}

/** A key's state as an observer sees it: `null` for a key never granted. @internal */
export interface ObservedState {
  state: { held: boolean; owner: string | null; epoch: bigint; expiresAt: Date | null } | null;
  /** A release will notify (the key is marked by `lease.watch`); false without `watchMs`. */
  notifies: boolean;
  /** Time left on the holder's grant as the server measured it, in milliseconds. */
  remainingMs: number | null;
}

/**
 * The key's state for an observer: with `watchMs`, `lease.watch`, which also marks the key so
 * that its release notifies for that long; without, `lease.inspect`. Sent unnamed on `db` as
 * it comes, as observers always have (an observer on a dedicated connection shares it with the
 * caller's own statements). @internal
 */
export async function observeState(
  db: Queryable,
  key: string,
  watchMs: number | undefined,
): Promise<ObservedState> {
  const call =
    watchMs === undefined
      ? 'lease.inspect($1)'
      : `lease.watch($1, ${watchMs} * interval '1 millisecond')`;
  const { rows } = await db.query<{
    held: boolean;
    owner: string | null;
    epoch: string;
    expires_ms: number | null;
    notifies: boolean;
    remaining_us: number | null;
  }>(
    `SELECT i.held, i.owner, i.epoch::text AS epoch, ${EXPIRES_MS('i')}, ${watchMs === undefined ? 'false AS notifies' : 'i.notifies'},
            ${REMAINING_US('i')} AS remaining_us
       FROM ${call} AS i`,
    [key],
  );
  const row = rows[0];
  if (!row) return { state: null, notifies: false, remainingMs: null };
  return {
    state: {
      held: row.held,
      owner: row.owner,
      epoch: BigInt(row.epoch),
      expiresAt: dateFromMs(row.expires_ms),
    },
    notifies: row.notifies,
    remainingMs: msFromUs(row.remaining_us),
  };
}

/** Notifies everyone listening on `channel` for `key` (pg_notify). @internal */
export async function notify(db: Queryable, channel: string, key: string): Promise<void> {
  await db.query('SELECT pg_catalog.pg_notify($1, $2)', [channel, key]);
}
