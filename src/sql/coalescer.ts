/**
 * The coalescer: turns calls made at the same moment into one batch statement per group
 * (lease.acquire_many, lease.renew_many, lease.release_many; see calls.ts): the
 * keep-alive's renewals always, `releaseMany`'s releases, and the caller's own calls with the
 * client's `coalesce` option.
 *
 * A batch statement answers every key as the single call would; what a handle does with the
 * answer is unchanged, so a key that comes back `not_owner`, `lapsed` or `epoch_mismatch` loses
 * only its own handle; and a key that makes the server refuse the whole statement as invalid
 * input is renewed again on its own, with every other key of the batch (see `isolate`).
 */
import { MAX_BATCH_KEYS } from './statements.js';

/** One call waiting in a {@link Coalescer}. */
interface Pending<I, R> {
  item: I;
  resolve(result: R | Promise<R>): void;
  reject(error: unknown): void;
}

/**
 * Sends calls singly or batched. Calls queue up while a hold is open, or, in `always` mode, until
 * the next turn of the event loop (setImmediate): every call made in the same tick shares the
 * flush. A flush groups them (`groupOf`: owner and ttl), at most 10000 per statement and each key
 * at most once per statement (two handles of one grant can renew together; a batch must not name
 * a key twice), and sends a group of one as the single call. Without a hold and outside `always`
 * mode a call is sent at once, so it never waits for company. A batch that fails rejects every
 * call in it with that error. A batch may answer one of its calls with a promise, settled later
 * (a renew that had to wait for a locked row on its own): that call settles when it does, the
 * others at once. A batch the server refuses for its input (`isolate`) is sent again as single
 * calls, so that one key the server cannot take does not fail the calls of the others.
 * @internal
 */
export class Coalescer<I extends { key: string }, R> {
  #holds = 0;
  #scheduled = false;
  #queue: Pending<I, R>[] = [];

  constructor(
    private readonly groupOf: (item: I) => string,
    private readonly sendOne: (item: I) => Promise<R>,
    /** One result per item, in order; an item's may be a promise of its own, settled later. */
    private readonly sendMany: (items: I[]) => Promise<(R | Promise<R>)[]>,
    private readonly always = false,
    /**
     * Whether a batch's error says the server refused the statement for its input as a whole
     * (one key's problem): its calls are then sent again, each on its own, so that the problem
     * costs only its own call. Default: never (every call of the batch gets the error).
     */
    private readonly isolate: (error: unknown) => boolean = () => false,
  ) {}

  /** Opens a hold; the returned function closes it (once). */
  hold(): () => void {
    this.#holds++;
    let open = true;
    return () => {
      if (!open) return;
      open = false;
      if (--this.#holds === 0 && !this.#scheduled) this.#flush();
    };
  }

  submit(item: I): Promise<R> {
    if (this.#holds === 0 && !this.always) return this.sendOne(item);
    const promise = new Promise<R>((resolve, reject) =>
      this.#queue.push({ item, resolve, reject }),
    );
    if (this.#holds === 0 && !this.#scheduled) {
      this.#scheduled = true;
      setImmediate(() => {
        this.#scheduled = false;
        if (this.#holds === 0) this.#flush();
      });
    }
    return promise;
  }

  #flush(): void {
    const queue = this.#queue;
    this.#queue = [];
    for (const chunk of this.#chunks(queue)) {
      if (chunk.length === 1) {
        const [one] = chunk as [Pending<I, R>];
        this.sendOne(one.item).then(one.resolve, one.reject);
        continue;
      }
      this.sendMany(chunk.map((p) => p.item)).then(
        (results) => chunk.forEach((pending, i) => pending.resolve(results[i]!)),
        (error: unknown) => {
          if (this.isolate(error))
            for (const pending of chunk)
              this.sendOne(pending.item).then(pending.resolve, pending.reject);
          else for (const pending of chunk) pending.reject(error);
        },
      );
    }
  }

  #chunks(queue: Pending<I, R>[]): Pending<I, R>[][] {
    const groups = new Map<string, { chunk: Pending<I, R>[]; keys: Set<string> }[]>();
    for (const pending of queue) {
      const id = this.groupOf(pending.item);
      let list = groups.get(id);
      if (!list) groups.set(id, (list = []));
      let target = list.find(
        (c) => c.chunk.length < MAX_BATCH_KEYS && !c.keys.has(pending.item.key),
      );
      if (!target) list.push((target = { chunk: [], keys: new Set() }));
      target.chunk.push(pending);
      target.keys.add(pending.item.key);
    }
    return [...groups.values()].flat().map((c) => c.chunk);
  }
}

/** Groups renews and acquires by owner and ttl, releases by owner. @internal */
export const byOwnerAndTtl = (item: { owner: string; ttlMicroseconds?: number }): string =>
  `${item.ttlMicroseconds ?? ''}\u0000${item.owner}`;
