/**
 * The session: one client's way to the server. It owns the connection (the pool the client
 * made from a connection string, or the pool or connection it was given), the {@link Wire}
 * the calls go through, the coalescers that put calls of one moment into one batch statement,
 * and the listening connection; every statement the client and its handles send is one of its
 * methods. What the answers mean (a handle's deadline, whether to wait on) is decided above it.
 */
import type pg from 'pg';
import {
  acquireMany,
  acquireOne,
  acquireWaiting,
  holdersOf,
  inspectOne,
  measureRemaining,
  notify,
  observeState,
  releaseMany,
  releaseOne,
  renewMany,
  renewManySkippingLocked,
  renewOne,
  setLimit,
  type AcquiredRow,
  type AcquireMode,
  type HolderRow,
  type AcquireItem,
  type Follow,
  type HolderState,
  type LeaseStatus,
  type ObservedState,
  type ReleaseItem,
  type RenewCall,
  type RenewItem,
} from './calls.js';
import { byOwnerAndTtl, Coalescer } from './coalescer.js';
import { isPool, isRefusedBatch, isRefusedForAKey, openOwnPool, poolSize } from './connection.js';
import { NOTIFY_CHANNEL, Notifier } from './listener.js';
import { watchPool, Wire } from './wire.js';

/** How a session sends and whom it tells about broken connections. @internal */
export interface SessionOptions {
  /** Send named (prepared) statements until a pooler refuses one (see Wire). */
  preparedStatements: boolean;
  /** Coalesce the caller's own acquires (wait 0), renews and releases of one tick. */
  coalesce: boolean;
  /** Whether waiters listen for releases (see WaitingOptions.notifications). */
  notifications: boolean | 'auto';
  /**
   * Told of an error of a connection no statement of the client ran on: an idle one of the
   * pool (which the pool drops), or the listening one (which the session drops).
   */
  onConnectionError(error: Error, connection: 'idle' | 'listening'): void;
}

/**
 * The statements waiting in the server now out on each pool, of every client on it: the slots
 * (see {@link Session.serverWaitSlots}) are the pool's, however many clients share it.
 */
const serverWaitsOf = new WeakMap<pg.Pool, { count: number }>();

/** @internal */
export class Session {
  /** The pool or dedicated connection every statement runs on. */
  readonly db: pg.Pool | pg.ClientBase;
  /** The listening connection of the client's waiters and observers. */
  readonly listener: Notifier;
  readonly #ownsPool: boolean;
  readonly #unwatchPool: (() => void) | undefined;
  readonly #wire: Wire;
  readonly #renewer: Coalescer<RenewItem, RenewCall>;
  readonly #releaser: Coalescer<ReleaseItem, LeaseStatus>;
  readonly #acquirer: Coalescer<AcquireItem, AcquiredRow> | undefined;
  /** The waits in the server out now on the session's pool, of every client on it. */
  readonly serverWaits: { count: number } = { count: 0 };

  /** @param database a pool or dedicated connection, or a connection string for a pool of the session's own. */
  constructor(database: pg.Pool | pg.ClientBase | string, options: SessionOptions) {
    if (typeof database === 'string') {
      this.db = openOwnPool(database);
      this.#ownsPool = true;
    } else {
      this.db = database;
      this.#ownsPool = false;
    }
    // An idle connection that breaks (server restart) is dropped by the pool, which then emits
    // 'error': with no listener that would end the process, also for a pool passed in. The
    // next call opens a new connection, so the error is only reported.
    if (isPool(this.db)) {
      this.#unwatchPool = watchPool(this.db, (error) => options.onConnectionError(error, 'idle'));
      const waits = serverWaitsOf.get(this.db);
      if (waits) this.serverWaits = waits;
      else serverWaitsOf.set(this.db, this.serverWaits);
    }
    this.listener = new Notifier(
      isPool(this.db) ? this.db : undefined,
      options.notifications,
      (error) => options.onConnectionError(error, 'listening'),
    );
    const wire = (this.#wire = new Wire(this.db, options.preparedStatements));
    const coalesce = options.coalesce;
    this.#renewer = new Coalescer<RenewItem, RenewCall>(
      byOwnerAndTtl,
      (i) => renewOne(wire, i.key, i.owner, i.epoch, i.ttlMicroseconds),
      // A key locked by another transaction (a fenced one, say) is renewed on its own, so
      // that it holds up no other key's renewal.
      (items) => renewManySkippingLocked(wire, items),
      coalesce,
      // A renew_many the server refuses as invalid input (one key it cannot take), or because
      // one key is counted or shared (§13: batches take none), is sent again as single renews:
      // that key's problem must not cost every other key its lease.
      isRefusedForAKey,
    );
    // Without `coalesce` a release goes out at once, unless a hold keeps the releaser open.
    this.#releaser = new Coalescer<ReleaseItem, LeaseStatus>(
      byOwnerAndTtl,
      (i) => releaseOne(wire, i.key, i.owner, i.epoch),
      (items) => releaseMany(wire, items),
      coalesce,
      isRefusedBatch,
    );
    if (coalesce)
      this.#acquirer = new Coalescer<AcquireItem, AcquiredRow>(
        byOwnerAndTtl,
        (i) => acquireOne(wire, i.key, i.owner, i.ttlMicroseconds),
        (items) =>
          acquireMany(
            wire,
            items.map((i) => i.key),
            items[0]!.owner,
            items[0]!.ttlMicroseconds,
          ),
        true,
        // A coalesced acquire of a key that is counted or shared (the caller asked for an
        // exclusive grant, not knowing) makes the server refuse the whole acquire_many: each
        // call is then sent on its own, as lease.acquire, which answers it as §13 says.
        isRefusedBatch,
      );
  }

  /**
   * One non-blocking acquire, coalesced with its company when the session coalesces and
   * nothing can cancel it. A denied attempt with `follow` also reports the holder's state in
   * the same statement, after marking the key for notifications (`lease.watch`) or not
   * (`lease.inspect`).
   */
  acquire(
    key: string,
    owner: string,
    ttlMicroseconds: number,
    follow?: Follow,
    signal?: AbortSignal,
    mode: AcquireMode = 'exclusive',
  ): Promise<AcquiredRow & { holder?: HolderState }> {
    // Permits and shared grants never go into acquire_many, which refuses them (§13).
    return this.#acquirer && follow === undefined && signal === undefined && mode === 'exclusive'
      ? this.#acquirer.submit({ key, owner, ttlMicroseconds })
      : acquireOne(this.#wire, key, owner, ttlMicroseconds, follow, signal, mode);
  }

  /** See {@link acquireWaiting}: never coalesced, it waits in the server. */
  acquireWaiting(
    key: string,
    owner: string,
    ttlMicroseconds: number,
    waitMicroseconds: number,
    signal?: AbortSignal,
  ): Promise<AcquiredRow> {
    return acquireWaiting(this.#wire, key, owner, ttlMicroseconds, waitMicroseconds, signal);
  }

  /**
   * How many statements that wait in the server (acquireWaiting) may be out at once on the
   * pool, of all its clients together ({@link serverWaits}): half of the pool's connections
   * besides the listening one, so that renewals and every other call always find one; none on
   * the one connection a client was given, where such a statement would hold up every other
   * call.
   */
  get serverWaitSlots(): number {
    return isPool(this.db) ? Math.floor((poolSize(this.db) - 1) / 2) : 0;
  }

  /** See {@link setLimit}. */
  setLimit(key: string, limit: number | null): Promise<{ limit: number | null; holders: number }> {
    return setLimit(this.#wire, key, limit);
  }

  /** See {@link holdersOf}. */
  holders(key: string): Promise<HolderRow[]> {
    return holdersOf(this.#wire, key);
  }

  /** A handle's renew: batched with the keep-alive's renewals of the moment. */
  renew(key: string, owner: string, epoch: bigint, ttlMicroseconds: number): Promise<RenewCall> {
    return this.#renewer.submit({ key, owner, epoch, ttlMicroseconds });
  }

  /** A handle's release: batched while a hold is open (or always, coalescing). */
  release(key: string, owner: string, epoch: bigint): Promise<LeaseStatus> {
    return this.#releaser.submit({ key, owner, epoch });
  }

  /** A renew by key, owner and epoch, sent on its own (the client's `renew`, for tools). */
  renewNow(key: string, owner: string, epoch: bigint, ttlMicroseconds: number): Promise<RenewCall> {
    return renewOne(this.#wire, key, owner, epoch, ttlMicroseconds);
  }

  /** A release by key, owner and epoch, sent on its own (the client's `release`, for tools). */
  releaseNow(key: string, owner: string, epoch: bigint): Promise<LeaseStatus> {
    return releaseOne(this.#wire, key, owner, epoch);
  }

  /**
   * The keep-alive's renewals of one owner and ttl in one renew_many that skips locked rows
   * (such a key's answer is a promise: it is renewed on its own). A statement the server
   * refuses for its input (one key it cannot take) is sent again as single renews, so that
   * the key's problem costs no other key its lease.
   */
  renewBatch(items: RenewItem[]): Promise<(RenewCall | Promise<RenewCall>)[]> {
    const wire = this.#wire;
    return renewManySkippingLocked(wire, items).catch((error: unknown) => {
      if (!isRefusedForAKey(error)) throw error;
      return items.map((i) => renewOne(wire, i.key, i.owner, i.epoch, i.ttlMicroseconds));
    });
  }

  /**
   * Holds the renewer open: the renews made until the returned function is called go out
   * together, one `lease.renew_many` per owner and ttl (the keep-alive's ticks).
   */
  holdRenewals(): () => void {
    return this.#renewer.hold();
  }

  /**
   * Runs `release` with the releaser held open: the releases it makes go out together when it
   * returns, one `lease.release_many` per owner (see {@link Coalescer}).
   */
  releasesTogether<T>(release: () => T): T {
    const close = this.#releaser.hold();
    try {
      return release();
    } finally {
      close();
    }
  }

  /** lease.acquire_many for one owner and ttl: one statement, at most 10000 keys. */
  acquireMany(
    keys: readonly string[],
    owner: string,
    ttlMicroseconds: number,
  ): Promise<AcquiredRow[]> {
    return acquireMany(this.#wire, keys, owner, ttlMicroseconds);
  }

  /**
   * The first renewal of one acquire_many statement's grants, at once and in one renew_many
   * from a fresh send (for grants that arrived late): each row's renewal (`undefined` where not
   * granted), or `undefined` when the renewal failed (the grants then keep the acquire's
   * answer).
   */
  async renewGrants(
    rows: readonly AcquiredRow[],
    owner: string,
    ttlMicroseconds: number,
  ): Promise<(RenewCall | undefined)[] | undefined> {
    const items = rows
      .filter((row) => row.acquired)
      .map((row) => ({ key: row.key, owner, epoch: row.epoch!, ttlMicroseconds }));
    let calls: RenewCall[];
    try {
      calls = await renewMany(this.#wire, items);
    } catch {
      return undefined;
    }
    let next = 0;
    return rows.map((row) => (row.acquired ? calls[next++] : undefined));
  }

  /** See {@link measureRemaining}. */
  measureRemaining(
    key: string,
    owner: string,
    epoch: bigint,
  ): Promise<{ sentAt: number; remainingMs: number } | undefined> {
    return measureRemaining(this.#wire, key, owner, epoch);
  }

  /** See {@link inspectOne}. */
  inspect(key: string): ReturnType<typeof inspectOne> {
    return inspectOne(this.#wire, key);
  }

  /** See {@link observeState}: on the client's connection as it comes. */
  observe(key: string, watchMs: number | undefined): Promise<ObservedState> {
    return observeState(this.db, key, watchMs);
  }

  /** Notifies everyone waiting for or observing `key` (a new holder announcing itself). */
  announce(key: string): Promise<void> {
    return notify(this.db, NOTIFY_CHANNEL, key);
  }

  /**
   * Stops listening; then closes the pool the session made from a connection string, or stops
   * watching a pool it was given (once no other client uses that pool).
   */
  async end(): Promise<void> {
    await this.listener.close();
    // The session's own pool keeps its listener: sockets may still close after end() resolves.
    if (this.#ownsPool) await (this.db as pg.Pool).end();
    else this.#unwatchPool?.();
  }
}
