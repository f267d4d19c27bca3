/**
 * Fenced transactions: a callback's writes commit only under a live grant, because the
 * transaction starts with `lease.fence(key, epoch)` (SEMANTICS.md §10 Fence). The fence holds
 * the key's row until the transaction ends, so no takeover, renew or release of the key commits
 * in between; a stale epoch makes the server refuse with PLF01, mapped to
 * {@link LeaseFencedError}.
 */
import type pg from 'pg';
import { LeaseInvalidInputError } from './errors.js';
import { BEGIN, runFencedTransaction } from './sql/fence.js';
import { illFormedText } from './validation.js';

/**
 * What a fenced transaction is fenced by: a {@link Lease} handle, or any key and epoch (for
 * example an epoch passed on to another process).
 *
 * @example
 * import type { FencedGrant } from 'pg-lease';
 * const grant: FencedGrant = { key: 'job-42', epoch: 7n };
 */
export interface FencedGrant {
  readonly key: string;
  readonly epoch: bigint;
}

/**
 * Isolation level of a fenced transaction. Under `repeatable read` and `serializable` the fence
 * answers from the transaction's snapshot or fails with 40001; it never accepts a grant that
 * ended after the snapshot.
 *
 * @example
 * import type { FencedIsolation } from 'pg-lease';
 * const level: FencedIsolation = 'repeatable read';
 */
export type FencedIsolation = 'read committed' | 'repeatable read' | 'serializable';

/**
 * Options of {@link fencedTransaction} and {@link LeaseClient.fenced}.
 *
 * @example
 * import type { FencedOptions } from 'pg-lease';
 * const options: FencedOptions = { isolation: 'serializable' };
 */
export interface FencedOptions {
  /** Default: the server's default (normally read committed). */
  isolation?: FencedIsolation;
}

/**
 * Runs `fn` in a transaction fenced by `grant`: BEGIN, `lease.fence(key, epoch)`, `fn(tx)`,
 * COMMIT. Resolves with `fn`'s result once the commit succeeded, which it does only under a
 * grant that was live at the fence, with no later grant of the key committed before it (I12).
 *
 * Rejects with {@link LeaseFencedError} when the server refuses the epoch: at the fence (then
 * `fn` never runs), or at a `lease.fence_row` trigger fired by `fn`'s writes. Any other error
 * of `fn` or of the commit rolls the transaction back and is rethrown as it was. A statement
 * that failed inside `fn` whose error `fn` swallowed has aborted the transaction: the helper
 * then rolls back and rejects instead of reporting a commit that did not happen.
 *
 * While the transaction is open, the key's renew (also the holder's own keep-alive), release
 * and takeover wait for it: keep fenced transactions short next to the ttl.
 *
 * `database` is a `pg.Pool` (one of its connections carries the transaction) or a dedicated
 * `pg.ClientBase`, which must not be inside a transaction already. `tx` is that connection: run
 * the transaction's statements on it, and nothing after `fn` settles.
 *
 * @example
 * import { fencedTransaction } from 'pg-lease';
 * await fencedTransaction(pool, { key: 'job-42', epoch }, async (tx) => {
 *   await tx.query('UPDATE jobs SET result = $1 WHERE id = 42', [result]);
 * });
 */
export async function fencedTransaction<T>(
  database: pg.Pool | pg.ClientBase,
  grant: FencedGrant,
  fn: (tx: pg.ClientBase) => Promise<T> | T,
  options: FencedOptions = {},
): Promise<T> {
  const isolation = options.isolation;
  if (isolation !== undefined && !Object.hasOwn(BEGIN, isolation))
    throw new LeaseInvalidInputError(
      `isolation must be one of ${Object.keys(BEGIN).join(', ')}, got ${JSON.stringify(isolation)}`,
    );
  const illFormed = typeof grant.key === 'string' ? illFormedText('key', grant.key) : undefined;
  if (illFormed !== undefined) throw new LeaseInvalidInputError(illFormed);
  return runFencedTransaction(database, isolation, grant, fn);
}
