/**
 * The keep-alive scheduler, one per LeaseClient, for one handle and for a million alike: every
 * live handle with keepAlive is renewed by one shared schedule instead of a timer of its own,
 * and the renewals due at one tick go out as one lease.renew_many statement per owner and ttl
 * (see Coalescer in sql/coalescer.ts), or as the single call for one handle. That statement skips
 * a key whose row another transaction holds locked (a fenced transaction, say) and the key is
 * renewed alone (renewManySkippingLocked in sql/calls.ts): a locked row delays only its own
 * member, which then stays in flight while the others renew on.
 *
 * At a million handles the client's memory and garbage collection are the limit, so a handle
 * costs the scheduler little: a {@link Member} of a few fields and a reference from its slot,
 * no closure (the handles' class gives one {@link KeepAliveOps} for all), no Set entry; and a
 * renewal in a batch costs no promise per handle: the group sends the statement itself (at
 * most {@link KEEP_ALIVE_BATCH_KEYS} keys) and hands each handle its row.
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
  type KeepAliveOps,
  type KeepAliveOptions,
  type Scheduler,
} from './keeper.js';
import type { RenewCall, RenewItem } from './sql/calls.js';

/**
 * What renewals go through: calls made while a hold is open share statements; `renewBatch`,
 * when given, sends one renew_many of one owner and ttl (an answer may be a promise: a key
 * renewed on its own, see renewManySkippingLocked).
 */
interface Renewer {
  hold(): () => void;
  renewBatch?(items: RenewItem[]): Promise<(RenewCall | Promise<RenewCall>)[]>;
}

/**
 * Keys per keep-alive renew_many statement: a tick of a million handles renewed every 20 s
 * (62 500 keys) goes out as several statements the pool's connections run side by side, and
 * a slow statement holds up fewer handles.
 */
export const KEEP_ALIVE_BATCH_KEYS = 5_000;

/** A handle given as two closures (tests, tools): it renews on its own, never in a batch. */
interface Closures {
  renew: () => Promise<unknown>;
  ttlMs: () => number;
}

const closureOps: KeepAliveOps<Closures> = {
  ttlMs: (handle) => handle.ttlMs(),
  begin: () => 'single',
  settle: () => true,
  failed: () => true,
  renewOne: (handle) => handle.renew(),
};

/** @internal */
export class KeepAliveGroup {
  readonly #renewer: Renewer;
  readonly #buckets = new Map<number, Bucket>();

  constructor(renewer: Renewer) {
    this.#renewer = renewer;
  }

  /** A scheduler for one handle given as closures (renews on its own). */
  scheduler(
    renew: () => Promise<unknown>,
    ttlMs: () => number,
    options: KeepAliveOptions,
  ): Scheduler {
    return this.member(closureOps, { renew, ttlMs }, options);
  }

  /** A scheduler for one handle whose renewals go out in batches (see {@link KeepAliveOps}). */
  member<H>(ops: KeepAliveOps<H>, handle: H, options: KeepAliveOptions): Scheduler {
    return new Member(this, ops as KeepAliveOps<unknown>, handle, keepAliveIntervalMs(options));
  }

  /** Handles currently scheduled, for tests and diagnostics. */
  get size(): number {
    let size = 0;
    for (const bucket of this.#buckets.values()) size += bucket.size;
    return size;
  }

  join(member: Member, periodMs: number): void {
    let bucket = this.#buckets.get(periodMs);
    if (!bucket) {
      const created: Bucket = new Bucket(periodMs, this.#renewer, () => {
        if (this.#buckets.get(periodMs) === created) this.#buckets.delete(periodMs);
      });
      bucket = created;
      this.#buckets.set(periodMs, bucket);
    }
    bucket.add(member);
  }
}

const STOPPED = 1;
/** A renewal of this member's is out; the next one waits for it (see {@link Bucket.fire}). */
const IN_FLIGHT = 2;
/** Due while its renewal was out: renews as soon as that one settles. */
const LATE = 4;

class Member implements Scheduler {
  lastFired = performance.now();
  /** The tick of its bucket's wheel this member waits in, if any (kept here, not in a map). */
  tick: number | undefined = undefined;
  /** The bucket it is scheduled in; undefined once stopped (or before start). */
  bucket: Bucket | undefined = undefined;
  flags = 0;

  constructor(
    readonly group: KeepAliveGroup,
    readonly ops: KeepAliveOps<unknown>,
    readonly handle: unknown,
    readonly intervalMs: number | undefined,
  ) {}

  period(): number {
    return keepAlivePeriodMs(this.intervalMs, this.ops.ttlMs(this.handle));
  }

  start(since: number): void {
    this.lastFired = since;
    this.group.join(this, this.period());
  }

  reschedule(since: number): void {
    const bucket = this.bucket;
    if (this.flags & STOPPED || !bucket) return;
    this.lastFired = since;
    const period = this.period();
    if (period === bucket.periodMs) {
      bucket.schedule(this);
      return;
    }
    bucket.remove(this);
    this.group.join(this, period);
  }

  stop(): void {
    this.flags |= STOPPED;
    this.bucket?.remove(this);
  }

  /** Its renewal settled: if it fell due meanwhile, it renews now. */
  settled(): void {
    const late = this.flags & LATE;
    this.flags &= ~(IN_FLIGHT | LATE);
    // Due while it was out: renew now. The handle's deadline counts from that renewal's
    // send, so waiting another interval after its answer could let a slow server's lease
    // lapse; this still keeps one renewal out at a time.
    if (late && !(this.flags & STOPPED)) this.bucket?.schedule(this);
  }

  /** A renewal failed without a verdict: retry soon, unless the handle has ended. */
  failedWith(retry: boolean): void {
    if (!retry) this.stop();
    else this.bucket?.retry(this, keepAliveRetryMs(this.ops.ttlMs(this.handle)));
  }

  /** A renewal on its own (the handle's renew), through the renewer's hold. */
  renewOne(): void {
    const renewal = this.ops.renewOne(this.handle).then(
      () => this.settled(),
      (error: unknown) => {
        this.failedWith(!endsKeepAlive(error));
        this.settled();
      },
    );
    void renewal;
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
 * k * tickMs on performance.now()'s clock. A slot is an array: a member leaving it early only
 * forgets its tick, and the slot skips it when its tick comes.
 */
class Bucket {
  size = 0;
  readonly #slots = new Map<number, Member[]>();
  readonly #retrying = new Set<Member>();
  #overdue: Member[] = [];
  readonly #stop = new AbortController();
  readonly #tickMs: number;
  /** The last tick whose members have been renewed. */
  #done: number;
  #retryTimer: NodeJS.Timeout | undefined;

  constructor(
    readonly periodMs: number,
    private readonly renewer: Renewer,
    private readonly onEmpty: () => void,
  ) {
    this.#tickMs = periodMs / TICKS_PER_INTERVAL;
    this.#done = Math.floor(performance.now() / this.#tickMs);
    void this.#run();
  }

  add(member: Member): void {
    member.bucket = this;
    this.size++;
    this.schedule(member);
  }

  remove(member: Member): void {
    // A lost handle's member is stopped more than once; only its first removal counts, or an
    // empty bucket would take a newer bucket of the same period out of the group's map.
    if (member.bucket !== this) return;
    member.bucket = undefined;
    member.tick = undefined;
    this.#retrying.delete(member);
    if (--this.size === 0) {
      this.#stop.abort();
      clearTimeout(this.#retryTimer);
      this.onEmpty();
    }
  }

  retry(member: Member, delayMs: number): void {
    if (member.bucket !== this) return;
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
    const tick = Math.floor((member.lastFired + this.periodMs) / this.#tickMs) - 1;
    if (tick > this.#done) {
      if (member.tick === tick) return;
      member.tick = tick;
      const slot = this.#slots.get(tick);
      if (slot) slot.push(member);
      else this.#slots.set(tick, [member]);
      return;
    }
    member.tick = undefined;
    this.#overdue.push(member);
    if (this.#overdue.length === 1)
      setImmediate(() => {
        const due = this.#overdue.filter((m) => m.bucket === this && m.tick === undefined);
        this.#overdue = [];
        this.#fire(due);
      });
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
        // Members that left the slot (rescheduled, stopped) no longer name its tick.
        for (const member of slot)
          if (member.tick === tick && member.bucket === this) {
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

  /**
   * Renews the members in one tick, and reschedules them: the handles that can go into a batch
   * in renew_many statements of at most KEEP_ALIVE_BATCH_KEYS keys per owner and ttl, sent
   * from here; the others through their own renew, whose calls share statements while the
   * hold is open.
   */
  #fire(due: Member[]): void {
    if (due.length === 0) return;
    const release = this.renewer.hold();
    const batches = new Map<string, { members: Member[]; items: RenewItem[] }>();
    try {
      const now = performance.now();
      for (const member of due) {
        if (member.flags & STOPPED || member.bucket !== this) continue;
        // A member whose last renewal is still out does not send another: on an overloaded
        // server they would only queue behind it, a queue that grows every tick. It renews as
        // soon as that renewal settles instead (and reschedules itself then).
        if (member.flags & IN_FLIGHT) {
          member.flags |= LATE;
          continue;
        }
        const begun = this.renewer.renewBatch ? member.ops.begin(member.handle) : 'single';
        if (begun === 'ended') {
          member.stop();
          continue;
        }
        member.flags |= IN_FLIGHT;
        member.lastFired = now;
        if (begun === 'single') member.renewOne();
        else {
          const id = `${begun.ttlMicroseconds}\u0000${begun.owner}`;
          let batch = batches.get(id);
          if (!batch) batches.set(id, (batch = { members: [], items: [] }));
          batch.members.push(member);
          batch.items.push(begun);
        }
        if (member.bucket === this) this.schedule(member);
      }
    } finally {
      // Each handle's renew starts after its earlier renewals settle (a microtask at least):
      // close the hold on the next turn of the event loop, once they have all queued.
      setImmediate(release);
    }
    for (const { members, items } of batches.values())
      for (let start = 0; start < items.length; start += KEEP_ALIVE_BATCH_KEYS)
        this.#send(
          members.slice(start, start + KEEP_ALIVE_BATCH_KEYS),
          items.slice(start, start + KEEP_ALIVE_BATCH_KEYS),
        );
  }

  /** One renew_many; each member gets its own row, or the statement's error. */
  #send(members: Member[], items: RenewItem[]): void {
    const settle = (member: Member, item: RenewItem, answer: RenewCall) => {
      const goOn = member.ops.settle(member.handle, answer, item.ttlMicroseconds);
      if (!goOn) member.stop();
      member.settled();
    };
    const fail = (member: Member, error: unknown) => {
      member.failedWith(member.ops.failed(member.handle, error));
      member.settled();
    };
    this.renewer.renewBatch!(items).then(
      (answers) => {
        for (let i = 0; i < members.length; i++) {
          const answer = answers[i]!;
          const member = members[i]!;
          if (answer instanceof Promise)
            answer.then(
              (a) => settle(member, items[i]!, a),
              (error: unknown) => fail(member, error),
            );
          else settle(member, items[i]!, answer);
        }
      },
      (error: unknown) => {
        for (const member of members) fail(member, error);
      },
    );
  }

  #wait(ms: number): Promise<boolean> {
    return sleepUntilStopped(ms, this.#stop.signal);
  }
}
