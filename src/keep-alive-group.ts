/**
 * The keep-alive scheduler, one per LeaseClient, for one handle and for a million alike: every
 * live handle with keepAlive is renewed by one shared schedule instead of a timer of its own,
 * and the renewals due at one tick go out as one lease.renew_many statement per owner and ttl
 * (see Coalescer in sql/coalescer.ts), or as the single call for one handle. That statement skips
 * a key whose row another transaction holds locked (a fenced transaction, say) and the key is
 * renewed alone (renewManySkippingLocked in sql/calls.ts): a locked row delays only its own
 * member, which then stays in flight (see Member.fire) while the others renew on.
 *
 * Handles are grouped by their renewal interval (keepAlive.interval, or a third of the ttl);
 * each group has one timer, which ticks sixteen times per interval, and a timing wheel: every
 * member waits in the slot of the last tick before one interval has passed since its last
 * renewal, so it renews every 15/16 of an interval, never later than one interval after the
 * last renewal unless the timer is a whole tick late, and a tick touches only the members it
 * renews; a tick that renews anyone also takes the next tick's members, so members a tick
 * boundary split renew together again. A new member counts from when its grant's ttl started,
 * and renews as soon as it joins if its grant took that long to arrive. Handles that join
 * within the same sixteenth of an interval renew at the same ticks, so their renewals share
 * statements. As keeper.ts says, the group only schedules: each handle still decides for
 * itself, from its own monotonic deadline and the server's answer for its key, whether it is
 * lost, and its own signal fires. A failure that is not a loss (a driver error, a connection
 * inside a transaction block) is retried for that member sooner, together with the others that
 * failed.
 */
import { performance } from 'node:perf_hooks';
import {
  endsKeepAlive,
  keepAliveIntervalMs,
  keepAliveRetryMs,
  keepAlivePeriodMs,
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

  /** A scheduler for one handle. */
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
      const created: Bucket = new Bucket(periodMs, this.#batcher, () => {
        if (this.#buckets.get(periodMs) === created) this.#buckets.delete(periodMs);
      });
      bucket = created;
      this.#buckets.set(periodMs, bucket);
    }
    bucket.add(member);
    return bucket;
  }
}

class Member implements Scheduler {
  lastFired = performance.now();
  /** The tick of its bucket's wheel this member waits in, if any (kept here, not in a map). */
  tick: number | undefined;
  #bucket: Bucket | undefined;
  #stopped = false;
  /** A renewal of this member's is out; the next one waits for it (see {@link fire}). */
  #inFlight = false;
  #late = false;

  constructor(
    private readonly group: KeepAliveGroup,
    private readonly renew: () => Promise<unknown>,
    private readonly ttlMs: () => number,
    private readonly intervalMs: number | undefined,
  ) {}

  period(): number {
    return keepAlivePeriodMs(this.intervalMs, this.ttlMs());
  }

  start(since: number): void {
    this.lastFired = since;
    this.#bucket = this.group.join(this, this.period());
  }

  reschedule(since: number): void {
    if (this.#stopped || !this.#bucket) return;
    this.lastFired = since;
    const period = this.period();
    if (period === this.#bucket.periodMs) {
      this.#bucket.schedule(this);
      return;
    }
    this.#bucket.remove(this);
    this.#bucket = this.group.join(this, period);
  }

  stop(): void {
    this.#stopped = true;
    this.#bucket?.remove(this);
  }

  /**
   * Renews once, and says whether it did; on a transient failure asks the bucket for an early
   * retry. A member whose last renewal has not been answered yet does not send another: on an
   * overloaded server they would only queue behind it, a queue that grows every tick. It
   * renews as soon as that renewal settles instead.
   */
  fire(): boolean {
    if (this.#stopped) return false;
    if (this.#inFlight) {
      this.#late = true;
      return false;
    }
    this.#inFlight = true;
    this.lastFired = performance.now();
    // A keep-alive renewal keeps the ttl in force; only lease.renew(ttl) changes it, and that
    // moves the member to its new interval's bucket (reschedule).
    const renewal = this.renew().catch((error: unknown) => {
      if (endsKeepAlive(error)) {
        this.stop();
        return;
      }
      this.#bucket?.retry(this, keepAliveRetryMs(this.ttlMs()));
    });
    void renewal.finally(() => {
      this.#inFlight = false;
      if (!this.#late) return;
      this.#late = false;
      // Due while it was out: renew now. The handle's deadline counts from that renewal's
      // send, so waiting another interval after its answer could let a slow server's lease
      // lapse; this still keeps one renewal out at a time.
      if (!this.#stopped) this.#bucket?.schedule(this);
    });
    return true;
  }
}

/**
 * Ticks per renewal interval. A member renews at the last tick before one interval has passed
 * since its last renewal: every 15/16 of the interval in steady state, and within the interval
 * as long as a timer is late by less than a tick.
 */
const TICKS_PER_INTERVAL = 16;

/**
 * The members of one interval, on a timing wheel: each member waits in the slot of the tick
 * its next renewal is due at, so a tick touches only the members it renews. Tick k is due at
 * k * tickMs on performance.now()'s clock.
 */
class Bucket {
  readonly members = new Set<Member>();
  readonly #slots = new Map<number, Set<Member>>();
  readonly #retrying = new Set<Member>();
  #overdue: Member[] = [];
  readonly #stop = new AbortController();
  readonly #tickMs: number;
  /** The last tick whose members have been renewed. */
  #done: number;
  #retryTimer: NodeJS.Timeout | undefined;

  constructor(
    readonly periodMs: number,
    private readonly batcher: Holdable,
    private readonly onEmpty: () => void,
  ) {
    this.#tickMs = periodMs / TICKS_PER_INTERVAL;
    this.#done = Math.floor(performance.now() / this.#tickMs);
    void this.#run();
  }

  add(member: Member): void {
    this.members.add(member);
    this.schedule(member);
  }

  remove(member: Member): void {
    // A lost handle's member is stopped more than once; only its first removal counts, or an
    // empty bucket would take a newer bucket of the same period out of the group's map.
    if (!this.members.delete(member)) return;
    this.#unslot(member);
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

  /**
   * Puts a member in the slot of the last tick before its interval since `lastFired` ends. A
   * member already due (a grant that took most of an interval to arrive) renews at once; the
   * members found due in one turn of the event loop renew together.
   */
  schedule(member: Member): void {
    this.#unslot(member);
    const tick = Math.floor((member.lastFired + this.periodMs) / this.#tickMs) - 1;
    if (tick > this.#done) {
      let slot = this.#slots.get(tick);
      if (!slot) this.#slots.set(tick, (slot = new Set()));
      slot.add(member);
      member.tick = tick;
      return;
    }
    this.#overdue.push(member);
    if (this.#overdue.length === 1)
      setImmediate(() => {
        const due = this.#overdue.filter((m) => this.members.has(m));
        this.#overdue = [];
        this.#fire(due);
      });
  }

  #unslot(member: Member): void {
    const tick = member.tick;
    if (tick === undefined) return;
    member.tick = undefined;
    const slot = this.#slots.get(tick)!;
    slot.delete(member);
    if (slot.size === 0) this.#slots.delete(tick);
  }

  async #run(): Promise<void> {
    while (!this.#stop.signal.aborted) {
      const next = (this.#done + 1) * this.#tickMs;
      if (!(await this.#wait(Math.max(1, next - performance.now())))) return;
      // A late timer (a busy event loop) renews every slot it passed, in one tick. A tick
      // that renews anyone also takes the next tick's members, a tick early: handles a tick
      // boundary split (one statement's grants measured a few µs apart, say) then renew
      // together from here on, in one statement. Only a tick that renews anyway pulls the
      // next one in; an empty tick pulling would move the split pair along together.
      // A timer may also wake a fraction of a millisecond early: that is still its tick.
      const now = Math.max(this.#done + 1, Math.floor(performance.now() / this.#tickMs));
      const due: Member[] = [];
      const take = (tick: number) => {
        const slot = this.#slots.get(tick);
        if (!slot) return;
        this.#slots.delete(tick);
        for (const member of slot) {
          member.tick = undefined;
          due.push(member);
        }
      };
      // Whichever is shorter: the ticks passed, or the slots there are.
      if (now - this.#done <= this.#slots.size)
        for (let tick = this.#done + 1; tick <= now; tick++) take(tick);
      else for (const tick of [...this.#slots.keys()]) if (tick <= now) take(tick);
      if (due.length > 0) take(now + 1);
      this.#done = now;
      this.#fire(due);
    }
  }

  /** Renews the members in one tick (their renewals share statements), and reschedules them. */
  #fire(due: Member[]): void {
    if (due.length === 0) return;
    const release = this.batcher.hold();
    try {
      // A member that did not fire (its last renewal is still out) reschedules itself.
      for (const member of due)
        if (member.fire() && this.members.has(member)) this.schedule(member);
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
