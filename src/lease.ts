/**
 * The lease handle: one grant of one key to one owner, with the client's view of how long it
 * may still act on it.
 *
 * The client never trusts its clock for absolute time. It keeps a deadline on the monotonic
 * clock instead: the moment the last successful acquire or renew was *sent*, plus the time the
 * server said was left on the grant (`expires_at - clock_timestamp()`, measured on the server
 * while it answered). The server granted or renewed no earlier than the send, so the deadline
 * falls no later than the server's expiry. When it passes without a newer confirmation, the
 * handle treats the lease as lost, whatever the server may still list.
 */
import { performance } from 'node:perf_hooks';
import type { Duration } from './duration.js';
import { LeaseError, LeaseLostError, type LostStatus } from './errors.js';
import type { LeaseStatus, RenewCall, RenewItem } from './sql/calls.js';
import { observed, publish } from './events.js';
import {
  keepAliveRetryMs,
  type KeepAliveOps,
  type KeepAliveOptions,
  type Scheduler,
} from './keeper.js';
import { Deadlines } from './deadlines.js';
import { validateInput } from './validation.js';

export type { LeaseStatus, RenewCall } from './sql/calls.js';

/** The server calls a handle makes; provided by the client. @internal */
export interface LeaseCalls {
  renew(key: string, owner: string, epoch: bigint, ttlMicroseconds: number): Promise<RenewCall>;
  release(key: string, owner: string, epoch: bigint): Promise<LeaseStatus>;
  /** Schedules keep-alive renewals (the client's one keep-alive group). */
  scheduler(ops: KeepAliveOps<Lease>, handle: Lease, options: KeepAliveOptions): Scheduler;
  /**
   * The handles' grants are permits or shared grants (SEMANTICS §13), which no batch statement
   * takes: the keep-alive renews each on its own, and `renew` and `release` send single calls.
   */
  readonly single?: boolean;
}

/**
 * The server's word on a grant's time left: measured while it answered a statement sent at
 * `sentAt`. @internal
 */
export interface Answer {
  /** Monotonic time (performance.now()) just before the statement was sent. */
  sentAt: number;
  /** Time left on the grant as the server measured it while answering, in milliseconds. */
  remainingMs: number | null;
}

/** An answer that confirms a grant (an acquire's or a renewal's): with the server's expiry. @internal */
export interface Confirmation extends Answer {
  expiresAt: Date | null;
}

/** A grant the server confirmed, as a handle is made of it. @internal */
export interface Grant {
  key: string;
  owner: string;
  epoch: bigint;
  ttlMicroseconds: number;
  /** The acquire's answer, or a renewal of the grant sent since (whose expiry then counts). */
  confirmation: Confirmation;
  /** The time left measured again from a fresh send, when the confirmation came late. */
  measured?: Answer;
}

/** A settled promise for a renewal that queues behind none. */
const SETTLED: Promise<void> = Promise.resolve();

/** See the static block of {@link Lease}. */
let keepAliveOps: KeepAliveOps<Lease>;
/** The deadline timers of all handles (see deadlines.ts). */
let deadlines: Deadlines<Lease>;

/**
 * A held lease. Act on the resource only while `signal` is not aborted, and pass `epoch` to
 * every fenced write so that a resource can reject a stale holder.
 *
 * Handles come from {@link LeaseClient.acquire}, {@link LeaseClient.acquireMany} and
 * {@link LeaseClient.withLease}; {@link LeaseClient.releaseMany} releases many in one statement.
 *
 * @example
 * import { LeaseClient } from 'pg-lease';
 * const client = new LeaseClient(process.env.DATABASE_URL!);
 * await using lease = await client.acquire('job-42', { ttl: '30s', keepAlive: true });
 * if (lease) {
 *   await db.query('UPDATE jobs SET result = $1, epoch = $2 WHERE id = 42 AND epoch <= $2', [
 *     result,
 *     lease.epoch.toString(),
 *   ]);
 * } // released here
 */
export class Lease implements AsyncDisposable {
  /** The leased key. */
  readonly key: string;
  /** The owner identity the lease was granted to. */
  readonly owner: string;
  /**
   * The fencing epoch of this grant: greater than every epoch granted before for the key.
   * A `bigint`, like the column; send it as `lease.epoch.toString()` to node-postgres.
   */
  readonly epoch: bigint;

  readonly #calls: LeaseCalls;
  /**
   * Made when `signal` is first read: an AbortSignal is most of a handle's memory (about 0.7 kB),
   * and a process holding many leases kept alive by the shared keep-alive may never read one.
   */
  #controller: AbortController | undefined;
  /** Why the handle ended (lost, or `released` until {@link #reason} makes its error); `undefined` while held. */
  #ended: LeaseError | 'released' | undefined;
  #expiresAt: Date;
  #ttlMicroseconds: number;
  #deadline: number;
  /** The whole millisecond its deadline timer is due at (see {@link deadlines}); undefined when none is armed. */
  #timerAt: number | undefined;
  #keeper: Scheduler | undefined;
  /** The last of the renewals queued on this handle, until it settles (see #renewSerialized). */
  #renewals: Promise<unknown> | undefined;
  /** A keep-alive renewal of a batch statement is out (see {@link keepAliveOps}). */
  #batchOut = false;
  /** Made when a renewal has to wait for that one: resolves when it settles. */
  #batchSettled: { promise: Promise<void>; resolve: () => void } | undefined;
  #release: Promise<LeaseStatus> | undefined;
  /** The driver error of the last renewal, kept as the cause if the deadline passes next. */
  #lastFailure: unknown;
  /** Monotonic time the handle was made (the grant's answer), for the released event. */
  readonly #grantedAt = performance.now();

  /**
   * @internal The one place a grant becomes a handle, for every way of acquiring (single,
   * waiting, coalesced, acquireMany): the handle's deadline is {@link deadlineOf} its
   * confirmation, whichever path brought it, so that no path can count differently. Handles
   * are made by {@link LeaseClient}.
   */
  constructor(calls: LeaseCalls, grant: Grant, keepAlive?: KeepAliveOptions) {
    this.#calls = calls;
    this.key = grant.key;
    this.owner = grant.owner;
    this.epoch = grant.epoch;
    this.#expiresAt = grant.confirmation.expiresAt!;
    this.#ttlMicroseconds = grant.ttlMicroseconds;
    this.#deadline = deadlineOf(grant.confirmation, grant.measured);
    this.#armDeadline();
    if (keepAlive && !this.#ended) {
      this.#keeper = calls.scheduler(keepAliveOps, this, keepAlive);
      this.#keeper.start(this.#deadline - this.#ttlMicroseconds / 1000);
    }
  }

  static {
    // The keep-alive's way into every handle, one object for all (see KeepAliveOps): no
    // closures per handle, and a renewal in a batch statement makes no promise of its own.
    keepAliveOps = {
      ttlMs: (lease) => lease.#ttlMicroseconds / 1000,
      begin: (lease) => {
        if (lease.#ended) return 'ended';
        // A renewal of the handle's own is out or queued: this one queues behind it. A permit
        // or shared grant is renewed on its own: renew_many refuses it (§13).
        if (lease.#renewals !== undefined || lease.#calls.single) return 'single';
        if (performance.now() >= lease.#deadline) {
          lease.#lose('expired', lease.#lastFailure);
          return 'ended';
        }
        lease.#batchOut = true;
        return {
          key: lease.key,
          owner: lease.owner,
          epoch: lease.epoch,
          ttlMicroseconds: lease.#ttlMicroseconds,
        } satisfies RenewItem;
      },
      settle: (lease, answer, ttlMicroseconds) => {
        lease.#batchDone();
        // Lost or released while the statement was out: a late success does not bring it back.
        if (lease.#ended) return false;
        try {
          lease.#confirmed(answer, ttlMicroseconds);
        } catch {
          return false; // lost, or ended while the statement was out
        }
        return !lease.#ended;
      },
      failed: (lease, error) => {
        lease.#batchDone();
        lease.#failed(error, true);
        return !lease.#ended;
      },
      renewOne: (lease) => lease.#renewSerialized(undefined, true),
    };
    deadlines = new Deadlines((lease, at) => {
      // Not re-armed since (nor stopped): the timer of this handle.
      if (lease.#timerAt !== at) return;
      lease.#timerAt = undefined;
      lease.#armDeadline();
    });
  }

  /** The batch renewal that was out has settled: renewals waiting for it go on. */
  #batchDone(): void {
    this.#batchOut = false;
    const waiting = this.#batchSettled;
    this.#batchSettled = undefined;
    waiting?.resolve();
  }

  /** @internal Whether `value` is a handle made with one of `calls` (one client's calls). */
  static madeWith(value: unknown, ...calls: LeaseCalls[]): value is Lease {
    return (
      typeof value === 'object' && value !== null && #calls in value && calls.includes(value.#calls)
    );
  }

  /**
   * Server time at which the grant expires, as of the last acquire or successful renew. For
   * display: the client's own decisions use its monotonic deadline, never this timestamp.
   */
  get expiresAt(): Date {
    return this.#expiresAt;
  }

  /**
   * Aborts when the lease is lost (reason: a {@link LeaseLostError}) or released (reason: a
   * {@link LeaseError} with code `lease_released`). Pass it to whatever the lease guards.
   */
  get signal(): AbortSignal {
    if (!this.#controller) {
      this.#controller = new AbortController();
      if (this.#ended) this.#controller.abort(this.#reason());
    }
    return this.#controller.signal;
  }

  /**
   * Milliseconds the holder may still act, from the handle's monotonic deadline (see the module
   * comment), read now: 0 once lost, released or past the deadline. Unlike `signal`, which
   * aborts when a timer runs, this is right also just after the event loop stalled.
   *
   * @example
   * if (lease.remainingMs() < 500) return; // too little left to start another step
   */
  remainingMs(): number {
    if (this.#ended) return 0;
    return Math.max(0, this.#deadline - performance.now());
  }

  /**
   * Throws unless the lease is still held by the handle's reckoning, checked now: the
   * {@link LeaseLostError} (or the release's {@link LeaseError}) that `signal` carries, after
   * marking the lease lost when its deadline has passed without a timer having noticed yet.
   *
   * @example
   * lease.assertHeld(); // right before an action that must not happen after a loss
   * await writeFenced(row, lease.epoch);
   */
  assertHeld(): void {
    if (!this.#ended && performance.now() >= this.#deadline)
      this.#lose('expired', this.#lastFailure);
    this.#throwIfEnded();
  }

  /** The loss, once the lease is lost; `undefined` while held or after a plain release. */
  get lost(): LeaseLostError | undefined {
    return this.#ended instanceof LeaseLostError ? this.#ended : undefined;
  }

  /**
   * Extends the grant to server time + `ttl` (default: the ttl it was acquired or last renewed
   * with); the epoch never changes. Resolves with the new expiry. Rejects with a
   * {@link LeaseLostError} when the server reports `not_owner`, `lapsed` or `epoch_mismatch`
   * or when the handle's deadline has passed; the handle is lost from then on. A driver error
   * (connection refused, ...) is rethrown as is and leaves the handle as it was.
   *
   * @example
   * const expiresAt = await lease.renew('1m');
   */
  async renew(ttl?: Duration): Promise<Date> {
    const ttlMicroseconds =
      ttl === undefined
        ? undefined
        : validateInput('renew', { key: this.key, owner: this.owner, epoch: this.epoch, ttl })
            .ttlMicroseconds;
    const expiresAt = await this.#renewSerialized(ttlMicroseconds);
    // The keep-alive counts from this renewal, at the interval of the ttl now in force: a
    // shorter ttl must not wait for the old interval.
    this.#keeper?.reschedule(this.#deadline - this.#ttlMicroseconds / 1000);
    return expiresAt;
  }

  /**
   * Ends the grant: the key becomes free and its epoch moves on, which fences this one.
   * Stops keep-alive and aborts `signal` first. Resolves with the server's status (`ok`, or
   * why the lease was already gone); calling it again returns the same answer. A lost lease is
   * released too, in case the server still lists it.
   *
   * @example
   * const status = await lease.release(); // 'ok'
   */
  release(): Promise<LeaseStatus> {
    if (!this.#release) {
      this.#stop('released');
      const sentAt = performance.now();
      this.#release = this.#calls.release(this.key, this.owner, this.epoch).then(
        (status) => {
          if (observed('released'))
            publish('released', {
              ...this.#identity(),
              status,
              latencyMs: performance.now() - sentAt,
              heldMs: performance.now() - this.#grantedAt,
            });
          return status;
        },
        (error: unknown) => {
          this.#release = undefined; // a failed release may be retried
          throw error;
        },
      );
    }
    return this.#release;
  }

  /** Releases the lease, for `await using lease = await client.acquire(...)`. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.release();
  }

  /**
   * Renewals run one at a time, so the deadline always comes from the last one the server ran.
   * `byKeepAlive`: the keep-alive's own renewal, which it retries soon if it fails.
   */
  #renewSerialized(ttlMicroseconds?: number, byKeepAlive = false): Promise<Date> {
    let prior = this.#renewals;
    if (prior === undefined && this.#batchOut) {
      // Behind the keep-alive's renewal in a batch statement.
      let resolve!: () => void;
      const promise = new Promise<void>((r) => (resolve = r));
      this.#batchSettled ??= { promise, resolve };
      prior = this.#batchSettled.promise;
    }
    // Without a ttl (keep-alive, renew()), the ttl in force when the renewal runs: one queued
    // behind a renew(ttl) must not put the old ttl back.
    const renewal = (prior ?? SETTLED).then(() =>
      this.#renewOnce(ttlMicroseconds ?? this.#ttlMicroseconds, byKeepAlive),
    );
    // Forgotten once settled, unless another renewal queued behind it meanwhile.
    const last: Promise<unknown> = renewal.then(
      () => {
        if (this.#renewals === last) this.#renewals = undefined;
      },
      () => {
        if (this.#renewals === last) this.#renewals = undefined;
      },
    );
    this.#renewals = last;
    return renewal;
  }

  async #renewOnce(ttlMicroseconds: number, byKeepAlive: boolean): Promise<Date> {
    this.#throwIfEnded();
    if (performance.now() >= this.#deadline) this.#lose('expired', this.#lastFailure);
    this.#throwIfEnded();
    let call: RenewCall;
    try {
      call = await this.#calls.renew(this.key, this.owner, this.epoch, ttlMicroseconds);
    } catch (error) {
      this.#failed(error, byKeepAlive);
      throw error;
    }
    return this.#confirmed(call, ttlMicroseconds);
  }

  /** A renewal failed without a verdict (a driver error): kept as the cause, and told. */
  #failed(error: unknown, byKeepAlive: boolean): void {
    this.#lastFailure = error;
    if (!observed('renewalFailed')) return;
    const timeLeftMs = Math.max(0, this.#deadline - performance.now());
    const retrying = this.#keeper !== undefined && !this.#ended && timeLeftMs > 0;
    publish('renewalFailed', {
      ...this.#identity(),
      error,
      retrying,
      timeLeftMs,
      // The keep-alive retries its own renewal after keepAliveRetryMs (keep-alive-group.ts).
      ...(retrying && byKeepAlive
        ? { retryInMs: keepAliveRetryMs(this.#ttlMicroseconds / 1000) }
        : {}),
    });
  }

  /**
   * The server's answer to a renewal: the new deadline, or the loss. Throws the loss (or the
   * release) when the handle has ended, also when it ended while the renewal was out.
   */
  #confirmed(call: RenewCall, ttlMicroseconds: number): Date {
    this.#lastFailure = undefined;
    // Lost or released while the call was out: a late success does not bring the lease back.
    this.#throwIfEnded();
    if (call.status !== 'ok') {
      this.#lose(call.status);
      this.#throwIfEnded();
    }
    this.#ttlMicroseconds = ttlMicroseconds;
    this.#expiresAt = call.expiresAt!;
    this.#deadline = deadlineOf(call);
    this.#armDeadline();
    this.#throwIfEnded();
    if (observed('renewed'))
      publish('renewed', {
        ...this.#identity(),
        expiresAt: this.#expiresAt,
        latencyMs: performance.now() - call.sentAt,
      });
    return this.#expiresAt;
  }

  #throwIfEnded(): void {
    if (!this.#ended) return;
    // Thrown, a release's reason gets a stack (the signal's has none; see releasedError).
    if (this.#ended === 'released' || this.#ended.code === 'lease_released')
      throw releasedError(this.key, this.epoch, true);
    throw this.#ended;
  }

  /**
   * Makes sure a timer fires by the deadline. A renewal only moves the deadline later, mostly:
   * the timer already armed then fires first, finds the deadline moved and re-arms for the rest,
   * so a lease renewed every few seconds re-arms about once a ttl, not at every renewal.
   */
  #armDeadline(): void {
    const now = performance.now();
    // Timers have whole milliseconds: the last one is aimed at most 1 ms early and the loss
    // taken then, never a re-armed millisecond late. A waiter elsewhere can be granted the key
    // within a millisecond of the server expiry, which the deadline precedes by little more
    // than the renew's trip to the server.
    if (deadlinePassed(this.#deadline, now)) {
      this.#timerAt = undefined;
      this.#lose('expired', this.#lastFailure);
      return;
    }
    if (this.#timerAt !== undefined && this.#timerAt <= this.#deadline) return;
    // The last whole millisecond not after the deadline: due then, at least 1 ms from now.
    const at = Math.floor(this.#deadline);
    this.#timerAt = at;
    deadlines.add(this, at);
  }

  #lose(status: LostStatus, cause?: unknown): void {
    if (this.#ended) return;
    const error = new LeaseLostError(status, this, cause === undefined ? undefined : { cause });
    this.#stop(error);
    if (observed('lost'))
      publish('lost', {
        ...this.#identity(),
        reason: status,
        source: status === 'expired' ? 'deadline' : 'server',
        error,
      });
  }

  #identity(): { key: string; owner: string; epoch: bigint } {
    return { key: this.key, owner: this.owner, epoch: this.epoch };
  }

  #stop(reason: LeaseError | 'released'): void {
    this.#timerAt = undefined;
    this.#keeper?.stop();
    if (this.#ended) return;
    this.#ended = reason;
    if (this.#controller) this.#controller.abort(this.#reason());
  }

  /**
   * Why the handle ended, as `signal` carries it. A release's reason is made only when a signal
   * needs it: most released handles never had their signal read.
   */
  #reason(): LeaseError {
    if (this.#ended === 'released') this.#ended = releasedError(this.key, this.epoch, false);
    return this.#ended!;
  }
}

/**
 * The deadline rule, for every grant and every renewal (see the module comment): the send of
 * the statement that confirmed the grant plus the time the server measured left while
 * answering it. Never the answer's arrival, which comes after the server's measure by a
 * return trip or an event-loop stall, nor `expiresAt`, which would trust the client's wall
 * clock. A second measure from a fresh send (`measured`, taken when the confirmation came late)
 * can only move the deadline later. @internal
 */
export function deadlineOf(confirmation: Confirmation, measured?: Answer): number {
  const deadline = confirmation.sentAt + (confirmation.remainingMs ?? 0);
  if (measured === undefined) return deadline;
  return Math.max(deadline, measured.sentAt + (measured.remainingMs ?? 0));
}

/**
 * Whether a handle with this monotonic deadline counts as lost at `now`: timers have whole
 * milliseconds, so less than one left is none (see the handle's #armDeadline). A client that
 * makes a handle checks it first, so as not to hand out one that is lost at birth. @internal
 */
export function deadlinePassed(deadline: number, now = performance.now()): boolean {
  return deadline - now < 1;
}

/**
 * The error of a released handle. The reason its signal carries is a marker, not a failure, so
 * it is made without a stack trace (capturing one was the largest cost of a release in the
 * client's CPU profile); thrown at a caller, it has one.
 */
function releasedError(key: string, epoch: bigint, stack: boolean): LeaseError {
  const limit = Error.stackTraceLimit;
  if (!stack) Error.stackTraceLimit = 0;
  try {
    return new LeaseError(
      'lease_released',
      `pg_lease: lease on ${JSON.stringify(key)} (epoch ${epoch}) was released`,
    );
  } finally {
    Error.stackTraceLimit = limit;
  }
}
