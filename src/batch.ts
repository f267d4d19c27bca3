/**
 * Many leases per statement: `LeaseClient.acquireMany`, and the renew batcher that the shared
 * keep-alive sends its renewals through (lease.acquire_many, lease.renew_many).
 *
 * A batch statement answers every key as the single call would; what a handle does with the
 * answer is unchanged, so a key that comes back `not_owner`, `lapsed` or `epoch_mismatch` loses
 * only its own handle.
 */
import { performance } from 'node:perf_hooks';
import type { LeaseStatus, RenewCall } from './lease.js';
import { MAX_BATCH_KEYS, STATEMENTS, type Statement } from './statements.js';

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

/** lease.acquire_many for one owner and ttl, in chunks of at most 10000 keys. @internal */
export async function acquireMany(
  run: RunStatement,
  keys: readonly string[],
  owner: string,
  ttlMicroseconds: number,
): Promise<AcquiredRow[]> {
  const rows: AcquiredRow[] = [];
  for (let start = 0; start < keys.length; start += MAX_BATCH_KEYS) {
    const chunk = keys.slice(start, start + MAX_BATCH_KEYS);
    const sentAt = performance.now();
    const result = await run<{
      key: string;
      acquired: boolean;
      epoch: string | null;
      expires_at: Date | null;
      remaining_us: number | null;
    }>(chunk[0]!, STATEMENTS.acquireMany, [chunk, owner, ttlMicroseconds]);
    for (const row of result)
      rows.push({
        key: row.key,
        acquired: row.acquired,
        epoch: row.epoch === null ? null : BigInt(row.epoch),
        expiresAt: row.expires_at,
        sentAt,
        remainingMs: row.remaining_us === null ? null : row.remaining_us / 1000,
      });
  }
  return rows;
}

interface PendingRenew {
  key: string;
  owner: string;
  epoch: bigint;
  ttlMicroseconds: number;
  resolve(call: RenewCall): void;
  reject(error: unknown): void;
}

/**
 * Renews, singly or batched. While at least one hold is open, renews queue up; when the last
 * hold closes they go out as one lease.renew_many per owner and ttl (chunks of at most 10000
 * distinct keys), or as the single call when a group has one key. Without a hold a renew is sent
 * at once, so a lone call never waits for company. @internal
 */
export class RenewBatcher {
  readonly #run: RunStatement;
  readonly #single: (key: string, owner: string, epoch: bigint, ttl: number) => Promise<RenewCall>;
  #holds = 0;
  #queue: PendingRenew[] = [];

  constructor(
    run: RunStatement,
    single: (key: string, owner: string, epoch: bigint, ttl: number) => Promise<RenewCall>,
  ) {
    this.#run = run;
    this.#single = single;
  }

  /** Opens a hold; the returned function closes it (once). */
  hold(): () => void {
    this.#holds++;
    let open = true;
    return () => {
      if (!open) return;
      open = false;
      if (--this.#holds === 0) this.#flush();
    };
  }

  renew(key: string, owner: string, epoch: bigint, ttlMicroseconds: number): Promise<RenewCall> {
    if (this.#holds === 0) return this.#single(key, owner, epoch, ttlMicroseconds);
    return new Promise((resolve, reject) =>
      this.#queue.push({ key, owner, epoch, ttlMicroseconds, resolve, reject }),
    );
  }

  #flush(): void {
    const queue = this.#queue;
    this.#queue = [];
    for (const chunk of chunks(queue)) {
      if (chunk.length === 1) {
        const [one] = chunk as [PendingRenew];
        this.#single(one.key, one.owner, one.epoch, one.ttlMicroseconds).then(
          one.resolve,
          one.reject,
        );
      } else {
        this.#sendBatch(chunk).catch((error: unknown) => {
          for (const pending of chunk) pending.reject(error);
        });
      }
    }
  }

  async #sendBatch(chunk: PendingRenew[]): Promise<void> {
    const { owner, ttlMicroseconds } = chunk[0]!;
    const sentAt = performance.now();
    const rows = await this.#run<{
      key: string;
      status: LeaseStatus;
      expires_at: Date | null;
      remaining_us: number | null;
    }>(chunk[0]!.key, STATEMENTS.renewMany, [
      chunk.map((p) => p.key),
      owner,
      chunk.map((p) => p.epoch.toString()),
      ttlMicroseconds,
    ]);
    // One row per key, in input order.
    rows.forEach((row, i) =>
      chunk[i]!.resolve({
        status: row.status,
        expiresAt: row.expires_at,
        sentAt,
        remainingMs: row.remaining_us === null ? null : row.remaining_us / 1000,
      }),
    );
  }
}

/**
 * Groups renews by owner and ttl, at most 10000 per group, each key at most once per group (two
 * handles of one grant can renew together, and a batch must not name a key twice).
 */
function chunks(queue: PendingRenew[]): PendingRenew[][] {
  const groups = new Map<string, { chunk: PendingRenew[]; keys: Set<string> }[]>();
  for (const pending of queue) {
    const id = `${pending.ttlMicroseconds}\u0000${pending.owner}`;
    let list = groups.get(id);
    if (!list) groups.set(id, (list = []));
    let target = list.find((c) => c.chunk.length < MAX_BATCH_KEYS && !c.keys.has(pending.key));
    if (!target) list.push((target = { chunk: [], keys: new Set() }));
    target.chunk.push(pending);
    target.keys.add(pending.key);
  }
  return [...groups.values()].flat().map((c) => c.chunk);
}
