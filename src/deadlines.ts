/**
 * One timer for the deadlines of every handle: a handle's deadline timer was a Node.js Timeout
 * and a closure of its own (about 180 bytes, a fifth of a handle kept alive), re-armed about
 * once a ttl. Here a handle waits in the list of the millisecond its timer is due at, the lists
 * in a min-heap of their due times, and one Node.js timer (unref'd) is armed for the earliest.
 * A handle leaves a list by forgetting its due time (the owner's `due` callback is told the
 * time the list was for, and ignores a list it is no longer in), so re-arming costs a push.
 *
 * Timing is that of a timer per handle: a list runs once performance.now() has reached its
 * millisecond, never before; a late event loop makes it late alike. @internal
 */
import { performance } from 'node:perf_hooks';
import { MAX_TIMER_MS } from './keeper.js';

export class Deadlines<H> {
  readonly #lists = new Map<number, H[]>();
  /** The due times of #lists, a binary min-heap. */
  readonly #heap: number[] = [];
  #timer: NodeJS.Timeout | undefined;
  #timerAt = Infinity;

  /** @param due called for each handle of a list whose time has come, with that time. */
  constructor(private readonly due: (handle: H, at: number) => void) {}

  /** Runs `due(handle, at)` once performance.now() >= at; `at` is a whole millisecond. */
  add(handle: H, at: number): void {
    const list = this.#lists.get(at);
    if (list) {
      list.push(handle);
      return;
    }
    this.#lists.set(at, [handle]);
    this.#push(at);
    if (at < this.#timerAt) this.#arm();
  }

  #arm(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#timerAt = Infinity;
    const at = this.#heap[0];
    if (at === undefined) return;
    const delay = Math.min(Math.max(1, Math.ceil(at - performance.now())), MAX_TIMER_MS);
    this.#timerAt = at;
    this.#timer = setTimeout(() => this.#run(), delay);
    this.#timer.unref();
  }

  #run(): void {
    this.#timer = undefined;
    this.#timerAt = Infinity;
    const now = performance.now();
    // Lists added while running (a handle re-armed) are due later than now: a handle re-arms
    // only for a deadline at least a millisecond ahead.
    while (this.#heap.length > 0 && this.#heap[0]! <= now) {
      const at = this.#pop();
      const list = this.#lists.get(at)!;
      this.#lists.delete(at);
      for (const handle of list)
        try {
          this.due(handle, at);
        } catch (error) {
          // As from a timer of its own: uncaught, and the other handles' timers still run.
          queueMicrotask(() => {
            throw error;
          });
        }
    }
    this.#arm();
  }

  #push(at: number): void {
    const heap = this.#heap;
    let i = heap.push(at) - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (heap[parent]! <= at) break;
      heap[i] = heap[parent]!;
      i = parent;
    }
    heap[i] = at;
  }

  #pop(): number {
    const heap = this.#heap;
    const top = heap[0]!;
    const last = heap.pop()!;
    if (heap.length === 0) return top;
    let i = 0;
    for (;;) {
      const left = 2 * i + 1;
      if (left >= heap.length) break;
      const right = left + 1;
      const child = right < heap.length && heap[right]! < heap[left]! ? right : left;
      if (heap[child]! >= last) break;
      heap[i] = heap[child]!;
      i = child;
    }
    heap[i] = last;
    return top;
  }
}
