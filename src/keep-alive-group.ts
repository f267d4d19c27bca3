/**
 * One keep-alive per LeaseClient: every live handle with keepAlive is renewed by a shared
 * schedule instead of a timer of its own, and the renewals due at one tick go out as one
 * lease.renew_many statement per owner and ttl (see Coalescer in batch.ts).
 *
 * Handles are grouped by their renewal interval (keepAlive.interval, or a third of the ttl);
 * each group has one timer, which ticks four times per interval. At a tick every member renews
 * whose last renewal is at least about three quarters of an interval old, so a member renews at
 * the first tick past that point: never later than one interval after the last renewal, and in
 * steady state every three ticks. A new member counts from when its grant's ttl started, and
 * renews as soon as it joins if its grant took that long to arrive. Handles that join within
 * the same quarter interval renew at the same ticks, so their renewals share statements. Like
 * the per-handle keeper, the group only schedules: each handle still decides for itself, from
 * its own monotonic deadline and the server's answer for its key, whether it is lost, and its
 * own signal fires. A failure that is not a loss (a driver error) is retried for that member
 * sooner, together with the others that failed.
 */
import { performance } from 'node:perf_hooks';
import { LeaseError } from './errors.js';
import {
  keepAliveIntervalMs,
  sleepUntilStopped,
  type KeepAliveOptions,
  type Scheduler,
} from './keeper.js';

/** What renewals go through: calls made while a hold is open share statements. */
interface Holdable {
  hold(): () => void;
}

/** @internal */
export class KeepAliveGroup {
  readonly #batcher: Holdable;
  readonly #buckets = new Map<number, Bucket>();

  constructor(batcher: Holdable) {
    this.#batcher = batcher;
  }

  /** A scheduler for one handle (the shape of Keeper). */
  scheduler(
    renew: () => Promise<unknown>,
    ttlMs: () => number,
    options: KeepAliveOptions,
  ): Scheduler {
    return new Member(this, renew, ttlMs, keepAliveIntervalMs(options));
  }

  /** Handles currently scheduled, for tests and diagnostics. */
  get size(): number {
    let size = 0;
    for (const bucket of this.#buckets.values()) size += bucket.members.size;
    return size;
  }

  join(member: Member, periodMs: number): Bucket {
    let bucket = this.#buckets.get(periodMs);
    if (!bucket) {
      bucket = new Bucket(periodMs, this.#batcher, () => this.#buckets.delete(periodMs));
      this.#buckets.set(periodMs, bucket);
    }
    bucket.add(member);
    return bucket;
  }
}

class Member implements Scheduler {
  lastFired = performance.now();
  #bucket: Bucket | undefined;
  #stopped = false;

  constructor(
    private readonly group: KeepAliveGroup,
    private readonly renew: () => Promise<unknown>,
    private readonly ttlMs: () => number,
    private readonly intervalMs: number | undefined,
  ) {}

  period(): number {
    return this.intervalMs ?? this.ttlMs() / 3;
  }

  start(since: number): void {
    this.lastFired = since;
    this.#bucket = this.group.join(this, this.period());
  }

  stop(): void {
    this.#stopped = true;
    this.#bucket?.remove(this);
  }

  /** Renews once; on a transient failure asks the bucket for an early retry. */
  fire(): void {
    if (this.#stopped) return;
    this.lastFired = performance.now();
    this.renew().then(
      () => {
        // The ttl may have changed (lease.renew(ttl)): move to the matching group.
        const period = this.period();
        if (!this.#stopped && this.#bucket && period !== this.#bucket.periodMs) {
          this.#bucket.remove(this);
          this.#bucket = this.group.join(this, period);
        }
      },
      (error: unknown) => {
        if (error instanceof LeaseError) {
          this.stop();
          return;
        }
        this.#bucket?.retry(this, Math.min(1_000, Math.max(10, this.ttlMs() / 10)));
      },
    );
  }
}

class Bucket {
  readonly members = new Set<Member>();
  readonly #retrying = new Set<Member>();
  #overdue: Member[] = [];
  readonly #stop = new AbortController();
  #retryTimer: NodeJS.Timeout | undefined;

  constructor(
    readonly periodMs: number,
    private readonly batcher: Holdable,
    private readonly onEmpty: () => void,
  ) {
    void this.#run();
  }

  add(member: Member): void {
    this.members.add(member);
    // A grant that took most of an interval to arrive renews at once, not at a later tick;
    // the members that join overdue in one turn of the event loop renew together.
    if (performance.now() - member.lastFired < this.#dueAfterMs()) return;
    this.#overdue.push(member);
    if (this.#overdue.length === 1)
      setImmediate(() => {
        const due = this.#overdue.filter((m) => this.members.has(m));
        this.#overdue = [];
        this.#fire(due);
      });
  }

  remove(member: Member): void {
    this.members.delete(member);
    this.#retrying.delete(member);
    if (this.members.size === 0) {
      this.#stop.abort();
      clearTimeout(this.#retryTimer);
      this.onEmpty();
    }
  }

  retry(member: Member, delayMs: number): void {
    if (!this.members.has(member)) return;
    this.#retrying.add(member);
    if (this.#retryTimer) return;
    this.#retryTimer = setTimeout(() => {
      this.#retryTimer = undefined;
      const due = [...this.#retrying];
      this.#retrying.clear();
      this.#fire(due);
    }, delayMs);
    this.#retryTimer.unref();
  }

  async #run(): Promise<void> {
    while (!this.#stop.signal.aborted) {
      if (!(await this.#wait(this.periodMs / 4))) return;
      // Three ticks (3/4 of the interval) always qualify, whatever the timers' jitter.
      const now = performance.now();
      const due = [...this.members].filter((m) => now - m.lastFired >= this.#dueAfterMs());
      this.#fire(due);
    }
  }

  /** How old a member's last renewal is when it is due. */
  #dueAfterMs(): number {
    return (this.periodMs * 11) / 16;
  }

  /** Renews the members in one tick: their renewals share statements. */
  #fire(due: Member[]): void {
    if (due.length === 0) return;
    const release = this.batcher.hold();
    try {
      for (const member of due) member.fire();
    } finally {
      // Each handle's renew starts after its earlier renewals settle (a microtask at least):
      // close the hold on the next turn of the event loop, once they have all queued.
      setImmediate(release);
    }
  }

  #wait(ms: number): Promise<boolean> {
    return sleepUntilStopped(ms, this.#stop.signal);
  }
}
