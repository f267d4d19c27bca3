/**
 * What `pg-lease exec --verbose` tells while it holds a lease: one line per event, always on
 * stderr, since stdout belongs to the command. As text a line reads `pg-lease: ...`; with
 * --json it is one JSON object, `{"event", "at", ...}`, and every event of the run is there
 * (docs/cli.md has the table). The lease's events are the client's own, taken from its
 * diagnostics channels (events.ts): the grant, each renewal, a renewal that failed and when it
 * is tried again, a broken connection, the loss, the release. This file only words them; exec
 * adds the events of the command it runs (started, signals, exited).
 */
import { performance } from 'node:perf_hooks';
import type { Lease } from '../lease.js';
import {
  subscribeLeaseEvents,
  type AcquiredEvent,
  type LostEvent,
  type ReleasedEvent,
  type RenewalFailedEvent,
  type RenewedEvent,
} from '../events.js';
import { toJson } from './common.js';
import { describeFailure, type Failure } from './errors.js';
import { timeLeft } from './list.js';

/** The grant's identity, as every event about it carries it. */
interface Identity {
  key: string;
  owner: string;
  epoch: bigint;
}

/** Every event of the stream, by its `event` name. */
export type ExecEvent =
  | { event: 'waiting'; key: string; wait: string; waitMs: number }
  | ({ event: 'acquired'; expiresAt: Date; timeLeftMs: number; waitedMs: number } & Identity)
  | {
      event: 'notAcquired';
      key: string;
      owner: string;
      reason: 'held' | 'timeout' | 'expired';
      waitedMs: number;
    }
  | { event: 'started'; pid: number; command: string[] }
  | ({ event: 'renewed'; expiresAt: Date; timeLeftMs: number; latencyMs: number } & Identity)
  | ({
      event: 'renewalFailed';
      error: Failure;
      retrying: boolean;
      retryInMs?: number;
      timeLeftMs: number;
    } & Identity)
  | { event: 'connectionError'; connection: 'idle' | 'listening'; error: Failure }
  | ({
      event: 'recovered';
      failedRenewals: number;
      connectionErrors: number;
      outageMs: number;
      timeLeftMs: number;
    } & Identity)
  | ({
      event: 'lost';
      reason: LostEvent['reason'];
      source: LostEvent['source'];
      error: Failure;
    } & Identity)
  | { event: 'signal'; signal: NodeJS.Signals; reason: 'forwarded' | 'lost' | 'grace' }
  | { event: 'exited'; pid: number | null; exitCode: number | null; signal: NodeJS.Signals | null }
  | ({
      event: 'released';
      status: ReleasedEvent['status'];
      heldMs: number;
      latencyMs: number;
    } & Identity)
  | ({ event: 'releaseFailed'; error: Failure } & Identity);

/** The lease events that wait for the grant's line (see {@link ExecReporter.granted}). */
type LeaseLine = Extract<ExecEvent, Identity>;

/** What went wrong since the last confirmed renewal, for `recovered`. */
interface Trouble {
  /** Monotonic time of the first failed renewal or connection error. */
  since: number;
  failedRenewals: number;
  connectionErrors: number;
}

/**
 * Writes the events of one `exec` run to stderr, and follows the client's events of its key
 * once {@link follow} is called. With `enabled` false (no --verbose) it writes nothing.
 */
export class ExecReporter {
  readonly #enabled: boolean;
  readonly #json: boolean;
  readonly #key: string;
  #unsubscribe: (() => void) | undefined;
  /** The grant being followed, once acquire has answered. */
  #lease: Lease | undefined;
  #acquired: AcquiredEvent | undefined;
  /** Lease events that came before the grant's line (a grant lost at birth): told after it. */
  #early: LeaseLine[] = [];
  #trouble: Trouble | undefined;

  constructor(options: { enabled: boolean; json: boolean; key: string }) {
    this.#enabled = options.enabled;
    this.#json = options.json;
    this.#key = options.key;
  }

  /** Subscribes to the client's events of the key (one client per process: exec's). */
  follow(): void {
    if (!this.#enabled || this.#unsubscribe) return;
    this.#unsubscribe = subscribeLeaseEvents({
      acquired: (event) => {
        if (event.key === this.#key) this.#acquired = event;
      },
      notAcquired: (event) => {
        if (event.key !== this.#key) return;
        this.emit({
          event: 'notAcquired',
          key: event.key,
          owner: event.owner,
          reason: event.reason,
          waitedMs: event.waitedMs,
        });
      },
      renewed: (event) => this.#renewed(event),
      renewalFailed: (event) => this.#renewalFailed(event),
      connectionError: (event) => {
        this.#troubleSeen().connectionErrors += 1;
        this.emit({
          event: 'connectionError',
          connection: event.connection,
          error: failureOf(event.error),
        });
      },
      lost: (event) => this.#lost(event),
      released: (event) => {
        if (!this.#ours(event)) return;
        this.#leaseLine({
          event: 'released',
          ...identity(event),
          status: event.status,
          heldMs: event.heldMs,
          latencyMs: event.latencyMs,
        });
      },
    });
  }

  /** The grant acquire answered with: tells it, then what happened to it meanwhile. */
  granted(lease: Lease): void {
    if (!this.#enabled) return;
    this.#lease = lease;
    // The grant is itself an answer of the server: trouble before it (the listening
    // connection of a wait) is over.
    this.#trouble = undefined;
    this.emit({
      event: 'acquired',
      ...identity(lease),
      expiresAt: lease.expiresAt,
      timeLeftMs: lease.remainingMs(),
      waitedMs: this.#acquired?.waitedMs ?? 0,
    });
    for (const line of this.#early.splice(0)) if (this.#ours(line)) this.emit(line);
  }

  /** Writes one event, as text or JSON; an event text leaves to exec's own lines is JSON only. */
  emit(event: ExecEvent): void {
    if (!this.#enabled) return;
    if (this.#json) {
      process.stderr.write(
        `${toJson({ event: event.event, at: new Date(), ...rounded(event) })}\n`,
      );
      return;
    }
    const text = describe(event);
    if (text !== undefined) process.stderr.write(`pg-lease: ${text}\n`);
  }

  close(): void {
    this.#unsubscribe?.();
    this.#unsubscribe = undefined;
  }

  #renewed(event: RenewedEvent): void {
    if (!this.#ours(event)) return;
    // The handle's deadline has moved by now (the event is published after), so this is the
    // time left after this renewal.
    const timeLeftMs = this.#lease?.remainingMs() ?? 0;
    this.#leaseLine({
      event: 'renewed',
      ...identity(event),
      expiresAt: event.expiresAt,
      timeLeftMs,
      latencyMs: event.latencyMs,
    });
    const trouble = this.#trouble;
    if (!trouble) return;
    this.#trouble = undefined;
    this.#leaseLine({
      event: 'recovered',
      ...identity(event),
      failedRenewals: trouble.failedRenewals,
      connectionErrors: trouble.connectionErrors,
      outageMs: performance.now() - trouble.since,
      timeLeftMs,
    });
  }

  #renewalFailed(event: RenewalFailedEvent): void {
    if (!this.#ours(event)) return;
    this.#troubleSeen().failedRenewals += 1;
    this.#leaseLine({
      event: 'renewalFailed',
      ...identity(event),
      error: failureOf(event.error),
      retrying: event.retrying,
      ...(event.retryInMs === undefined ? {} : { retryInMs: event.retryInMs }),
      timeLeftMs: event.timeLeftMs,
    });
  }

  #lost(event: LostEvent): void {
    if (!this.#ours(event)) return;
    this.#trouble = undefined;
    this.#leaseLine({
      event: 'lost',
      ...identity(event),
      reason: event.reason,
      source: event.source,
      error: failureOf(event.error),
    });
  }

  #troubleSeen(): Trouble {
    return (this.#trouble ??= { since: performance.now(), failedRenewals: 0, connectionErrors: 0 });
  }

  /** An event of the followed grant (before the grant is known: of its key). */
  #ours(event: Identity): boolean {
    if (event.key !== this.#key) return false;
    const lease = this.#lease;
    return lease === undefined || (event.owner === lease.owner && event.epoch === lease.epoch);
  }

  #leaseLine(line: LeaseLine): void {
    if (this.#lease) this.emit(line);
    else this.#early.push(line);
  }
}

function identity(of: Identity): Identity {
  return { key: of.key, owner: of.owner, epoch: of.epoch };
}

/** An error as every --json error is printed (`{"code", "message", ...}`). */
export function failureOf(error: unknown): Failure {
  return describeFailure(error, [], 'exec').failure;
}

/** Milliseconds to a tenth, as `list` prints `remainingMs`; everything else as it is. */
function rounded(event: ExecEvent): Record<string, unknown> {
  return Object.fromEntries(
    Object.entries(event).map(([name, value]) => [
      name,
      name.endsWith('Ms') && typeof value === 'number' ? Math.round(value * 10) / 10 : value,
    ]),
  );
}

/** The text line of an event; undefined for those exec words itself when they happen. */
function describe(event: ExecEvent): string | undefined {
  switch (event.event) {
    case 'waiting':
      return `waiting up to ${event.wait} for ${event.key}`;
    case 'acquired':
      return `holding ${event.key} as ${event.owner}, epoch ${event.epoch}: ${timeLeft(event.timeLeftMs)} left (expires ${event.expiresAt.toISOString()}, server time)`;
    case 'notAcquired':
      return undefined; // exec's "not acquired: ..." line says it
    case 'started':
      return `started ${event.command[0]} (pid ${event.pid})`;
    case 'renewed':
      return `renewed ${event.key}: ${timeLeft(event.timeLeftMs)} left (round trip ${timeLeft(event.latencyMs)})`;
    case 'renewalFailed':
      return `renewal of ${event.key} failed: ${event.error.message}; ${
        event.retrying
          ? `retrying ${event.retryInMs === undefined ? 'at the next renewal' : `in ${timeLeft(event.retryInMs)}`}`
          : 'not retrying'
      }, ${timeLeft(event.timeLeftMs)} left`;
    case 'connectionError':
      return `connection lost (${event.connection === 'idle' ? 'an idle pool connection' : 'the listening connection'}): ${event.error.message}`;
    case 'recovered': {
      const what = [
        plural(event.failedRenewals, 'failed renewal'),
        plural(event.connectionErrors, 'connection error'),
      ].filter((part) => part !== undefined);
      return `recovered: ${event.key} renewed after ${what.join(' and ')}, ${timeLeft(event.outageMs)} after the first; ${timeLeft(event.timeLeftMs)} left`;
    }
    case 'lost':
      return undefined; // exec's loss line says it, and that the command is being stopped
    case 'signal':
      if (event.reason === 'forwarded') return `passing ${event.signal} on to the command`;
      if (event.reason === 'grace') return `--grace ran out: ${event.signal} to the command`;
      return undefined; // exec's loss line says it
    case 'exited':
      return event.signal
        ? `the command was ended by ${event.signal}`
        : `the command exited with status ${event.exitCode}`;
    case 'released':
      return `released ${event.key}: ${event.status} (held ${timeLeft(event.heldMs)})`;
    case 'releaseFailed':
      return undefined; // exec's "could not release" line says it
  }
}

function plural(count: number, noun: string): string | undefined {
  if (count === 0) return undefined;
  return `${count} ${noun}${count === 1 ? '' : 's'}`;
}
