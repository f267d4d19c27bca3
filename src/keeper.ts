/**
 * Auto-renew ("keep alive") for a lease handle.
 *
 * The keeper only schedules: it calls the handle's renew on a period derived from the ttl, and
 * again sooner after a failure. Deciding that the lease is lost is not its job: the handle does
 * that, on a non-ok status or when its own deadline passes, so a keeper that is slow, starved or
 * stuck behind a blocked renew can delay renewals but never stretch the lease.
 */
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { durationMicroseconds, type Duration } from './duration.js';
import { LeaseError } from './errors.js';

/**
 * How a lease is kept alive.
 *
 * @example
 * import { LeaseClient } from 'pg-lease';
 * const lease = await new LeaseClient(pool).acquire('job-42', {
 *   ttl: '30s',
 *   keepAlive: { interval: '5s' }, // renew every 5 s instead of every ttl / 3
 * });
 */
export interface KeepAliveOptions {
  /**
   * Time between renewals. Default: a third of the ttl, which leaves two more attempts before
   * the lease would lapse. Must be shorter than the ttl (acquire refuses it otherwise).
   */
  interval?: Duration;
}

/** Longest delay Node's timers accept (about 24.8 days); longer waits are chained. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/** What schedules a handle's renewals: a {@link Keeper} of its own or the client's shared group. @internal */
export interface Scheduler {
  /**
   * Starts renewing. `since` is the monotonic time the grant's ttl is reckoned from (the
   * handle's deadline minus its ttl): the first renewal is due one interval after it, at once
   * when the grant took that long to arrive.
   */
  start(since: number): void;
  /**
   * A renewal the caller made succeeded; `since` is when its ttl started. The next renewal is
   * due one interval (of the ttl now in force) after it.
   */
  reschedule(since: number): void;
  stop(): void;
}

/** keepAlive.interval in milliseconds, undefined for the default (ttl / 3). @internal */
export function keepAliveIntervalMs(options: KeepAliveOptions): number | undefined {
  if (options.interval === undefined) return undefined;
  const micros = durationMicroseconds(options.interval);
  if (micros === undefined || micros <= 0)
    throw new RangeError('pg_lease: keepAlive.interval must be a positive finite duration');
  return micros / 1000;
}

/**
 * The time between keep-alive renewals: `keepAlive.interval` (see {@link keepAliveIntervalMs}),
 * else a third of the ttl in force. The one rule for every scheduler, and for the client's
 * judgement of when a grant that arrived late is already due for renewal. @internal
 */
export function keepAlivePeriodMs(intervalMs: number | undefined, ttlMs: number): number {
  return intervalMs ?? ttlMs / 3;
}

/** @internal */
export class Keeper implements Scheduler {
  readonly #renew: () => Promise<unknown>;
  readonly #ttlMs: () => number;
  readonly #intervalMs: number | undefined;
  readonly #stop = new AbortController();
  /** When the next renewal is due (monotonic ms), and the wait for it (stop and reschedule end it). */
  #next = 0;
  #nudge: AbortController | undefined;

  /**
   * @param renew renews once; rejects with a {@link LeaseError} when the lease is gone (the
   *   keeper then stops) and with anything else on a failure worth retrying.
   * @param ttlMs the ttl currently in force, read before every wait.
   */
  constructor(renew: () => Promise<unknown>, ttlMs: () => number, options: KeepAliveOptions) {
    this.#renew = renew;
    this.#ttlMs = ttlMs;
    this.#intervalMs = keepAliveIntervalMs(options);
  }

  start(since: number): void {
    this.#next = since + this.#period();
    void this.#run();
  }

  reschedule(since: number): void {
    this.#next = since + this.#period();
    this.#nudge?.abort();
  }

  stop(): void {
    this.#stop.abort();
    this.#nudge?.abort();
  }

  async #run(): Promise<void> {
    while (!this.#stop.signal.aborted) {
      const nudge = new AbortController();
      this.#nudge = nudge;
      const delay = Math.max(0, this.#next - performance.now());
      const slept = await sleepUntilStopped(delay, nudge.signal);
      this.#nudge = undefined;
      if (this.#stop.signal.aborted) return;
      if (!slept) continue; // rescheduled: wait for the new time
      try {
        await this.#renew();
        this.#next = performance.now() + this.#period();
      } catch (error) {
        if (error instanceof LeaseError) return;
        // A transient failure (connection refused, server restarting, ...): try again soon, for
        // as long as the handle's deadline allows; the handle gives up, not the keeper.
        this.#next = performance.now() + Math.min(1_000, Math.max(10, this.#ttlMs() / 10));
      }
    }
  }

  #period(): number {
    return keepAlivePeriodMs(this.#intervalMs, this.#ttlMs());
  }
}

/**
 * Waits `ms`, chaining timers past Node's limit; resolves false once `stop` aborts, else true.
 * Never keeps the process alive. @internal
 */
export async function sleepUntilStopped(ms: number, stop: AbortSignal): Promise<boolean> {
  let left = ms;
  while (left > 0) {
    const step = Math.min(left, MAX_TIMER_MS);
    try {
      await sleep(step, undefined, { signal: stop, ref: false });
    } catch {
      return false;
    }
    left -= step;
  }
  return !stop.aborted;
}
