/**
 * What the client reports about leases, for logs, metrics and traces: one
 * `node:diagnostics_channel` channel per kind of event.
 *
 * Why diagnostics_channel and not an EventEmitter on the client: it is how Node's own modules
 * and libraries such as undici report what they do, so APM agents and metric exporters already
 * know how to consume it; a subscriber needs no reference to the {@link LeaseClient} (which a
 * library may create internally), one subscription covers every client in the process; and with
 * nobody subscribed it costs one property read per event: the client checks
 * the channel's `hasSubscribers` before it builds a message, and builds nothing otherwise.
 *
 * Subscribers run synchronously inside the client's code path. They must be quick and must not
 * throw: Node reports a subscriber's exception as an uncaught exception (on the next tick) and
 * carries on, so a throwing subscriber does not disturb the lease, but it may end the process.
 *
 * @example
 * import { subscribeLeaseEvents } from 'pg-lease';
 * const unsubscribe = subscribeLeaseEvents({
 *   lost: (event) => console.warn(`lost ${event.key} (${event.reason}, by ${event.source})`),
 * });
 */
import diagnostics_channel from 'node:diagnostics_channel';
import type { LeaseLostError, LostStatus } from './errors.js';

/** Fields every event about a grant carries. */
export interface LeaseEventBase {
  key: string;
  owner: string;
  /** The grant's fencing epoch. */
  epoch: bigint;
}

/**
 * A key was granted: `waitedMs` is the time from sending the acquire to its answer, so it
 * includes any `wait` for another owner to let go.
 *
 * @example
 * import type { AcquiredEvent } from 'pg-lease';
 * const log = (e: AcquiredEvent) => console.log(`${e.key} epoch ${e.epoch} after ${e.waitedMs} ms`);
 */
export interface AcquiredEvent extends LeaseEventBase {
  expiresAt: Date;
  waitedMs: number;
}

/**
 * An acquire got no grant: `held` (another owner holds the key, `wait` 0) or `timeout` (the
 * `wait` ran out).
 *
 * @example
 * import type { NotAcquiredEvent } from 'pg-lease';
 * const busy = (e: NotAcquiredEvent) => e.reason === 'timeout';
 */
export interface NotAcquiredEvent {
  key: string;
  owner: string;
  /**
   * `held` and `timeout` as above; `expired`: acquireMany's statement granted the key, but its
   * answer came so late that the grant had run out by the handle's reckoning (see
   * {@link AcquireLateEvent}); it was released and the call reports `null` for it.
   */
  reason: 'held' | 'timeout' | 'expired';
  waitedMs: number;
}

/**
 * An `acquireMany` statement answered so late that its grants were at risk: when the answer
 * arrived, their first keep-alive renewal was already due (one keep-alive interval, by default
 * a third of the ttl, had passed since the statement was sent, which is when every grant's
 * ttl counts from). Published once per such statement, before `acquireMany` returns, so a
 * subscriber knows before the caller acts on the handles.
 *
 * With `keepAlive` the client has renewed the statement's grants (one `lease.renew_many`)
 * before making their handles, and `renewed` is true. A grant that had run out anyway (by the
 * handle's deadline, or the renewal answered `lapsed`) is not handed out: `acquireMany` reports
 * `null` for it, releases it if the server may still list it, and names it in `expired`.
 *
 * @example
 * import type { AcquireLateEvent } from 'pg-lease';
 * const warn = (e: AcquireLateEvent) =>
 *   console.warn(`${e.keys.length} keys answered after ${e.waitedMs} ms, ${e.remainingMs} ms left`);
 */
export interface AcquireLateEvent {
  owner: string;
  /** The keys of the statement (at most 10000). */
  keys: readonly string[];
  ttlMs: number;
  /** From sending the statement to its answer. */
  waitedMs: number;
  /** Left on the grants by the handles' reckoning when the answer arrived: 0 or less, run out. */
  remainingMs: number;
  /** The client renewed the grants before handing them out (`keepAlive`). */
  renewed: boolean;
  /** Keys granted by the statement but reported `null` because their grant ran out. */
  expired: readonly string[];
}

/**
 * A renewal succeeded (automatic or `lease.renew()`); `latencyMs` is its round trip.
 *
 * @example
 * import type { RenewedEvent } from 'pg-lease';
 * const slow = (e: RenewedEvent) => e.latencyMs > 1_000;
 */
export interface RenewedEvent extends LeaseEventBase {
  expiresAt: Date;
  latencyMs: number;
}

/**
 * A renewal could not reach a verdict: the call failed (connection refused, server restarting,
 * a timeout...). `retrying` tells whether keep-alive will try again (it does while the lease's
 * deadline has not passed); `timeLeftMs` is what is left until that deadline. A renewal the
 * server answered with a status other than `ok` is not a failure but a {@link LostEvent}.
 *
 * @example
 * import type { RenewalFailedEvent } from 'pg-lease';
 * const urgent = (e: RenewalFailedEvent) => e.timeLeftMs < 5_000;
 * const next = (e: RenewalFailedEvent) =>
 *   e.retryInMs === undefined ? 'at the next renewal' : `in ${e.retryInMs} ms`;
 */
export interface RenewalFailedEvent extends LeaseEventBase {
  error: unknown;
  retrying: boolean;
  timeLeftMs: number;
  /**
   * When keep-alive's own renewal failed and it tries again: the wait before that try, a tenth
   * of the ttl between 10 ms and 1 s (near enough: handles of one renewal interval that fail
   * close together are retried together). Absent when nothing retries, and for a failed
   * `lease.renew()` call, after which keep-alive renews at its usual time.
   */
  retryInMs?: number;
}

/**
 * The lease was lost. `source` keeps the two kinds of loss apart:
 * - `server`: the server answered a renewal with `not_owner`, `lapsed` or `epoch_mismatch`
 *   (`reason`): the lease is gone for certain.
 * - `deadline`: the client's deadline passed without a confirmed renewal (`reason` `expired`),
 *   typically because the server could not be reached; `error` then has the last failure as
 *   its `cause`.
 *
 * @example
 * import type { LostEvent } from 'pg-lease';
 * const unreachable = (e: LostEvent) => e.source === 'deadline';
 */
export interface LostEvent extends LeaseEventBase {
  reason: LostStatus;
  source: 'server' | 'deadline';
  /** The {@link LeaseLostError} the lease's `signal` aborted with. */
  error: LeaseLostError;
}

/**
 * A release was answered: `status` `ok`, or why the lease was already gone.
 *
 * @example
 * import type { ReleasedEvent } from 'pg-lease';
 * const clean = (e: ReleasedEvent) => e.status === 'ok';
 */
export interface ReleasedEvent extends LeaseEventBase {
  status: 'ok' | 'not_owner' | 'lapsed' | 'epoch_mismatch';
  latencyMs: number;
  /** How long the lease was held, from its acquire's answer to this release's answer. */
  heldMs: number;
}

/**
 * A connection of the client's pool failed while nobody was using it (the server restarted or
 * terminated the session, the network dropped it). `connection` says which: an `idle` pool
 * connection, which the pool has already dropped (the next call opens a new one), or the
 * `listening` connection of waiters and observers, which the client gives back as broken and
 * opens again at the next wait. Not a lease event: a held lease notices an outage through its
 * renewals ({@link RenewalFailedEvent}). The client listens for these errors on any pool it
 * uses, also one passed in, so they never end the process.
 *
 * @example
 * import type { ConnectionErrorEvent } from 'pg-lease';
 * const log = (e: ConnectionErrorEvent) => console.warn(`${e.connection} connection: ${String(e.error)}`);
 */
export interface ConnectionErrorEvent {
  error: unknown;
  connection: 'idle' | 'listening';
}

/** Each event kind and its message. */
export interface LeaseEvents {
  acquired: AcquiredEvent;
  notAcquired: NotAcquiredEvent;
  acquireLate: AcquireLateEvent;
  renewed: RenewedEvent;
  renewalFailed: RenewalFailedEvent;
  lost: LostEvent;
  released: ReleasedEvent;
  connectionError: ConnectionErrorEvent;
}

/**
 * The diagnostics_channel name of each event kind.
 *
 * @example
 * import diagnostics_channel from 'node:diagnostics_channel';
 * import { LEASE_CHANNELS, type LostEvent } from 'pg-lease';
 * diagnostics_channel.subscribe(LEASE_CHANNELS.lost, (message) => {
 *   const event = message as LostEvent;
 *   console.warn(`lost ${event.key}: ${event.reason}`);
 * });
 */
export const LEASE_CHANNELS = {
  acquired: 'pg-lease:acquired',
  notAcquired: 'pg-lease:not-acquired',
  acquireLate: 'pg-lease:acquire-late',
  renewed: 'pg-lease:renewed',
  renewalFailed: 'pg-lease:renewal-failed',
  lost: 'pg-lease:lost',
  released: 'pg-lease:released',
  connectionError: 'pg-lease:connection-error',
} as const satisfies Record<keyof LeaseEvents, string>;

const channels = {
  acquired: diagnostics_channel.channel(LEASE_CHANNELS.acquired),
  notAcquired: diagnostics_channel.channel(LEASE_CHANNELS.notAcquired),
  acquireLate: diagnostics_channel.channel(LEASE_CHANNELS.acquireLate),
  renewed: diagnostics_channel.channel(LEASE_CHANNELS.renewed),
  renewalFailed: diagnostics_channel.channel(LEASE_CHANNELS.renewalFailed),
  lost: diagnostics_channel.channel(LEASE_CHANNELS.lost),
  released: diagnostics_channel.channel(LEASE_CHANNELS.released),
  connectionError: diagnostics_channel.channel(LEASE_CHANNELS.connectionError),
};

/**
 * Handlers for {@link subscribeLeaseEvents}, one per event kind, each optional.
 *
 * @example
 * import type { LeaseEventHandlers } from 'pg-lease';
 * const handlers: LeaseEventHandlers = { acquired: (e) => console.log(e.key) };
 */
export type LeaseEventHandlers = {
  [K in keyof LeaseEvents]?: (event: LeaseEvents[K]) => void;
};

/**
 * Subscribes the given handlers to their channels; returns a function that unsubscribes them.
 *
 * @example
 * import { subscribeLeaseEvents } from 'pg-lease';
 * const stop = subscribeLeaseEvents({
 *   renewalFailed: (e) => console.warn(`renew of ${e.key} failed, ${e.timeLeftMs} ms left`),
 * });
 * // ... later
 * stop();
 */
export function subscribeLeaseEvents(handlers: LeaseEventHandlers): () => void {
  const subscribed: [string, (message: unknown) => void][] = [];
  for (const kind of Object.keys(LEASE_CHANNELS) as (keyof LeaseEvents)[]) {
    const handler = handlers[kind] as ((event: unknown) => void) | undefined;
    if (!handler) continue;
    const listener = (message: unknown) => handler(message);
    diagnostics_channel.subscribe(LEASE_CHANNELS[kind], listener);
    subscribed.push([LEASE_CHANNELS[kind], listener]);
  }
  return () => {
    for (const [name, listener] of subscribed.splice(0))
      diagnostics_channel.unsubscribe(name, listener);
  };
}

/**
 * Whether anyone listens for `kind`; the hooks in client.ts and lease.ts build a message only
 * then. @internal
 */
export function observed(kind: keyof LeaseEvents): boolean {
  return channels[kind].hasSubscribers;
}

/** Publishes one event; call it only when {@link observed}. @internal */
export function publish<K extends keyof LeaseEvents>(kind: K, message: LeaseEvents[K]): void {
  channels[kind].publish(message);
}
