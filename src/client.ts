/**
 * The client: pg_lease's SQL API over node-postgres, as orchestration of the layers below it.
 * It reads options and validates input, publishes the acquire events and hands out handles;
 * an acquire goes to wait.ts (one attempt, or a wait), which goes to the session (sql/) and
 * makes the handle (lease.ts, the one place a grant becomes a handle), without calling back
 * into the client. Every decision about a lease is the server's.
 */
import { performance } from 'node:perf_hooks';
import type pg from 'pg';
import type { Duration } from './duration.js';
import {
  LeaseAbortedError,
  LeaseInvalidInputError,
  LeaseNotAcquiredError,
  LeaseTimeoutError,
} from './errors.js';
import { observed, publish } from './events.js';
import { fencedTransaction, type FencedOptions } from './fence.js';
import { KeepAliveGroup } from './keep-alive-group.js';
import { keepAliveIntervalMs, keepAlivePeriodMs, type KeepAliveOptions } from './keeper.js';
import {
  deadlineOf,
  deadlinePassed,
  Lease,
  type LeaseCalls,
  type LeaseStatus,
  type RenewCall,
} from './lease.js';
import {
  listLeases,
  purgeLeases,
  type ListedLease,
  type ListOptions,
  type PurgeOptions,
} from './operations.js';
import type { AcquiredRow, AcquireMode, ReleaseItem } from './sql/calls.js';
import { Session } from './sql/session.js';
import { defaultOwner } from './owner.js';
import { MAX_BATCH_KEYS } from './sql/statements.js';
import { illFormedText, limitViolation, validateInput } from './validation.js';
import { Waiting, type WaitingOptions } from './wait.js';

/**
 * Where the client sends its calls: a `pg.Pool` (recommended), a dedicated `pg.Client`, or a
 * connection string (the client then makes and owns a pool).
 *
 * @example
 * import pg from 'pg';
 * import type { LeaseDatabase } from 'pg-lease';
 * const database: LeaseDatabase = new pg.Pool({ connectionString: process.env.DATABASE_URL });
 */
export type LeaseDatabase = pg.Pool | pg.ClientBase | string;

/**
 * Options of {@link LeaseClient}.
 *
 * @example
 * import { LeaseClient } from 'pg-lease';
 * const client = new LeaseClient(pool, { owner: `billing-worker-${process.env.POD_NAME}` });
 */
export interface LeaseClientOptions extends WaitingOptions {
  /**
   * Owner identity for every acquire that names none. Default: a fresh {@link defaultOwner}
   * per acquire, so that two acquires never share a grant. Set it only for identities that are
   * unique per holder: an acquire by an owner that already holds the key returns that same
   * grant (same epoch) instead of waiting for it.
   */
  owner?: string;
  /**
   * Send every call as a named (prepared) statement, parsed and planned once per connection.
   * Default `true`. Behind a pooler in transaction mode that does not track prepared
   * statements (PgBouncer before 1.21, or `max_prepared_statements = 0`) a statement prepared
   * on one server connection is unknown on the next: the client then falls back to unnamed
   * statements by itself at the first refusal (26000 or 42P05, raised before anything ran);
   * `false` starts unnamed.
   */
  preparedStatements?: boolean;
  /**
   * Coalesce the calls made in the same tick of the event loop (acquires with `wait` 0, renews,
   * releases) into one `lease.acquire_many` / `renew_many` / `release_many` per owner and ttl:
   * N concurrent calls cost one statement and one commit. Each caller still gets exactly its
   * own key's answer. A call waits at most until the next turn of the event loop for company.
   * Batching needs calls of one owner (set `owner`); calls of distinct owners go out singly.
   * Default `false`.
   */
  coalesce?: boolean;
}

/**
 * Options of {@link LeaseClient.acquireMany}.
 *
 * @example
 * import type { AcquireManyOptions } from 'pg-lease';
 * const options: AcquireManyOptions = { ttl: '30s', owner: 'shard-worker-3', keepAlive: true };
 */
export interface AcquireManyOptions {
  /** How long each grant lasts unless renewed: milliseconds or interval text (`'30s'`). */
  ttl: Duration;
  /** One owner for every key. Default: the client's `owner` option, else a fresh {@link defaultOwner}. */
  owner?: string;
  /** Renew every granted lease automatically, as for {@link LeaseClient.acquire}. */
  keepAlive?: boolean | KeepAliveOptions;
}

/**
 * Options of {@link LeaseClient.acquire}.
 *
 * @example
 * import type { AcquireOptions } from 'pg-lease';
 * const options: AcquireOptions = { ttl: '30s', wait: '10s', keepAlive: true };
 */
export interface AcquireOptions {
  /** How long the grant lasts unless renewed: whole milliseconds or interval text with a unit (`'30s'`). */
  ttl: Duration;
  /**
   * How long to wait for a key held by another owner. Default 0: answer at once (`null` when
   * held). When the wait runs out, acquire rejects with {@link LeaseTimeoutError}. The wait
   * holds no transaction and no connection: it makes short attempts and sleeps in between until
   * the key is released (notification), the holder's grant expires, or the wait ends; see
   * {@link WaitingOptions}.
   */
  wait?: Duration;
  /**
   * Gives up waiting when it aborts: acquire rejects with {@link LeaseAbortedError}, nothing is
   * granted and no statement is left running on the server.
   */
  signal?: AbortSignal;
  /** Owner identity. Default: the client's `owner` option, else a fresh {@link defaultOwner}. */
  owner?: string;
  /** Renew automatically until released or lost; `true` renews every ttl / 3. Default: off. */
  keepAlive?: boolean | KeepAliveOptions;
  /**
   * Makes `key` a counted key of `limit` permits (1 to 1000; SEMANTICS §13) and acquires one
   * of them: up to `limit` owners hold the key at once, each with a permit of its own (its own
   * epoch, expiry, keep-alive, `signal`, `release()` and fence). The limit is set with
   * `lease.set_limit` before the first attempt, every time: the last caller's limit stands for
   * everyone, as with `consul lock -n`; a smaller limit takes no permit away, it only grants
   * none until fewer are live. The server refuses it (and the acquire rejects with its error,
   * SQLSTATE 55006, nothing changed) while the key is held exclusively or shared. A plain
   * acquire (without `limit`) of a key that is already counted also gets a permit.
   */
  limit?: number;
  /**
   * Acquires `key` shared (`lease.acquire_shared`, SEMANTICS §13): beside any number of other
   * shared holders, never beside an exclusive one (an acquire without `shared`). The handle
   * works as an exclusive one. Not with `limit`; a counted key refuses it (SQLSTATE 0A000).
   */
  shared?: boolean;
}

/**
 * One live grant of a key as {@link LeaseClient.holders} reports it: the exclusive holder, a
 * permit of a counted key, or a shared grant.
 *
 * @example
 * import type { LeaseHolder } from 'pg-lease';
 * const line = (h: LeaseHolder) => `${h.owner} epoch ${h.epoch} until ${h.expiresAt.toISOString()}`;
 */
export interface LeaseHolder {
  owner: string;
  epoch: bigint;
  /** Server time the grant ends. */
  expiresAt: Date;
  /** Milliseconds left on the grant as the server measured it while answering. */
  remainingMs: number;
}

/**
 * What `inspect` reports about a key that was ever granted. `epoch` is the key's fencing
 * watermark when it is not held: an action guarded by an epoch at or below it is stale.
 *
 * @example
 * import type { LeaseState } from 'pg-lease';
 * const describe = (s: LeaseState) => (s.held ? `held by ${s.owner}` : `free after epoch ${s.epoch}`);
 */
export interface LeaseState {
  held: boolean;
  /** The holder; `null` unless held. */
  owner: string | null;
  epoch: bigint;
  /** Server time the grant ends; `null` unless held. */
  expiresAt: Date | null;
}

/**
 * The answer of {@link LeaseClient.renew}.
 *
 * @example
 * import type { RenewResult } from 'pg-lease';
 * const ok = (r: RenewResult) => r.status === 'ok' && r.expiresAt !== null;
 */
export interface RenewResult {
  status: LeaseStatus;
  /** The new expiry (server time) when `ok`, else `null`. */
  expiresAt: Date | null;
}

/**
 * Leases over node-postgres.
 *
 * Every call runs as its own statement outside any transaction: from a pool each call takes an
 * idle connection; a dedicated `pg.Client` is refused (code `in_transaction`) while a
 * transaction block is open on it, because an acquire inside a transaction would be undone by
 * its rollback and would keep the key's row locked until its end. To make an acquire part of
 * your own transaction, call `lease.acquire(...)` in SQL yourself.
 *
 * @example
 * import pg from 'pg';
 * import { LeaseClient } from 'pg-lease';
 *
 * const client = new LeaseClient(new pg.Pool({ connectionString: process.env.DATABASE_URL }));
 * await client.withLease('nightly-report', { ttl: '30s' }, async (lease, signal) => {
 *   await buildReport({ epoch: lease.epoch, signal });
 * });
 */
export class LeaseClient implements AsyncDisposable {
  readonly #owner: string | undefined;
  readonly #session: Session;
  readonly #group: KeepAliveGroup;
  readonly #calls: LeaseCalls;
  /** The calls of permit and shared handles: never batched (SEMANTICS §13). */
  readonly #singleCalls: LeaseCalls;
  readonly #waiting: Waiting;

  /**
   * @param database a `pg.Pool`, a dedicated `pg.Client` (connected, with an `error` listener:
   *   the client does not manage it), or a connection string. On a pool, also one passed in,
   *   the client listens for `'error'` (an idle connection broken by a server restart, say) until
   *   {@link end}, so that it does not end the process, and reports it as `connectionError`.
   */
  constructor(database: LeaseDatabase, options: LeaseClientOptions = {}) {
    this.#owner = options.owner;
    const session = (this.#session = new Session(database, {
      preparedStatements: options.preparedStatements ?? true,
      coalesce: options.coalesce ?? false,
      notifications: options.notifications ?? 'auto',
      onConnectionError: reportConnectionError,
    }));
    this.#group = new KeepAliveGroup({
      hold: () => session.holdRenewals(),
      renewBatch: (items) => session.renewBatch(items),
    });
    this.#calls = {
      renew: (key, owner, epoch, ttlMicroseconds) =>
        session.renew(key, owner, epoch, ttlMicroseconds),
      release: (key, owner, epoch) => session.release(key, owner, epoch),
      scheduler: (ops, lease, keepAlive) => this.#group.member(ops, lease, keepAlive),
    };
    this.#singleCalls = {
      renew: (key, owner, epoch, ttlMicroseconds) =>
        session.renewNow(key, owner, epoch, ttlMicroseconds),
      release: (key, owner, epoch) => session.releaseNow(key, owner, epoch),
      scheduler: (ops, lease, keepAlive) => this.#group.member(ops, lease, keepAlive),
      single: true,
    };
    this.#waiting = new Waiting(session, options);
  }
  /**
   * Acquires `key`: resolves with a {@link Lease}, or with `null` when another owner holds it
   * (`wait` 0, the default). With `wait` > 0 it waits for the key and rejects with
   * {@link LeaseTimeoutError} when the wait runs out. Invalid input rejects with
   * {@link LeaseInvalidInputError} before anything is sent.
   *
   * With `limit` it acquires one of the key's permits (a semaphore), with `shared` a shared
   * grant (a readers' side); `null` then means every permit is taken, or an exclusive holder
   * (or, for `shared`, a waiting exclusive acquirer in SQL) holds the key. A release or lapse
   * of any permit or shared grant wakes a waiting acquire as an exclusive release does. These
   * acquires are never coalesced into `lease.acquire_many` (which refuses them), also with
   * `coalesce`, and their handles are renewed and released with single calls.
   *
   * @example
   * const lease = await client.acquire('job-42', { ttl: '30s', wait: '5s', keepAlive: true });
   * try {
   *   await run(lease!.epoch, lease!.signal);
   * } finally {
   *   await lease!.release();
   * }
   */
  async acquire(key: string, options: AcquireOptions): Promise<Lease | null> {
    const owner = options.owner ?? this.#owner ?? defaultOwner();
    const keepAlive = keepAliveOf(options.keepAlive);
    const input = validateInput('acquire', {
      key,
      owner,
      ttl: options.ttl,
      wait: options.wait ?? 0,
      keepAliveInterval: keepAlive?.interval,
    });
    const mode = acquireModeOf(options);
    const { signal } = options;
    if (signal?.aborted) throw new LeaseAbortedError(key, { cause: signal.reason as unknown });
    const startedAt = performance.now();
    if (options.limit !== undefined) await this.#session.setLimit(key, options.limit);
    let lease: Lease | null;
    try {
      lease = await this.#waiting.acquire(
        {
          key,
          owner,
          ttlMicroseconds: input.ttlMicroseconds,
          keepAlive,
          calls: mode === 'exclusive' ? this.#calls : this.#singleCalls,
          mode,
        },
        input.waitMicroseconds / 1000,
        signal,
      );
    } catch (error) {
      if (error instanceof LeaseTimeoutError)
        publishNotAcquired(key, owner, 'timeout', performance.now() - startedAt);
      throw error;
    }
    if (!lease) {
      publishNotAcquired(key, owner, 'held', performance.now() - startedAt);
      return null;
    }
    publishAcquired(lease, performance.now() - startedAt);
    return lease;
  }

  /**
   * Acquires many keys for one owner with one statement per 10000 keys (`lease.acquire_many`):
   * resolves with one entry per key, in the order given, a {@link Lease} or `null` when another
   * owner holds it. Each key gets exactly what {@link acquire} with `wait` 0 would give; the
   * handles are independent (each its own deadline and `signal`). With `keepAlive`, the shared
   * keep-alive renews them together. Keys must be distinct.
   *
   * The statements run one after another, and each one's handles are made (and kept alive) as
   * soon as it answers, so that a call taking longer than the ttl does not lose its first keys.
   * If a statement fails, the keys granted before it are released and the error is thrown.
   *
   * A statement that answers late (its grants' first keep-alive renewal already due, a third
   * of the ttl by default: a lock wait, a slow server, many keys) is reported before the call
   * returns with an `acquireLate` event (`AcquireLateEvent`). With `keepAlive` its grants are
   * renewed first, in one statement. A grant that has run out by then is never handed out as
   * a lost handle: its entry is `null` (event `notAcquired` with reason `expired`) and it is
   * released.
   *
   * @example
   * const shards = ['shard-0', 'shard-1', 'shard-2'];
   * const leases = await client.acquireMany(shards, { ttl: '30s', owner: 'worker-7', keepAlive: true });
   * const mine = leases.filter((lease) => lease !== null);
   */
  async acquireMany(
    keys: readonly string[],
    options: AcquireManyOptions,
  ): Promise<(Lease | null)[]> {
    const owner = options.owner ?? this.#owner ?? defaultOwner();
    const keepAlive = keepAliveOf(options.keepAlive);
    // Text the server cannot be sent as it is, named by its position in keys; then the options
    // as acquire checks them (also for no keys), with the first key; then the rest.
    const illFormed = keys.flatMap((key, i) =>
      typeof key === 'string' ? (illFormedText(`keys[${i}]`, key) ?? []) : [],
    );
    if (illFormed.length > 0)
      throw new LeaseInvalidInputError(
        illFormed.length > 10
          ? `${illFormed.slice(0, 10).join('; ')}; and ${illFormed.length - 10} more`
          : illFormed.join('; '),
      );
    const { ttlMicroseconds } = validateInput('acquire', {
      key: keys[0] ?? 'none',
      owner,
      ttl: options.ttl,
      keepAliveInterval: keepAlive?.interval,
    });
    for (let i = 1; i < keys.length; i++) validateInput('inspect', { key: keys[i]! });
    const leases: (Lease | null)[] = [];
    try {
      for (let start = 0; start < keys.length; start += MAX_BATCH_KEYS) {
        const rows = await this.#session.acquireMany(
          keys.slice(start, start + MAX_BATCH_KEYS),
          owner,
          ttlMicroseconds,
        );
        const handles = await this.#handlesOf(rows, owner, ttlMicroseconds, keepAlive);
        for (const lease of handles) leases.push(lease);
      }
    } catch (error) {
      await Promise.all(
        this.#session.releasesTogether(() =>
          leases.map((lease) => lease?.release().catch(() => undefined)),
        ),
      );
      throw error;
    }
    return leases;
  }

  /**
   * Releases many handles of this client, stopping their keep-alive and aborting their `signal`
   * first, with one `lease.release_many` statement per owner and 10000 handles (a handle whose
   * key another handle of the call also names goes into another statement; a group of one is
   * the single call). Resolves with each handle's status, in the order given, as its own
   * `release()` would: a handle already released answers what its release answered, without
   * a statement; a lost one is released too, in case the server still lists it, and answers
   * why it was gone (`lapsed`, `not_owner`, `epoch_mismatch`).
   *
   * Anything but a handle of this client, or a handle given twice, is
   * {@link LeaseInvalidInputError} before anything is stopped or sent. If a statement fails,
   * the call rejects with its error once every statement has answered: the handles of that
   * statement are left unreleased (their keep-alive already stopped; `release()` retries), the
   * others are released.
   *
   * @example
   * const leases = await client.acquireMany(shards, { ttl: '30s', owner: 'worker-7', keepAlive: true });
   * const held = leases.filter((lease) => lease !== null);
   * // ... work ...
   * const statuses = await client.releaseMany(held); // ['ok', 'ok', ...]
   */
  async releaseMany(leases: readonly Lease[]): Promise<LeaseStatus[]> {
    if (!Array.isArray(leases))
      throw new LeaseInvalidInputError('leases must be an array of lease handles');
    const foreign: number[] = [];
    const repeated: string[] = [];
    const first = new Map<Lease, number>();
    leases.forEach((lease, i) => {
      if (!Lease.madeWith(lease, this.#calls, this.#singleCalls)) foreign.push(i);
      else if (first.has(lease)) repeated.push(`leases[${i}] repeats leases[${first.get(lease)}]`);
      else first.set(lease, i);
    });
    const violations = [
      ...violation(
        'each entry must be a lease handle of this client',
        foreign.map((i) => `leases[${i}]`),
      ),
      ...violation('leases must be distinct', repeated),
    ];
    if (violations.length > 0) throw new LeaseInvalidInputError(violations.join('; '));
    const settled = await Promise.allSettled(
      this.#session.releasesTogether(() => leases.map((lease) => lease.release())),
    );
    const failure = settled.find((result) => result.status === 'rejected');
    if (failure) throw failure.reason;
    return settled.map((result) => (result as PromiseFulfilledResult<LeaseStatus>).value);
  }

  /**
   * The handles of one acquire_many statement's rows, in order (`null` where not granted). If
   * the answer came late, by the keep-alive's own rule (its first renewal already due), the
   * caller is told (`acquireLate`) and keep-alive grants are renewed before their handles are
   * made; a grant that has run out by then is released and reported `null`, never handed out
   * lost.
   */
  async #handlesOf(
    rows: AcquiredRow[],
    owner: string,
    ttlMicroseconds: number,
    keepAlive: KeepAliveOptions | undefined,
  ): Promise<(Lease | null)[]> {
    const receivedAt = performance.now();
    const make = (row: AcquiredRow, renewal?: RenewCall) =>
      this.#handleOf(row, owner, ttlMicroseconds, keepAlive, renewal);
    // Every grant of one statement has the same deadline (see leastRemainingMs); its ttl counts
    // from one ttl before it, as the keep-alive reckons.
    const granted = rows.find((row) => row.acquired);
    const ttlMs = ttlMicroseconds / 1000;
    const remainingMs = granted ? deadlineOf(granted) - receivedAt : ttlMs;
    const periodMs = keepAlivePeriodMs(keepAlive && keepAliveIntervalMs(keepAlive), ttlMs);
    if (ttlMs - remainingMs < periodMs) return rows.map((row) => make(row));

    const renewals = keepAlive
      ? await this.#session.renewGrants(rows, owner, ttlMicroseconds)
      : undefined;
    const expired: string[] = [];
    const giveBack: ReleaseItem[] = [];
    const leases = rows.map((row, i) => {
      const renewal = renewals?.[i];
      const refused = renewal !== undefined && renewal.status !== 'ok';
      if (!row.acquired || (!refused && !deadlinePassed(deadlineOf(renewal ?? row))))
        return make(row, renewal);
      expired.push(row.key);
      // A grant whose renewal the server refused is gone; any other may still be listed.
      if (!refused) giveBack.push({ key: row.key, owner, epoch: row.epoch! });
      publishNotAcquired(row.key, owner, 'expired', receivedAt - row.sentAt);
      return null;
    });
    if (observed('acquireLate'))
      publish('acquireLate', {
        owner,
        keys: rows.map((row) => row.key),
        ttlMs,
        waitedMs: receivedAt - rows[0]!.sentAt,
        remainingMs,
        renewed: renewals !== undefined,
        expired,
      });
    // Best effort: a grant not given back lapses at its expiry anyway.
    await Promise.all(
      this.#session.releasesTogether(() =>
        giveBack.map((item) =>
          this.#session.release(item.key, item.owner, item.epoch).catch(() => undefined),
        ),
      ),
    );
    return leases;
  }

  /**
   * The handle of one key of acquire_many (null when denied), with acquire's events; its
   * deadline and expiry come from `renewal` when the grant was renewed before it was made.
   */
  #handleOf(
    row: AcquiredRow,
    owner: string,
    ttlMicroseconds: number,
    keepAlive: KeepAliveOptions | undefined,
    renewal?: RenewCall,
  ): Lease | null {
    const waitedMs = performance.now() - row.sentAt;
    if (!row.acquired) {
      publishNotAcquired(row.key, owner, 'held', waitedMs);
      return null;
    }
    const lease = new Lease(
      this.#calls,
      { key: row.key, owner, epoch: row.epoch!, ttlMicroseconds, confirmation: renewal ?? row },
      keepAlive,
    );
    publishAcquired(lease, waitedMs);
    return lease;
  }

  /**
   * Runs `fn` while holding `key`: acquires (rejecting with {@link LeaseNotAcquiredError} when
   * another owner holds it and `wait` is 0), keeps the lease alive, and releases it when `fn`
   * settles. `signal` aborts when the lease is lost: stop acting then. Resolves with `fn`'s
   * result; rejects with `fn`'s error, or with the {@link LeaseLostError} when `fn` resolved
   * after the lease was lost.
   *
   * @example
   * const total = await client.withLease('ledger', { ttl: '10s', wait: '30s' }, async (lease, signal) => {
   *   const rows = await fetchBatch({ signal });
   *   await writeFenced(rows, lease.epoch);
   *   return rows.length;
   * });
   */
  async withLease<T>(
    key: string,
    options: AcquireOptions,
    fn: (lease: Lease, signal: AbortSignal) => Promise<T> | T,
  ): Promise<T> {
    const lease = await this.acquire(key, { ...options, keepAlive: options.keepAlive || true });
    if (!lease) throw new LeaseNotAcquiredError(key);
    let result: T;
    try {
      result = await fn(lease, lease.signal);
    } catch (error) {
      // fn's error is the one to report; the lease lapses on its own if this release fails.
      await lease.release().catch(() => undefined);
      throw error;
    }
    const lost = lease.lost;
    await lease.release();
    if (lost) throw lost;
    return result;
  }

  /**
   * Runs `fn` in a transaction fenced by `lease` (see {@link fencedTransaction}): its writes
   * commit only while the grant is live, and no takeover, renew or release of the key commits
   * before them. Rejects with {@link LeaseFencedError} when the server refuses the epoch, at
   * the fence or at a `lease.fence_row` trigger. The holder's own keep-alive renew waits while
   * the transaction is open, so keep it short next to the ttl.
   *
   * @example
   * await client.withLease('job-42', { ttl: '30s' }, async (lease) => {
   *   const result = await compute();
   *   await client.fenced(lease, (tx) =>
   *     tx.query('UPDATE jobs SET result = $1, lease_epoch = $2 WHERE id = 42', [
   *       result,
   *       lease.epoch.toString(),
   *     ]),
   *   );
   * });
   */
  fenced<T>(
    lease: Pick<Lease, 'key' | 'epoch'>,
    fn: (tx: pg.ClientBase) => Promise<T> | T,
    options?: FencedOptions,
  ): Promise<T> {
    return fencedTransaction(this.#session.db, lease, fn, options);
  }

  /**
   * Reports a key's state: `null` for a key never granted, else `{ held, owner, epoch,
   * expiresAt }` (a free or lapsed key reports `held: false`, no owner and its epoch watermark).
   * Advisory: the answer may be stale as soon as it arrives.
   *
   * @example
   * const state = await client.inspect('job-42');
   * if (state?.held) console.log(`${state.owner} holds epoch ${state.epoch}`);
   */
  async inspect(key: string): Promise<LeaseState | null> {
    validateInput('inspect', { key });
    return (await this.#session.inspect(key)) ?? null;
  }

  /**
   * Every live grant of `key` (`lease.holders`), in epoch order: its exclusive holder, or each
   * permit of a counted key, or each shared grant; empty when nobody holds it. Advisory, like
   * {@link inspect}.
   *
   * @example
   * const holders = await client.holders('render-slots');
   * console.log(`${holders.length} renders running: ${holders.map((h) => h.owner).join(', ')}`);
   */
  async holders(key: string): Promise<LeaseHolder[]> {
    validateInput('inspect', { key });
    return this.#session.holders(key);
  }

  /**
   * Lists keys in key order: held ones, or with `all` also free and lapsed ones; see
   * {@link listLeases}.
   *
   * @example
   * const held = await client.list({ prefix: 'job-' });
   */
  list(options: ListOptions = {}): Promise<ListedLease[]> {
    return listLeases(this.#session.db, options);
  }

  /**
   * Deletes keys free or lapsed for at least `olderThan`; resolves with how many. See
   * {@link purgeLeases} (and who may call it).
   *
   * @example
   * const deleted = await client.purge({ olderThan: '7 days' });
   */
  purge(options: PurgeOptions): Promise<number> {
    return purgeLeases(this.#session.db, options);
  }

  /**
   * Reports `key`'s state (as {@link inspect} does) now and then after every change of holder
   * or epoch, until `signal` aborts. Woken by notifications of releases and at the holder's
   * expiry, so it does not poll where notifications work (see {@link WaitingOptions}).
   *
   * @example
   * for await (const state of client.observe('leader/scheduler', { signal })) {
   *   console.log(state?.held ? `leader: ${state.owner}` : 'no leader');
   * }
   */
  observe(key: string, options: { signal?: AbortSignal } = {}): AsyncGenerator<LeaseState | null> {
    validateInput('inspect', { key });
    return this.#waiting.observe(key, options.signal);
  }

  /** @internal Wakes the waiters and observers of `key`: a new holder announcing itself. */
  announce(key: string): Promise<void> {
    return this.#waiting.announce(key);
  }

  /**
   * Renews a grant named by key, owner and epoch, without a handle (for tools such as the CLI;
   * a {@link Lease} renews itself). Resolves with the server's status; never throws for a
   * status.
   *
   * @example
   * const { status, expiresAt } = await client.renew('job-42', {
   *   owner: 'worker-a1',
   *   epoch: 7n,
   *   ttl: '30s',
   * });
   */
  async renew(
    key: string,
    options: { owner: string; epoch: bigint; ttl: Duration },
  ): Promise<RenewResult> {
    const input = validateInput('renew', { key, ...options });
    const { status, expiresAt } = await this.#session.renewNow(
      key,
      options.owner,
      input.epoch,
      input.ttlMicroseconds,
    );
    return { status, expiresAt };
  }

  /**
   * Releases a grant named by key, owner and epoch, without a handle (for tools such as the
   * CLI; a {@link Lease} has `release()`). Resolves with the server's status.
   *
   * @example
   * const status = await client.release('job-42', { owner: 'worker-a1', epoch: 7n }); // 'ok'
   */
  async release(key: string, options: { owner: string; epoch: bigint }): Promise<LeaseStatus> {
    const input = validateInput('release', { key, ...options });
    return this.#session.releaseNow(key, options.owner, input.epoch);
  }

  /**
   * Closes the pool the client made from a connection string; a pool or client passed in is
   * left to its owner (the client's `'error'` listener on a pool passed in is removed, once no
   * other client uses that pool). Handles still alive stop being renewed and are lost at their
   * deadline.
   *
   * @example
   * const client = new LeaseClient(process.env.DATABASE_URL!);
   * try {
   *   await client.withLease('job', { ttl: '30s' }, run);
   * } finally {
   *   await client.end();
   * }
   */
  async end(): Promise<void> {
    await this.#session.end();
  }

  /** {@link end}, for `await using client = new LeaseClient(url)`. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.end();
  }
}

/** Publishes `acquired` for a handle an acquire hands out, `waitedMs` after it began. */
function publishAcquired(lease: Lease, waitedMs: number): void {
  if (observed('acquired'))
    publish('acquired', {
      key: lease.key,
      owner: lease.owner,
      epoch: lease.epoch,
      expiresAt: lease.expiresAt,
      waitedMs,
    });
}

/** Publishes `notAcquired`: why an acquire (or one key of acquireMany) hands out no handle. */
function publishNotAcquired(
  key: string,
  owner: string,
  reason: 'held' | 'timeout' | 'expired',
  waitedMs: number,
): void {
  if (observed('notAcquired')) publish('notAcquired', { key, owner, reason, waitedMs });
}

/** Reports an error of a connection no call ran on (an idle one, the listening one). */
function reportConnectionError(error: Error, connection: 'idle' | 'listening'): void {
  if (observed('connectionError')) publish('connectionError', { error, connection });
}

/**
 * One rule's violation for {@link LeaseInvalidInputError}, naming at most ten entries as the
 * server does (`and N more`); none when nothing violates it.
 */
function violation(rule: string, entries: string[]): string[] {
  if (entries.length === 0) return [];
  const more = entries.length > 10 ? ` and ${entries.length - 10} more` : '';
  return [`${rule}: ${entries.slice(0, 10).join(', ')}${more}`];
}

/**
 * What an acquire asks for: an exclusive grant, a permit (`limit`) or a shared grant (`shared`).
 * Invalid combinations and limits are {@link LeaseInvalidInputError} before anything is sent.
 */
function acquireModeOf(options: AcquireOptions): AcquireMode {
  const { limit, shared } = options;
  const violations: string[] = [];
  const badLimit = limitViolation(limit);
  if (badLimit !== undefined) violations.push(badLimit);
  if (shared !== undefined && typeof shared !== 'boolean')
    violations.push(`shared must be true or false, got ${String(shared)}`);
  if (limit !== undefined && shared === true)
    violations.push('limit and shared cannot be combined: a counted key takes no shared grants');
  if (violations.length > 0)
    throw new LeaseInvalidInputError(violations.join('; '), {
      hint: 'Pass limit for a counted key (one permit of limit), or shared: true for a shared grant, not both.',
    });
  return limit !== undefined ? 'permit' : shared ? 'shared' : 'exclusive';
}

/** The `keepAlive` option as the handle takes it: `true` is the defaults, `false` none. */
function keepAliveOf(option: boolean | KeepAliveOptions | undefined): KeepAliveOptions | undefined {
  return option === true ? {} : option || undefined;
}
