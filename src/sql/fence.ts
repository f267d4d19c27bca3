/**
 * The statements of a fenced transaction (see fence.ts for what it guarantees): BEGIN at the
 * chosen isolation, `lease.fence(key, epoch)`, the caller's statements on the same connection,
 * COMMIT, or ROLLBACK after any failure; and the connection they run on, taken from a pool for
 * the transaction and dropped by the pool if it cannot be reused.
 */
import type pg from 'pg';
import { LeaseError, LeaseFencedError, SQLSTATE, STALE_EPOCH_MESSAGE } from '../errors.js';
import { isConnectionGone, isPool } from './connection.js';

/** The isolation levels a fenced transaction may begin with, and their BEGIN. @internal */
export const BEGIN = {
  'read committed': 'BEGIN ISOLATION LEVEL READ COMMITTED',
  'repeatable read': 'BEGIN ISOLATION LEVEL REPEATABLE READ',
  serializable: 'BEGIN ISOLATION LEVEL SERIALIZABLE',
} as const;

/** A key and epoch to fence by (a handle or any grant). @internal */
interface Fence {
  readonly key: string;
  readonly epoch: bigint;
}

/**
 * Runs `fn` in a transaction fenced by `grant`, on a connection of `database` (a pool's, held
 * for the transaction) or on `database` itself; `isolation` undefined is the server's default.
 * Rejects with {@link LeaseFencedError} when the server refuses the epoch. @internal
 */
export async function runFencedTransaction<T>(
  database: pg.Pool | pg.ClientBase,
  isolation: keyof typeof BEGIN | undefined,
  grant: Fence,
  fn: (tx: pg.ClientBase) => Promise<T> | T,
): Promise<T> {
  const begin = isolation === undefined ? 'BEGIN' : BEGIN[isolation];
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
  grant: Fence,
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
function fencedError(error: unknown, grant: Fence): unknown {
  if (!(error instanceof Error)) return error;
  const { code, detail } = error as { code?: unknown; detail?: unknown };
  if (code !== SQLSTATE.STALE_EPOCH || error.message !== STALE_EPOCH_MESSAGE) return error;
  return new LeaseFencedError(grant, {
    cause: error,
    message: error.message,
    ...(typeof detail === 'string' ? { detail } : {}),
  });
}
