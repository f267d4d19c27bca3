/**
 * The wire: the one place that talks to node-postgres for the client's calls. It sends a
 * statement named (prepared) or, after a pooler refused a name, unnamed from then on; takes a
 * pool's connection for one statement and gives it back, or drops it when it broke; refuses a
 * connection inside a transaction block and does not count a statement that ran in one;
 * cancels on the server when the caller's signal aborts; turns the server's errors into the
 * client's (translateError) and the synchronous-commit warning into `unconfirmed_commit`.
 * The typed statements are in calls.ts.
 */
import pg from 'pg';
import { isUnconfirmedCommit, LeaseError, translateError, unconfirmedMessage } from '../errors.js';
import { isBrokenBy, isPool, runCancellable } from './connection.js';
import type { Statement } from './statements.js';

/** The client's connection to the server: a pool or one dedicated connection. @internal */
export class Wire {
  #prepared: boolean;

  constructor(
    readonly db: pg.Pool | pg.ClientBase,
    preparedStatements: boolean,
  ) {
    this.#prepared = preparedStatements;
  }

  /**
   * Runs one statement outside any transaction block (see runOutsideTransaction), named while
   * the connection keeps prepared statements, cancelled when `signal` aborts.
   */
  async query<R extends pg.QueryResultRow>(
    key: string,
    statement: Statement,
    values: unknown[],
    signal?: AbortSignal,
  ): Promise<R[]> {
    if (!this.#prepared) return this.#send<R>(key, { text: statement.text, values }, signal);
    try {
      return await this.#send<R>(
        key,
        { name: statement.name, text: statement.text, values },
        signal,
      );
    } catch (error) {
      // A pooler in transaction mode that does not track prepared statements hands the next
      // statement to another server connection, which does not know the name (26000) or
      // already has it (42P05). The server refused the statement before running it, so it is
      // sent again unnamed, and so is everything after it from this client.
      const code = (error as { code?: unknown }).code;
      if (!(error instanceof pg.DatabaseError) || (code !== '26000' && code !== '42P05'))
        throw error;
      this.#prepared = false;
      return this.#send<R>(key, { text: statement.text, values }, signal);
    }
  }

  #send<R extends pg.QueryResultRow>(
    key: string,
    query: pg.QueryConfig,
    signal: AbortSignal | undefined,
  ): Promise<R[]> {
    const db = this.db;
    if (!isPool(db))
      return runCancellable(db, () => runOutsideTransaction<R>(db, key, query), signal);
    if (signal === undefined) return sendPooled<R>(db, key, query);
    return this.#sendCancellable<R>(db, key, query, signal);
  }

  async #sendCancellable<R extends pg.QueryResultRow>(
    db: pg.Pool,
    key: string,
    query: pg.QueryConfig,
    signal: AbortSignal,
  ): Promise<R[]> {
    const connection = await db.connect();
    let broken: Error | undefined;
    // A checked-out connection has no listener of the pool's: an error that arrives while no
    // statement runs on it (waiting for a cancel request to close, say) would be thrown.
    const onError = (error: Error) => (broken ??= error);
    connection.on('error', onError);
    try {
      return await runCancellable(
        connection,
        () => runOutsideTransaction<R>(connection, key, query),
        signal,
        true,
      );
    } catch (error) {
      if (isBrokenBy(error)) broken = error as Error;
      throw error;
    } finally {
      connection.off('error', onError);
      connection.release(broken);
    }
  }
}

/** The 'error' listener on each pool in use by clients, and how many clients use it. */
const watchedPools = new WeakMap<pg.Pool, { clients: number; listener: (error: Error) => void }>();

/**
 * @internal Listens for errors of `pool`'s idle connections (one listener however many clients share
 * the pool) and tells `report`, the first client's (every client reports alike: one error is
 * reported once, not once per client); returns the function that stops, once the last client
 * ends.
 */
export function watchPool(pool: pg.Pool, report: (error: Error) => void): () => void {
  let watch = watchedPools.get(pool);
  if (!watch) {
    const listener = (error: Error) => report(error);
    watch = { clients: 0, listener };
    watchedPools.set(pool, watch);
    pool.on('error', listener);
  }
  watch.clients++;
  let done = false;
  return () => {
    if (done) return;
    done = true;
    if (--watch.clients > 0) return;
    pool.off('error', watch.listener);
    watchedPools.delete(pool);
  };
}

/**
 * One statement on a pool's connection, nothing to cancel: what #sendCancellable does without
 * a signal, in callbacks (as `pool.query` does) instead of a chain of awaits, which cost the
 * client's calls more than their own decoding. Same checks, same errors, same release.
 */
function sendPooled<R extends pg.QueryResultRow>(
  pool: pg.Pool,
  key: string,
  query: pg.QueryConfig,
): Promise<R[]> {
  return new Promise<R[]>((resolve, reject) => {
    pool.connect((connectError, connection) => {
      if (connectError || !connection) return reject(connectError as Error);
      let broken: Error | undefined;
      // As in #sendCancellable: a checked-out connection has no listener of the pool's.
      const onError = (error: Error) => (broken ??= error);
      connection.on('error', onError);
      const settle = (error: unknown, rows?: R[]) => {
        if (error !== undefined && isBrokenBy(error)) broken = error as Error;
        connection.off('error', onError);
        connection.release(broken);
        if (error === undefined) resolve(rows!);
        else reject(error);
      };
      const refused = refuseInTransaction(connection);
      if (refused) return settle(refused);
      const notices = noticesOf(connection);
      notices.unconfirmed = undefined;
      try {
        connection.query<R>(query, (queryError: Error | undefined, result: pg.QueryResult<R>) => {
          if (queryError) return settle(translateError(queryError, key));
          const error = checkAnswer(connection, notices, key);
          settle(error, error === undefined ? result.rows : undefined);
        });
      } catch (error) {
        settle(translateError(error, key));
      }
    });
  });
}

/** The client's refusal of a connection inside a transaction block, or undefined. */
function refuseInTransaction(connection: pg.ClientBase): LeaseError | undefined {
  const status = connection.getTransactionStatus();
  if (status === 'T' || status === 'E')
    return new LeaseError(
      'in_transaction',
      'pg_lease: the connection is inside a transaction block; lease calls run outside ' +
        'transactions (use a pool, or call lease.* in SQL to make it part of yours)',
    );
  return undefined;
}

/**
 * What an answered statement still fails with: the synchronous-commit warning of a cancelled
 * wait for the standbys (the rows came anyway), or a transaction block opened meanwhile.
 */
function checkAnswer(
  connection: pg.ClientBase,
  notices: Notices,
  key: string,
): LeaseError | undefined {
  const unconfirmed = notices.unconfirmed;
  notices.unconfirmed = undefined;
  if (unconfirmed)
    return new LeaseError('unconfirmed_commit', unconfirmedMessage(unconfirmed, key), {
      cause: unconfirmed,
    });
  // On a dedicated client, another query may have opened a transaction block between the check
  // before the statement and the statement (a BEGIN queued ahead of it): the statement ran
  // inside it, and a rollback would undo it. Its answer is not counted; the connection's status
  // after the statement is the status its own ReadyForQuery reported.
  if (connection.getTransactionStatus() !== 'I')
    return new LeaseError(
      'in_transaction',
      'pg_lease: the call ran inside a transaction block that another query on the connection ' +
        'opened meanwhile; its result is not counted, since a rollback would undo it',
    );
  return undefined;
}

async function runOutsideTransaction<R extends pg.QueryResultRow>(
  connection: pg.ClientBase,
  key: string,
  query: pg.QueryConfig,
): Promise<R[]> {
  const refused = refuseInTransaction(connection);
  if (refused) throw refused;
  // A cancelled wait for the synchronous standbys still returns the rows, with a WARNING.
  const notices = noticesOf(connection);
  notices.unconfirmed = undefined;
  let rows: R[];
  try {
    rows = (await connection.query<R>(query)).rows;
  } catch (error) {
    throw translateError(error, key);
  }
  const error = checkAnswer(connection, notices, key);
  if (error) throw error;
  return rows;
}

/** What a connection's notices said during the client's statement on it (see noticesOf). */
interface Notices {
  /** The synchronous-commit WARNING of a cancelled wait for the standbys, if one came. */
  unconfirmed: { message?: string } | undefined;
}

const NOTICES = new WeakMap<pg.ClientBase, Notices>();

/**
 * The notice record of a connection, with its one listener, made at the connection's first
 * statement: a listener added and removed around every statement cost more than the statement's
 * own decoding. Statements on a connection run one at a time, so what arrives between a
 * statement's start and its answer is that statement's.
 */
function noticesOf(connection: pg.ClientBase): Notices {
  let notices = NOTICES.get(connection);
  if (!notices) {
    const record: Notices = { unconfirmed: undefined };
    connection.on('notice', (notice: { message?: string }) => {
      if (record.unconfirmed === undefined && isUnconfirmedCommit(notice))
        record.unconfirmed = notice;
    });
    NOTICES.set(connection, record);
    notices = record;
  }
  return notices;
}
