/**
 * Acquiring below the client: one attempt, or waiting for a key without a transaction. Both
 * send through the session (sql/) and make the handle of a grant; the client only publishes
 * the outcome.
 *
 * A waiting acquire is a loop of non-blocking attempts, each its own short statement on a pooled
 * connection, with sleeps in between that end at the first of:
 * - a notification that the key was released (LISTEN on channel `pg_lease`, one listening
 *   connection per client, shared by every waiter);
 * - the holder's expiry, from the time left that the server measured (never the client's clock);
 * - the caller's `signal` aborting, or the wait's deadline;
 * - without notifications, the poll interval.
 *
 * No lost wake-up: the listening connection has run LISTEN before a waiter asks the server to
 * notify it (`lease.watch`, in the same statement as the denied attempt), and a release reads
 * that request from the key's own row, serialized with it by the row lock (see
 * extension/src/objects/37-watch.sql). A notification that arrives while an attempt is out is
 * remembered, so the waiter tries again instead of sleeping.
 *
 * Within one client, waiters of the same key take turns in arrival order: only the first one
 * listens and tries, so a release wakes one attempt per client instead of a herd.
 *
 * An exclusive waiter whose attempt found the key held by many (its shared phase, SEMANTICS
 * §13) waits in the server instead: its next attempts are lease.acquire with `wait`, one
 * statement per slice of its wait, during which the server marks the key so that no new
 * shared grant is made; otherwise a stream of overlapping readers, each granted before the
 * one before it releases, would keep it out for all of its wait. A slice holds a pooled
 * connection while it waits; the caller's abort and the deadline cancel it on the server, and
 * its end (timeout, cancel, failure) ends its transaction and with it the mark. At most half
 * the pool's connections besides the listening one wait in the server at once, counted for
 * the pool, of all the clients on it (a waiter that finds them taken waits in the client),
 * so that renewals always find a connection and no lease lapses for want of one. A client on one dedicated connection does not wait in the
 * server: that would hold up all of its calls.
 */
import { performance } from 'node:perf_hooks';
import type { Duration } from './duration.js';
import { LeaseAbortedError, LeaseTimeoutError } from './errors.js';
import { MAX_TIMER_MS, type KeepAliveOptions } from './keeper.js';
import { Lease, type LeaseCalls } from './lease.js';
import type { AcquiredRow, AcquireMode, Follow, HolderState, ObservedState } from './sql/calls.js';
import type { Notifier } from './sql/listener.js';
import type { Session } from './sql/session.js';
import { optionMs } from './validation.js';

export { NOTIFY_CHANNEL } from './sql/listener.js';

const DEFAULT_POLL_MS = 50;
/** How long one `lease.watch` asks for notifications; waiters refresh it at half. */
const WATCH_MS = 60_000;
/**
 * The shortest slice of a wait in the server (see above): a slice also lasts until the shared
 * grants live when it starts have expired (each slice's end unmarks the key for a moment), and
 * ends at the caller's deadline.
 */
const SERVER_SLICE_MS = 10_000;

/**
 * How waiters of a {@link LeaseClient} learn that a key was released.
 *
 * @example
 * import { LeaseClient } from 'pg-lease';
 * // Behind PgBouncer in transaction mode, where LISTEN does not work:
 * const client = new LeaseClient(pool, { notifications: false, pollInterval: 100 });
 */
export interface WaitingOptions {
  /**
   * `'auto'` (default): LISTEN on one connection of the pool, after checking once that a
   * notification sent through the pool comes back on it; if none does within 2 s (a pooler in
   * transaction mode), poll instead. `true`: LISTEN without that check. `false`: poll. A client
   * made on a single `pg.Client` always polls (its one connection runs the attempts).
   */
  notifications?: boolean | 'auto';
  /**
   * Time between attempts when not notified (default 50 ms). With notifications, waiters still
   * wake at the holder's expiry, so a lapse is taken over at once in both modes.
   */
  pollInterval?: Duration;
}

/** One attempt as made: the handle of its grant, or what a denied one said. */
interface AttemptResult {
  lease: Lease | null;
  /** Present for a denied attempt made with a `follow` request. */
  holder: HolderState | undefined;
  /** Monotonic time just before the attempt was sent. */
  sentAt: number;
  /** Monotonic time its answer arrived. */
  receivedAt: number;
}

export type { Follow, HolderState } from './sql/calls.js';

/**
 * One attempt, cancelled on the server when `signal` aborts: non-blocking, or with
 * `serverWaitMs` an exclusive acquire that waits in the server that long.
 */
type Attempt = (
  follow: Follow | undefined,
  signal: AbortSignal | undefined,
  serverWaitMs?: number,
) => Promise<AttemptResult>;

/** A key's state as observers get it (LeaseState in client.ts). */
type ObservedLeaseState = ObservedState['state'];

/** What one acquire asks for, and what its handle is made with. @internal */
export interface AcquireRequest {
  key: string;
  owner: string;
  ttlMicroseconds: number;
  keepAlive: KeepAliveOptions | undefined;
  /** The calls of the handle (its client's). */
  calls: LeaseCalls;
  /** An exclusive grant (default), a permit of a counted key, or a shared grant (§13). */
  mode?: AcquireMode;
}

/**
 * The waiting machinery of one client: the listening connection and the per-key queues.
 * @internal
 */
export class Waiting {
  readonly #session: Session;
  readonly #notifier: Notifier;
  readonly #pollMs: number;
  readonly #queues = new Map<string, Promise<void>>();
  /** Waits in the server now out on the pool, of every client on it (at most serverWaitSlots). */
  readonly #serverWaits: { count: number };

  constructor(session: Session, options: WaitingOptions) {
    this.#session = session;
    this.#notifier = session.listener;
    this.#serverWaits = session.serverWaits;
    this.#pollMs =
      options.pollInterval === undefined
        ? DEFAULT_POLL_MS
        : optionMs('pollInterval', options.pollInterval, 'positive');
  }

  /** Whether waiters are notified of releases (`undefined` until the first wait decided it). */
  get notifying(): boolean | undefined {
    return this.#notifier.verdict;
  }

  /**
   * Acquires the request's key: with `waitMs` 0 one attempt, resolving with the handle or
   * `null` when another owner holds the key; else waits for it (the loop described above). Either way
   * rejects with {@link LeaseAbortedError} when `signal` aborts, after giving back a grant that
   * raced the abort. The whole of an acquire below the client: it goes to the server (the
   * session) and makes the handle, and calls nothing of the client's.
   */
  async acquire(
    request: AcquireRequest,
    waitMs: number,
    signal: AbortSignal | undefined,
  ): Promise<Lease | null> {
    const attempt: Attempt = (follow, attemptSignal, serverWaitMs) =>
      this.#attempt(request, follow, attemptSignal, serverWaitMs);
    if (waitMs > 0) {
      // Only an exclusive acquire marks a key in its shared phase (§13), and only on a pool.
      const inServer =
        (request.mode ?? 'exclusive') === 'exclusive' && this.#session.serverWaitSlots > 0;
      return this.#wait(request.key, waitMs, signal, attempt, inServer);
    }
    try {
      const { lease } = await attempt(undefined, signal);
      if (!(lease && signal?.aborted)) return lease;
      await lease.release().catch(() => undefined);
    } catch (error) {
      if (!signal?.aborted) throw error;
    }
    throw new LeaseAbortedError(request.key, { cause: signal.reason as unknown });
  }

  /**
   * One non-blocking attempt, coalesced with its company when the session coalesces and
   * nothing can cancel it; a denied one with `follow` also reports the holder's state (see
   * {@link Session.acquire}). With `serverWaitMs`, an exclusive acquire that waits in the server
   * (see {@link Session.acquireWaiting}). A grant that waited long (for a row lock, or in the
   * server) between the send and the answer has less time left than the server granted,
   * counted from the send: the time left is then measured again from a fresh send, for the
   * handle's deadline.
   */
  async #attempt(
    request: AcquireRequest,
    follow: Follow | undefined,
    signal: AbortSignal | undefined,
    serverWaitMs?: number,
  ): Promise<AttemptResult> {
    const { key, owner, ttlMicroseconds } = request;
    const row: AcquiredRow & { holder?: HolderState } =
      serverWaitMs === undefined
        ? await this.#session.acquire(key, owner, ttlMicroseconds, follow, signal, request.mode)
        : await this.#session.acquireWaiting(
            key,
            owner,
            ttlMicroseconds,
            Math.max(1, Math.round(serverWaitMs * 1000)),
            signal,
          );
    const receivedAt = performance.now();
    const { sentAt } = row;
    if (!row.acquired) return { lease: null, holder: row.holder, sentAt, receivedAt };
    const measured =
      receivedAt - sentAt > ttlMicroseconds / 1000 / 10
        ? await this.#session.measureRemaining(key, owner, row.epoch!)
        : undefined;
    const lease = new Lease(
      request.calls,
      { key, owner, epoch: row.epoch!, ttlMicroseconds, confirmation: row, measured },
      request.keepAlive,
    );
    return { lease, holder: undefined, sentAt, receivedAt };
  }

  /**
   * Waits for `key` until `waitMs` has passed: resolves with the lease, rejects with
   * {@link LeaseTimeoutError} at the deadline or {@link LeaseAbortedError} when `signal` aborts.
   * `inServer`: wait in the server while the key is held by many (see above).
   */
  async #wait(
    key: string,
    waitMs: number,
    signal: AbortSignal | undefined,
    attempt: Attempt,
    inServer: boolean,
  ): Promise<Lease> {
    const started = performance.now();
    const deadline = started + waitMs;
    const stop = new Stop(deadline, signal);
    let leave!: () => void;
    const mine = new Promise<void>((resolve) => (leave = resolve));
    const before = this.#queues.get(key) ?? Promise.resolve();
    const turn = before.then(() => mine);
    this.#queues.set(key, turn);
    try {
      await stop.race(before);
      return await this.#cycle(key, deadline, waitMs, stop, attempt, inServer);
    } catch (error) {
      throw stop.translate(error, key, waitMs);
    } finally {
      stop.dispose();
      leave();
      if (this.#queues.get(key) === turn) this.#queues.delete(key);
    }
  }

  async #cycle(
    key: string,
    deadline: number,
    waitMs: number,
    stop: Stop,
    attempt: Attempt,
    inServer: boolean,
  ): Promise<Lease> {
    const subscription = this.#notifier.subscribe(key);
    // LISTEN (and, the first time, the check that notifications come back) runs while the
    // first attempt, a plain acquire, is out: a free key is granted without waiting for it.
    const firstListen = this.#notifier.listen();
    firstListen.catch(() => undefined);
    let first = true;
    let answered = false;
    let timedOut: TimeoutCause | undefined;
    // Set when the last answer said the key is held by many: the next attempt waits in the
    // server for a slice (with the holder's time left then, which the slice outlasts).
    let slice: { remainingMs: number } | undefined;
    try {
      for (;;) {
        stop.check();
        // Another waiter of this client may have taken the last slot since: wait in the client.
        if (slice && this.#serverWaits.count >= this.#session.serverWaitSlots) slice = undefined;
        const sliceMs = slice
          ? Math.min(
              deadline - performance.now(),
              Math.max(SERVER_SLICE_MS, slice.remainingMs + 1_000),
            )
          : 0;
        slice = undefined;
        const listening = first || sliceMs > 0 ? false : await stop.race(this.#notifier.listen());
        const seen = subscription.generation;
        const watchMs = Math.min(deadline - performance.now() + 1_000, WATCH_MS);
        const follow: Follow | undefined =
          first || sliceMs > 0
            ? undefined
            : listening
              ? { watchMicroseconds: Math.max(1, Math.round(watchMs * 1000)) }
              : { inspect: true };
        let result: AttemptResult;
        if (sliceMs > 0) this.#serverWaits.count++;
        try {
          result = await attempt(follow, stop.signal, sliceMs > 0 ? sliceMs : undefined);
          answered = true;
        } catch (error) {
          if (sliceMs > 0 && !stop.signal.aborted && isServerWaitEnded(error)) {
            // The slice ran out (the server's acquire timeout), or a statement_timeout or an
            // administrator's cancel ended it: its transaction, and the mark, ended with it.
            // A plain attempt tells next what holds the key. A statement_timeout would end
            // every slice alike: this acquire waits in the client from now on.
            answered = true;
            if (!(error instanceof LeaseTimeoutError)) inServer = false;
            if (performance.now() >= deadline) throw stop.timeout(key, waitMs, 'held');
            continue;
          }
          if (!stop.signal.aborted) throw error;
          // Cancelled by the deadline. Say "locked" only when the statement was waiting for
          // another transaction's row lock: on a slow server it may just not have answered.
          if (stop.timedOut)
            timedOut = waitedForRowLock(error) ? 'locked' : answered ? 'held' : 'unanswered';
          throw error;
        } finally {
          if (sliceMs > 0) this.#serverWaits.count--;
        }
        if (result.lease) {
          if (stop.signal.aborted && !stop.timedOut) {
            // Granted while the caller gave up: give it back, then report the abort.
            await result.lease.release().catch(() => undefined);
            stop.check();
          }
          return result.lease;
        }
        const now = performance.now();
        if (now >= deadline) throw stop.timeout(key, waitMs, 'held');
        if (first) {
          // Denied: from now on every attempt also watches (or inspects) the key.
          first = false;
          await stop.race(firstListen);
          continue;
        }

        let until = deadline;
        const holder = result.holder;
        if (holder && (!holder.found || !holder.held)) continue; // freed meanwhile: try now
        if (inServer && holder?.many && this.#serverWaits.count < this.#session.serverWaitSlots) {
          slice = { remainingMs: Math.max(0, holder.remainingMs ?? 0) };
          continue;
        }
        if (!listening || !holder?.notifies) until = Math.min(until, now + this.#pollMs);
        else until = Math.min(until, result.sentAt + watchMs / 2);
        // The server measured the time left while it answered: somewhere between the send and
        // the answer. Aim at the middle; an attempt that arrives early is denied and tells
        // how little is left, one round trip more. A key held by many (a counted key's permits,
        // shared grants) has a place free at the earliest of its grants' expiries.
        const remainingMs = holder?.earliestMs;
        if (remainingMs != null)
          until = Math.min(
            until,
            (result.sentAt + result.receivedAt) / 2 + Math.max(0, remainingMs),
          );
        await stop.sleepUntil(until, subscription.changed(seen));
      }
    } catch (error) {
      if (timedOut) throw stop.timeout(key, waitMs, timedOut);
      throw error;
    } finally {
      subscription.close();
    }
  }

  /**
   * The key's state now and after every change (held or not, owner, epoch), until `signal`
   * aborts. Sleeps like a waiter: until a notification for the key, the holder's expiry, or
   * (without notifications, or while nobody holds the key and no notification came) the poll
   * interval.
   */
  async *observe(key: string, signal: AbortSignal | undefined): AsyncGenerator<ObservedLeaseState> {
    const subscription = this.#notifier.subscribe(key);
    const stop = new Stop(Infinity, signal);
    let last: string | undefined;
    try {
      for (;;) {
        const listening = await stop.race(this.#notifier.listen());
        const seen = subscription.generation;
        const sentAt = performance.now();
        const answer = await stop.race(
          this.#session.observe(key, listening ? WATCH_MS : undefined),
        );
        const receivedAt = performance.now();
        const state = answer.state;
        const fingerprint = state ? `${state.held}|${state.owner}|${state.epoch}` : 'none';
        if (fingerprint !== last) {
          last = fingerprint;
          yield state;
        }
        let until =
          listening && answer.notifies ? sentAt + WATCH_MS / 2 : receivedAt + this.#pollMs;
        if (state?.held && answer.remainingMs !== null)
          until = Math.min(until, receivedAt + Math.max(0, answer.remainingMs));
        else until = Math.min(until, receivedAt + this.#pollMs);
        await stop.sleepUntil(until, subscription.changed(seen));
      }
    } catch (error) {
      if (error instanceof StopSignal) return;
      throw error;
    } finally {
      stop.dispose();
      subscription.close();
    }
  }

  /** Notifies everyone waiting for or observing `key` (a new holder announcing itself). */
  announce(key: string): Promise<void> {
    return this.#session.announce(key);
  }
}

/** The end of one wait: the caller's signal or the deadline, whichever comes first. */
class Stop {
  readonly #controller = new AbortController();
  readonly #signal: AbortSignal | undefined;
  #timer: NodeJS.Timeout;
  readonly #onAbort = () => this.#controller.abort(this.#signal?.reason);
  timedOut = false;

  constructor(deadline: number, signal: AbortSignal | undefined) {
    this.#signal = signal;
    if (signal?.aborted) this.#controller.abort(signal.reason);
    signal?.addEventListener('abort', this.#onAbort, { once: true });
    const delay = Math.max(0, Math.ceil(deadline - performance.now()));
    this.#timer = setTimeout(
      () => {
        if (performance.now() < deadline) return this.#rearm(deadline);
        this.timedOut = true;
        this.#controller.abort(new Error('deadline'));
      },
      Math.min(delay, MAX_TIMER_MS),
    );
  }

  #rearm(deadline: number): void {
    clearTimeout(this.#timer);
    this.#timer = setTimeout(
      () => {
        if (performance.now() < deadline) return this.#rearm(deadline);
        this.timedOut = true;
        this.#controller.abort(new Error('deadline'));
      },
      Math.min(Math.max(0, Math.ceil(deadline - performance.now())), MAX_TIMER_MS),
    );
  }

  /** Aborts at the deadline or when the caller's signal aborts. */
  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  /** Throws when the caller aborted (the deadline is reported by the caller). */
  check(): void {
    if (this.#signal?.aborted) throw new StopSignal();
    if (this.#controller.signal.aborted) throw new StopSignal();
  }

  /** `promise`, or a rejection as soon as the wait ends. */
  race<T>(promise: Promise<T>): Promise<T> {
    if (this.#controller.signal.aborted) return Promise.reject(new StopSignal());
    return new Promise<T>((resolve, reject) => {
      const onStop = () => reject(new StopSignal());
      this.#controller.signal.addEventListener('abort', onStop, { once: true });
      promise.then(
        (value) => {
          this.#controller.signal.removeEventListener('abort', onStop);
          resolve(value);
        },
        (error: unknown) => {
          this.#controller.signal.removeEventListener('abort', onStop);
          reject(error instanceof Error ? error : new Error(String(error)));
        },
      );
    });
  }

  /** Sleeps until `until` (monotonic) or `wake` resolves; rejects when the wait ends. */
  async sleepUntil(until: number, wake: Promise<void>): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const delay = until - performance.now();
    if (delay <= 0) return;
    try {
      await this.race(
        Promise.race([wake, new Promise<void>((resolve) => (timer = setTimeout(resolve, delay)))]),
      );
    } finally {
      clearTimeout(timer);
    }
  }

  timeout(key: string, waitMs: number, cause: TimeoutCause): LeaseTimeoutError {
    const quoted = `"${key.replaceAll('"', '""')}"`;
    const detail = {
      held: `key ${quoted} was still held after waiting ${waitMs} ms`,
      locked: `key ${quoted} was still locked by another transaction after waiting ${waitMs} ms`,
      unanswered: `key ${quoted} was not granted: no attempt had been answered after waiting ${waitMs} ms`,
    }[cause];
    return new LeaseTimeoutError(key, { detail });
  }

  /** The error a wait ends with: abort and deadline as the client's own errors. */
  translate(error: unknown, key: string, waitMs: number): unknown {
    if (error instanceof LeaseTimeoutError || error instanceof LeaseAbortedError) return error;
    if (this.#signal?.aborted)
      return new LeaseAbortedError(key, { cause: this.#signal.reason as unknown });
    if (this.timedOut) return this.timeout(key, waitMs, 'held');
    return error;
  }

  dispose(): void {
    clearTimeout(this.#timer);
    this.#signal?.removeEventListener('abort', this.#onAbort);
  }
}

/** Internal marker: the wait ended (abort or deadline); translated by {@link Stop.translate}. */
class StopSignal extends Error {
  override name = 'StopSignal';
}

/**
 * Why a wait ran out: the last answer said the key was held; the attempt at the deadline was
 * waiting for another transaction's row lock; or no attempt had answered at all.
 */
type TimeoutCause = 'held' | 'locked' | 'unanswered';

/**
 * Whether a wait in the server ended without an answer of its own: its acquire timed out
 * (LeaseTimeoutError), or it was cancelled (57014: statement_timeout, or a cancel by someone
 * other than this client, whose own cancels come with its signal aborted).
 */
function isServerWaitEnded(error: unknown): boolean {
  return (
    error instanceof LeaseTimeoutError || (error as { code?: unknown } | null)?.code === '57014'
  );
}

/**
 * Whether a cancelled statement was waiting for another transaction's row lock. PostgreSQL
 * names the tuple it waited for in the innermost line of the error's context ("while inserting
 * index tuple (0,2) in relation ..."); the words are translated, the tuple's (block,offset) is
 * not.
 */
function waitedForRowLock(error: unknown): boolean {
  const where = (error as { where?: unknown } | null)?.where;
  return typeof where === 'string' && /\(\d+,\d+\)/.test(where.split('\n', 1)[0]!);
}
