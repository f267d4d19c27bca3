/**
 * Keep-alive's options and rules, as the client's one scheduler (keep-alive-group.ts) and the
 * handles (lease.ts) share them.
 *
 * A scheduler only schedules: it calls the handle's renew on a period derived from the ttl, and
 * again sooner after a failure. Deciding that the lease is lost is not its job: the handle does
 * that, on a non-ok status or when its own deadline passes, so a scheduler that is slow, starved
 * or stuck behind a blocked renew can delay renewals but never stretch the lease.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { Duration } from './duration.js';
import { LeaseError, LeaseLostError } from './errors.js';
import type { RenewCall, RenewItem } from './sql/calls.js';
import { optionMs } from './validation.js';

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

/** What schedules a handle's renewals (the client's keep-alive group gives each handle one). @internal */
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

/**
 * How the keep-alive renews a handle without a closure, promise or timer of the handle's own:
 * one object for all handles of a kind (the handles' class holds the state), so a scheduled
 * handle costs the scheduler a reference, and a renewal that goes into a batch statement costs
 * no promise per handle. @internal
 */
export interface KeepAliveOps<H> {
  /** The ttl in force, ms (the default interval is a third of it). */
  ttlMs(handle: H): number;
  /**
   * Starts a renewal that goes out in a batch statement: its item, or `ended` (the handle is
   * lost or released: stop), or `single` (a renewal of the handle's own is out: renew through
   * {@link renewOne}, which queues behind it). Until {@link settle} or {@link failed}, the
   * handle's own renewals wait for this one.
   */
  begin(handle: H): RenewItem | 'ended' | 'single';
  /** The batch's answer for a begun renewal; whether the keep-alive goes on. */
  settle(handle: H, answer: RenewCall, ttlMicroseconds: number): boolean;
  /** A begun renewal failed without a verdict (a driver error); whether to retry. */
  failed(handle: H, error: unknown): boolean;
  /** One renewal on its own, queued behind the handle's others; rejects as `renew()` does. */
  renewOne(handle: H): Promise<unknown>;
}

/**
 * Whether a failed keep-alive renewal ends the keep-alive: only when the handle has ended (lost,
 * or released). Any other failure (a driver error, the connection inside a transaction block,
 * a commit a synchronous standby did not confirm) is retried soon, for as long as the handle's
 * deadline allows: the handle decides when it is lost, not its scheduler. @internal
 */
export function endsKeepAlive(error: unknown): boolean {
  return (
    error instanceof LeaseLostError ||
    (error instanceof LeaseError && error.code === 'lease_released')
  );
}

/** keepAlive.interval in milliseconds, undefined for the default (ttl / 3). @internal */
export function keepAliveIntervalMs(options: KeepAliveOptions): number | undefined {
  if (options.interval === undefined) return undefined;
  return optionMs('keepAlive.interval', options.interval, 'positive');
}

/**
 * The time between keep-alive renewals: `keepAlive.interval` (see {@link keepAliveIntervalMs}),
 * else a third of the ttl in force. The one rule for the scheduler, and for the client's
 * judgement of when a grant that arrived late is already due for renewal. @internal
 */
export function keepAlivePeriodMs(intervalMs: number | undefined, ttlMs: number): number {
  return intervalMs ?? ttlMs / 3;
}

/**
 * How long keep-alive waits before it tries again after a renewal that failed without a verdict
 * (a driver error): a tenth of the ttl, at least 10 ms and at most 1 s, so an outage shorter
 * than the ttl gets several tries. The one rule for the scheduler, and for the `retryInMs` that
 * a `renewalFailed` event announces. @internal
 */
export function keepAliveRetryMs(ttlMs: number): number {
  return Math.min(1_000, Math.max(10, ttlMs / 10));
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
