/**
 * Leader election on one lease, in the manner of etcd's `Election` and client-go's
 * `LeaderElector`: candidates campaign (wait for the key), the winner leads while its lease
 * lives and steps down before its server expiry, and anyone can observe who leads.
 *
 * The leader is whoever holds the key; its epoch is the term, so a deposed leader's writes can
 * be fenced like any other stale holder's. Leadership ends, and `signal` aborts, at the first
 * of: a renewal reporting the lease gone, `resign()`, or `stepDownMarginMs` before the handle's
 * deadline (itself never later than the server's expiry: see lease.ts). Only the first and the
 * last are a loss (`lost`); a resignation, also `run()` stopping, is `resigned`.
 *
 * Terms are epochs, so they rise but are not consecutive: the release that ends a term by
 * resignation or step-down raises the key's epoch itself (it fences the ended term), and the
 * next term is one above that. docs/client.md lists every case.
 */
import { EventEmitter } from 'node:events';
import type { LeaseClient, LeaseState } from './client.js';
import { durationMicroseconds, type Duration } from './duration.js';
import { LeaseError, LeaseLostError } from './errors.js';
import type { KeepAliveOptions } from './keeper.js';
import type { Lease } from './lease.js';
import { defaultOwner } from './owner.js';
import { optionMs } from './validation.js';

/**
 * Options of {@link Election}.
 *
 * @example
 * import type { ElectionOptions } from 'pg-lease';
 * const options: ElectionOptions = { ttl: '15s', identity: `scheduler-${process.env.HOSTNAME}` };
 */
export interface ElectionOptions {
  /** The leader's lease ttl; it renews every ttl / 3 (or `keepAlive.interval`). */
  ttl: Duration;
  /** This candidate's identity (the lease owner). Default: a fresh {@link defaultOwner}. */
  identity?: string;
  keepAlive?: KeepAliveOptions;
  /**
   * How long before its deadline a leader whose renewals did not come through steps down.
   * Default: a tenth of the ttl. Covers a timer that fires late on a busy event loop.
   */
  stepDownMargin?: Duration;
}

/**
 * The current leader as the server reports it.
 *
 * @example
 * import type { Leader } from 'pg-lease';
 * const describe = (l: Leader | null) => (l ? `${l.identity} (term ${l.epoch})` : 'no leader');
 */
export interface Leader {
  identity: string;
  /** The leader's epoch: its term, for fencing. */
  epoch: bigint;
  /** Server time its lease ends unless renewed. */
  expiresAt: Date;
}

/**
 * A won election: lead while `signal` is not aborted and pass `epoch` to fenced writes.
 *
 * @example
 * const leadership = await election.campaign();
 * while (!leadership.signal.aborted) await tick(leadership.epoch);
 */
export interface Leadership {
  readonly identity: string;
  /** The term: the epoch of the leader's lease. */
  readonly epoch: bigint;
  /**
   * Aborts when leadership ends. Reason: a {@link LeaseLostError} when it was lost (renewal
   * answered not_owner/lapsed/epoch_mismatch, or the step-down before the deadline), or a
   * {@link LeaseError} with code `lease_released` whose message says the term was resigned.
   */
  readonly signal: AbortSignal;
  /** The lease behind it. */
  readonly lease: Lease;
  /** Time left to lead, from the monotonic deadline minus the step-down margin; 0 once over. */
  remainingMs(): number;
  /** Throws unless still leader, checked now (also right after an event-loop stall). */
  assertLeader(): void;
  /**
   * Steps down: releases the lease, so that the next candidate takes over at once. Emits
   * `resigned`, not `lost` (unless the leadership had already ended).
   */
  resign(): Promise<void>;
}

/** Events of {@link Election}. */
export interface ElectionEvents {
  /** This candidate became leader. */
  elected: [Leadership];
  /**
   * This candidate's leadership was lost: a renewal found the lease gone, or it stepped down
   * before its deadline because renewals did not come through. The signal's reason (a
   * {@link LeaseLostError}).
   */
  lost: [unknown];
  /**
   * This candidate gave up its leadership: `resign()`, releasing the leadership's lease, or
   * `run()` stopping on its signal. Never followed or preceded by `lost` for the same term.
   */
  resigned: [Leadership];
}

/**
 * One key, many candidates. `campaign()` waits to become leader; `leader()` and `observe()`
 * tell who leads; `run()` loops: campaign, lead, campaign again after a loss.
 *
 * @example
 * import { Election, LeaseClient } from 'pg-lease';
 * const election = new Election(new LeaseClient(pool), 'leader/scheduler', { ttl: '15s' });
 * election.on('lost', (reason) => console.warn('no longer leader', reason));
 * await election.run(async (leadership) => {
 *   while (!leadership.signal.aborted) await scheduleDueJobs(leadership.epoch, leadership.signal);
 * }, { signal: shutdown.signal });
 */
export class Election extends EventEmitter<ElectionEvents> {
  readonly key: string;
  readonly identity: string;
  readonly #client: LeaseClient;
  readonly #ttl: Duration;
  readonly #keepAlive: KeepAliveOptions;
  readonly #marginMs: number;

  constructor(client: LeaseClient, key: string, options: ElectionOptions) {
    super();
    this.#client = client;
    this.key = key;
    this.identity = options.identity ?? defaultOwner();
    this.#ttl = options.ttl;
    this.#keepAlive = options.keepAlive ?? {};
    // The ttl is validated by acquire; a bad one fails the first campaign.
    this.#marginMs =
      options.stepDownMargin === undefined
        ? (durationMicroseconds(options.ttl) ?? 0) / 10_000
        : optionMs('stepDownMargin', options.stepDownMargin, 'non-negative');
  }

  /**
   * Waits until this candidate leads (or `wait` runs out: {@link LeaseTimeoutError}; or `signal`
   * aborts: {@link LeaseAbortedError}). Then announces itself to observers and emits `elected`.
   */
  async campaign(options: { signal?: AbortSignal; wait?: Duration } = {}): Promise<Leadership> {
    const lease = await this.#client.acquire(this.key, {
      ttl: this.#ttl,
      owner: this.identity,
      wait: options.wait ?? '1000 years',
      keepAlive: this.#keepAlive,
      ...(options.signal ? { signal: options.signal } : {}),
    });
    const leadership = new Term(lease!, this.#marginMs);
    leadership.signal.addEventListener(
      'abort',
      () =>
        leadership.resigned
          ? this.emit('resigned', leadership)
          : this.emit('lost', leadership.signal.reason),
      { once: true },
    );
    await this.#client.announce(this.key).catch(() => undefined);
    if (!leadership.signal.aborted) this.emit('elected', leadership);
    return leadership;
  }

  /** The current leader, or `null` when nobody leads. */
  async leader(): Promise<Leader | null> {
    return toLeader(await this.#client.inspect(this.key));
  }

  /**
   * The leader now and after every change (a new term, or nobody), until `signal` aborts;
   * notified rather than polled where notifications work.
   */
  async *observe(options: { signal?: AbortSignal } = {}): AsyncGenerator<Leader | null> {
    for await (const state of this.#client.observe(this.key, options)) yield toLeader(state);
  }

  /**
   * Campaigns, runs `lead` while leader (its `signal` aborts when leadership ends), and
   * campaigns again, until `signal` aborts; then resigns if leading and resolves.
   */
  async run(
    lead: (leadership: Leadership) => Promise<void> | void,
    options: { signal?: AbortSignal } = {},
  ): Promise<void> {
    const { signal } = options;
    while (!signal?.aborted) {
      let leadership: Leadership;
      try {
        leadership = await this.campaign(signal ? { signal } : {});
      } catch (error) {
        if (signal?.aborted) return;
        throw error;
      }
      const onStop = () => void leadership.resign();
      signal?.addEventListener('abort', onStop, { once: true });
      try {
        await lead(leadership);
        await waitForAbort(leadership.signal);
      } finally {
        signal?.removeEventListener('abort', onStop);
        if (!leadership.signal.aborted || signal?.aborted) await leadership.resign();
      }
    }
  }
}

/** One term of leadership. */
class Term implements Leadership {
  readonly lease: Lease;
  readonly #controller = new AbortController();
  readonly #marginMs: number;
  #timer: NodeJS.Timeout | undefined;
  /** Whether the term ended by choice (resign, or a release of its lease), not by a loss. */
  resigned = false;

  constructor(lease: Lease, marginMs: number) {
    this.lease = lease;
    this.#marginMs = marginMs;
    lease.signal.addEventListener(
      'abort',
      () => {
        const reason: unknown = lease.signal.reason;
        // The lease was released through the handle (leadership.lease.release()): a
        // resignation too, not a loss. A lost lease aborts with a LeaseLostError.
        if (reason instanceof LeaseError && reason.code === 'lease_released') this.#resign();
        else this.#end(reason);
      },
      { once: true },
    );
    this.#arm();
  }

  get identity(): string {
    return this.lease.owner;
  }

  get epoch(): bigint {
    return this.lease.epoch;
  }

  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  remainingMs(): number {
    if (this.signal.aborted) return 0;
    return Math.max(0, this.lease.remainingMs() - this.#marginMs);
  }

  assertLeader(): void {
    this.lease.assertHeld();
    if (this.remainingMs() <= 0) this.#stepDown();
    if (this.signal.aborted) throw this.signal.reason;
  }

  async resign(): Promise<void> {
    this.#resign();
    await this.lease.release().catch(() => undefined);
  }

  #resign(): void {
    if (this.signal.aborted) return; // over already: lost, or resigned before
    this.resigned = true;
    this.#end(
      new LeaseError(
        'lease_released',
        `pg_lease: leadership of ${JSON.stringify(this.lease.key)} (term ${this.epoch}) resigned`,
      ),
    );
  }

  /** Re-checks at the margin before the deadline; renewals move the deadline on. */
  #arm(): void {
    clearTimeout(this.#timer);
    if (this.signal.aborted) return;
    const left = this.remainingMs();
    if (left <= 0) return this.#stepDown();
    this.#timer = setTimeout(() => this.#arm(), Math.min(Math.ceil(left), 2 ** 31 - 1));
    this.#timer.unref();
  }

  #stepDown(): void {
    this.#end(new LeaseLostError('expired', this.lease));
    void this.lease.release().catch(() => undefined);
  }

  #end(reason: unknown): void {
    clearTimeout(this.#timer);
    if (!this.#controller.signal.aborted) this.#controller.abort(reason);
  }
}

function toLeader(state: LeaseState | null): Leader | null {
  if (!state?.held || state.owner === null || state.expiresAt === null) return null;
  return { identity: state.owner, epoch: state.epoch, expiresAt: state.expiresAt };
}

function waitForAbort(signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) =>
    signal.addEventListener('abort', () => resolve(), { once: true }),
  );
}
