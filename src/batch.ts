/**
 * Many leases per statement: `LeaseClient.acquireMany`; the coalescers that turn calls made at
 * the same moment into lease.acquire_many, lease.renew_many and lease.release_many statements
 * (the shared keep-alive's renewals always; the caller's own calls with the client's `coalesce`
 * option).
 *
 * A batch statement answers every key as the single call would; what a handle does with the
 * answer is unchanged, so a key that comes back `not_owner`, `lapsed` or `epoch_mismatch` loses
 * only its own handle.
 */
import { performance } from 'node:perf_hooks';
import type { LeaseStatus, RenewCall } from './lease.js';
import { dateFromMs, MAX_BATCH_KEYS, msFromUs, STATEMENTS, type Statement } from './statements.js';

/** Runs one statement of the client (named or not, outside transactions). @internal */
export type RunStatement = <R extends object>(
  key: string,
  statement: Statement,
  values: unknown[],
) => Promise<R[]>;

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

/** lease.acquire_many for one owner and ttl: one statement, at most 10000 keys. @internal */
export async function acquireMany(
  run: RunStatement,
  keys: readonly string[],
  owner: string,
  ttlMicroseconds: number,
): Promise<AcquiredRow[]> {
  const sentAt = performance.now();
  const result = await run<{
    key: string;
    acquired: boolean;
    epoch: string | null;
    expires_ms: number | null;
    remaining_us: number | null;
  }>(keys[0]!, STATEMENTS.acquireMany, [keys, owner, ttlMicroseconds]);
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

/** One call waiting in a {@link Coalescer}. */
interface Pending<I, R> {
  item: I;
  resolve(result: R): void;
  reject(error: unknown): void;
}

/**
 * Sends calls singly or batched. Calls queue up while a hold is open, or, in `always` mode, until
 * the next turn of the event loop (setImmediate): every call made in the same tick shares the
 * flush. A flush groups them (`groupOf`: owner and ttl), at most 10000 per statement and each key
 * at most once per statement (two handles of one grant can renew together; a batch must not name
 * a key twice), and sends a group of one as the single call. Without a hold and outside `always`
 * mode a call is sent at once, so it never waits for company. A batch that fails rejects every
 * call in it with that error. @internal
 */
export class Coalescer<I extends { key: string }, R> {
  #holds = 0;
  #scheduled = false;
  #queue: Pending<I, R>[] = [];

  constructor(
    private readonly groupOf: (item: I) => string,
    private readonly sendOne: (item: I) => Promise<R>,
    private readonly sendMany: (items: I[]) => Promise<R[]>,
    private readonly always = false,
  ) {}

  /** Opens a hold; the returned function closes it (once). */
  hold(): () => void {
    this.#holds++;
    let open = true;
    return () => {
      if (!open) return;
      open = false;
      if (--this.#holds === 0 && !this.#scheduled) this.#flush();
    };
  }

  submit(item: I): Promise<R> {
    if (this.#holds === 0 && !this.always) return this.sendOne(item);
    const promise = new Promise<R>((resolve, reject) =>
      this.#queue.push({ item, resolve, reject }),
    );
    if (this.#holds === 0 && !this.#scheduled) {
      this.#scheduled = true;
      setImmediate(() => {
        this.#scheduled = false;
        if (this.#holds === 0) this.#flush();
      });
    }
    return promise;
  }

  #flush(): void {
    const queue = this.#queue;
    this.#queue = [];
    for (const chunk of this.#chunks(queue)) {
      if (chunk.length === 1) {
        const [one] = chunk as [Pending<I, R>];
        this.sendOne(one.item).then(one.resolve, one.reject);
        continue;
      }
      this.sendMany(chunk.map((p) => p.item)).then(
        (results) => chunk.forEach((pending, i) => pending.resolve(results[i]!)),
        (error: unknown) => {
          for (const pending of chunk) pending.reject(error);
        },
      );
    }
  }

  #chunks(queue: Pending<I, R>[]): Pending<I, R>[][] {
    const groups = new Map<string, { chunk: Pending<I, R>[]; keys: Set<string> }[]>();
    for (const pending of queue) {
      const id = this.groupOf(pending.item);
      let list = groups.get(id);
      if (!list) groups.set(id, (list = []));
      let target = list.find(
        (c) => c.chunk.length < MAX_BATCH_KEYS && !c.keys.has(pending.item.key),
      );
      if (!target) list.push((target = { chunk: [], keys: new Set() }));
      target.chunk.push(pending);
      target.keys.add(pending.item.key);
    }
    return [...groups.values()].flat().map((c) => c.chunk);
  }
}

/** A renew as the coalescer carries it. @internal */
export interface RenewItem {
  key: string;
  owner: string;
  epoch: bigint;
  ttlMicroseconds: number;
}

/** lease.renew_many for renews of one owner and ttl; one RenewCall per item, in order. @internal */
export async function renewMany(run: RunStatement, items: RenewItem[]): Promise<RenewCall[]> {
  const { owner, ttlMicroseconds } = items[0]!;
  const sentAt = performance.now();
  const rows = await run<{
    key: string;
    status: LeaseStatus;
    expires_ms: number | null;
    remaining_us: number | null;
  }>(items[0]!.key, STATEMENTS.renewMany, [
    items.map((p) => p.key),
    owner,
    items.map((p) => p.epoch.toString()),
    ttlMicroseconds,
  ]);
  // One row per key, in input order.
  const remainingMs = leastRemainingMs(rows);
  return rows.map((row) => ({
    status: row.status,
    expiresAt: dateFromMs(row.expires_ms),
    sentAt,
    remainingMs: row.remaining_us === null ? null : remainingMs,
  }));
}

/** A release as the coalescer carries it. @internal */
export interface ReleaseItem {
  key: string;
  owner: string;
  epoch: bigint;
}

/** lease.release_many for releases of one owner; one status per item, in order. @internal */
export async function releaseMany(run: RunStatement, items: ReleaseItem[]): Promise<LeaseStatus[]> {
  const rows = await run<{ status: LeaseStatus }>(items[0]!.key, STATEMENTS.releaseMany, [
    items.map((p) => p.key),
    items[0]!.owner,
    items.map((p) => p.epoch.toString()),
  ]);
  return rows.map((row) => row.status);
}

/** An acquire with wait 0 as the coalescer carries it. @internal */
export interface AcquireItem {
  key: string;
  owner: string;
  ttlMicroseconds: number;
}

/** Groups renews and acquires by owner and ttl, releases by owner. @internal */
export const byOwnerAndTtl = (item: { owner: string; ttlMicroseconds?: number }): string =>
  `${item.ttlMicroseconds ?? ''}\u0000${item.owner}`;
