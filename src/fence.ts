/**
 * Fenced transactions: a callback's writes commit only under a live grant, because the
 * transaction starts with `lease.fence(key, epoch)` (SEMANTICS.md §10 Fence). The fence holds
 * the key's row until the transaction ends, so no takeover, renew or release of the key commits
 * in between; a stale epoch makes the server refuse with PLF01, mapped to
 * {@link LeaseFencedError}.
 */
import pg from 'pg';
import { isConnectionGone, isPool } from './sql/connection.js';
import { illFormedText } from './validation.js';
import {
  LeaseError,
  LeaseFencedError,
  LeaseInvalidInputError,
  SQLSTATE,
  STALE_EPOCH_MESSAGE,
} from './errors.js';

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

const BEGIN: Record<FencedIsolation, string> = {
  'read committed': 'BEGIN ISOLATION LEVEL READ COMMITTED',
  'repeatable read': 'BEGIN ISOLATION LEVEL REPEATABLE READ',
  serializable: 'BEGIN ISOLATION LEVEL SERIALIZABLE',
};

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
  const begin = options.isolation === undefined ? 'BEGIN' : BEGIN[options.isolation];
  if (begin === undefined)
    throw new LeaseInvalidInputError(
      `isolation must be one of ${Object.keys(BEGIN).join(', ')}, got ${JSON.stringify(options.isolation)}`,
    );
  const illFormed = typeof grant.key === 'string' ? illFormedText('key', grant.key) : undefined;
  if (illFormed !== undefined) throw new LeaseInvalidInputError(illFormed);
  if (!isPool(database)) return runFenced(database, begin, grant, fn);
  const connection = await database.connect();
  let broken: Error | undefined;
  // While `fn` awaits something else no statement runs on the connection: a server shutdown
  // then arrives as the connection's 'error' event, which must not end the process. The
  // transaction's next statement fails instead.
  const onError = (error: Error) => (broken ??= error);
  connection.on('error', onError);
  try {
    return await runFenced(connection, begin, grant, fn);
  } catch (error) {
    // Rolled back, the connection is idle and reusable; otherwise (or after a connection
    // failure) the pool must drop it.
    if (connection.getTransactionStatus() !== 'I' || isConnectionGone(error))
      broken = error instanceof Error ? error : new Error(String(error));
    throw error;
  } finally {
    connection.off('error', onError);
    connection.release(broken);
  }
}

async function runFenced<T>(
  tx: pg.ClientBase,
  begin: string,
  grant: FencedGrant,
  fn: (tx: pg.ClientBase) => Promise<T> | T,
): Promise<T> {
  const status = tx.getTransactionStatus();
  if (status === 'T' || status === 'E')
    throw new LeaseError(
      'in_transaction',
      'pg_lease: the connection is inside a transaction block; a fenced transaction needs a ' +
        'connection of its own (use a pool)',
    );
  await tx.query(begin);
  try {
    await tx.query('SELECT lease.fence($1, $2::bigint)', [grant.key, grant.epoch.toString()]);
    const result = await fn(tx);
    // COMMIT of a transaction that a failed statement aborted answers ROLLBACK, not an error.
    const commit = await tx.query('COMMIT');
    if (commit.command !== 'COMMIT')
      throw new Error(
        'pg_lease: a statement of the fenced transaction failed, so it was rolled back ' +
          '(the callback did not rethrow the error)',
      );
    return result;
  } catch (error) {
    // The status may still say 'T' right after an error (node-postgres rejects before the
    // server's ReadyForQuery arrives); a ROLLBACK too many only draws a warning.
    if (tx.getTransactionStatus() !== 'I') await tx.query('ROLLBACK').catch(() => undefined);
    throw fencedError(error, grant);
  }
}

/** A PLF01 refusal as {@link LeaseFencedError}; anything else unchanged. */
function fencedError(error: unknown, grant: FencedGrant): unknown {
  if (!(error instanceof Error)) return error;
  const { code, detail } = error as { code?: unknown; detail?: unknown };
  if (code !== SQLSTATE.STALE_EPOCH || error.message !== STALE_EPOCH_MESSAGE) return error;
  return new LeaseFencedError(grant, {
    cause: error,
    message: error.message,
    ...(typeof detail === 'string' ? { detail } : {}),
  });
}
