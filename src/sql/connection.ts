/**
 * What the client knows about the connections it is given: whether it has a pool, when a
 * connection must not be used again, and how a statement running on one is cancelled. Every
 * module that takes a connection asks here.
 */
import * as net from 'node:net';
import pg from 'pg';
import { LeaseError } from '../errors.js';

/** Whether `db` is a pool (the client's calls then each take a connection of it). @internal */
export function isPool(db: pg.Pool | pg.ClientBase): db is pg.Pool {
  return 'totalCount' in db && typeof (db as pg.Pool).connect === 'function';
}

/** How many connections `pool` opens at most (its `max`, node-postgres' default 10). @internal */
export function poolSize(pool: pg.Pool): number {
  return (pool as { options?: { max?: number } }).options?.max ?? 10;
}

/** The pool a client makes from a connection string, and ends when the client ends. @internal */
export function openOwnPool(connectionString: string): pg.Pool {
  return new pg.Pool({ connectionString });
}

/**
 * A pool on `config`, with `max` connections (node-postgres' default of 10 when undefined), that
 * ignores errors of idle connections: one that breaks (server restart) is dropped, and the
 * next statement opens a new one. For tools that own their pool, as the CLI does. @internal
 */
export function openPool(config: pg.PoolConfig, max?: number): pg.Pool {
  const pool = new pg.Pool(max === undefined ? config : { ...config, max });
  pool.on('error', () => undefined);
  return pool;
}

/**
 * One connection on `config`, not yet connected, that ignores its own `error` events (its next
 * statement fails instead). @internal
 */
export function openClient(config: pg.ClientConfig): pg.Client {
  const client = new pg.Client(config);
  client.on('error', () => undefined);
  return client;
}

/** Whether `error` is the server's, with SQLSTATE `code`. @internal */
export function isServerError(error: unknown, code: string): boolean {
  return error instanceof pg.DatabaseError && error.code === code;
}

/**
 * Whether the server said the connection is gone: SQLSTATE class 08 (connection exception) or
 * 57P (admin shutdown, crash shutdown, cannot connect now), on the error or, for an error the
 * client translated, on its cause. @internal
 */
export function isConnectionGone(error: unknown): boolean {
  const cause = error instanceof LeaseError ? error.cause : error;
  const code = (cause as { code?: unknown } | null | undefined)?.code;
  return typeof code === 'string' && (code.startsWith('08') || code.startsWith('57P'));
}

/**
 * Whether the server refused a statement for its input: SQLSTATE class 22 (data exception:
 * pg_lease's own 22023 invalid input, a value PostgreSQL cannot hold such as a NUL byte, an
 * out-of-range number), on the error or, for an error the client translated, on its cause. A
 * batch refused so fails for one of its elements, not for the others. @internal
 */
export function isRefusedInput(error: unknown): boolean {
  const cause = error instanceof LeaseError ? error.cause : error;
  if (!(cause instanceof pg.DatabaseError)) return false;
  return typeof cause.code === 'string' && cause.code.startsWith('22');
}

/**
 * Whether the server refused a batch statement because one of its keys is counted or in its
 * shared phase (SEMANTICS §13, 0A000 before anything was done): its calls are then sent again
 * one by one, so that a key the batches do not take costs no other call anything. @internal
 */
export function isRefusedBatch(error: unknown): boolean {
  const cause = error instanceof LeaseError ? error.cause : error;
  return cause instanceof pg.DatabaseError && cause.code === '0A000';
}

/** A batch refused for its input ({@link isRefusedInput}) or for a counted key ({@link isRefusedBatch}). @internal */
export function isRefusedForAKey(error: unknown): boolean {
  return isRefusedInput(error) || isRefusedBatch(error);
}

/**
 * Whether a connection that one of the client's own statements failed on must not be reused:
 * anything but an error the server reported for the statement (or the client's own refusal,
 * which sent nothing), since a driver error leaves the connection in an unknown state. @internal
 */
export function isBrokenBy(error: unknown): boolean {
  if (error instanceof LeaseError) return isConnectionGone(error);
  if (!(error instanceof pg.DatabaseError)) return true;
  return isConnectionGone(error);
}

/**
 * Runs `run` on `connection`; if `signal` aborts first, asks the server to cancel whatever that
 * connection runs (a protocol cancel request, as psql's Ctrl-C), so that no statement is left
 * running. Resolves or rejects as the statement ended: a cancelled one with 57014.
 *
 * A cancel request can miss: one that arrives before the statement runs reaches nothing, and
 * PgBouncer 1.18 drops one for a client whose statement still waits in its queue for a server
 * connection ("cancel request for idle client"), then runs the statement when one frees up. So
 * the request is sent again, one at a time, while the statement has not ended. With `droppable`
 * (a pool's connection, which the caller discards when it broke), a statement still not ended
 * ABORT_DROP_MS after the abort has its connection closed: a pooler then drops a statement it
 * still queues, and the attempt ends however long the queue.
 * @internal
 */
export async function runCancellable<T>(
  connection: pg.ClientBase,
  run: () => Promise<T>,
  signal: AbortSignal | undefined,
  droppable = false,
): Promise<T> {
  if (!signal) return run();
  // Aborted before the statement could be sent (while a connection was being taken, say): it is
  // not sent. A cancel request sent before the statement starts reaches nothing, so the
  // statement would then run unbounded, waiting for a row lock as long as its holder likes.
  if (signal.aborted)
    throw new LeaseError('aborted', 'pg_lease: the call was aborted before it was sent', {
      cause: signal.reason as unknown,
    });
  let ended = false;
  let wake: (() => void) | undefined;
  let drop: NodeJS.Timeout | undefined;
  let cancelled: Promise<void> | undefined;
  const cancelUntilEnded = async () => {
    for (
      let pause = CANCEL_RESEND_FIRST_MS;
      !ended;
      pause = Math.min(pause * 2, CANCEL_RESEND_MAX_MS)
    ) {
      await sendCancelRequest(connection);
      if (ended) return;
      await new Promise<void>((resolve) => {
        wake = resolve;
        setTimeout(resolve, pause).unref();
      });
    }
  };
  const onAbort = () => {
    cancelled = cancelUntilEnded();
    if (droppable) drop = setTimeout(() => dropConnection(connection), ABORT_DROP_MS);
  };
  signal.addEventListener('abort', onAbort, { once: true });
  try {
    return await run();
  } finally {
    // No cancel request is sent from now on; the one under way is waited for, so that it
    // cannot reach the statement that runs next on the connection.
    ended = true;
    wake?.();
    clearTimeout(drop);
    signal.removeEventListener('abort', onAbort);
    await cancelled;
  }
}

/** The pause before a cancel request is sent again, doubling up to CANCEL_RESEND_MAX_MS. */
const CANCEL_RESEND_FIRST_MS = 50;
const CANCEL_RESEND_MAX_MS = 1_000;
/** How long after an abort a pool's connection whose statement has not ended is closed. */
const ABORT_DROP_MS = 5_000;

/** Closes the connection's socket: its statement fails, and its caller discards it. */
function dropConnection(connection: pg.ClientBase): void {
  (connection as unknown as { connection?: { stream?: net.Socket } }).connection?.stream?.destroy();
}

/** How long a cancel request may take before its connection is dropped. */
const CANCEL_TIMEOUT_MS = 10_000;

/**
 * The CancelRequest message of the protocol, sent on a connection of its own. Resolves once the
 * other side has closed that connection, which it does after acting on the request, as libpq
 * waits: the connection goes back to the pool only then, so the cancel cannot reach the
 * statement that runs on it next. Closing from this side first also crashes PgBouncer 1.18
 * (`disconnect_client(): bad client state: 0`) when it is still forwarding the request.
 */
function sendCancelRequest(connection: pg.ClientBase): Promise<void> {
  const target = connection as unknown as {
    processID?: number;
    secretKey?: number;
    host?: string;
    port?: number;
  };
  if (target.processID === undefined || target.secretKey === undefined) return Promise.resolve();
  const host = target.host ?? 'localhost';
  const port = target.port ?? 5432;
  return new Promise((resolve) => {
    const socket = host.startsWith('/')
      ? net.connect(`${host}/.s.PGSQL.${port}`)
      : net.connect(port, host);
    const message = Buffer.alloc(16);
    message.writeInt32BE(16, 0);
    message.writeInt32BE(80877102, 4);
    message.writeInt32BE(target.processID!, 8);
    message.writeInt32BE(target.secretKey!, 12);
    const timer = setTimeout(() => socket.destroy(), CANCEL_TIMEOUT_MS);
    socket.once('connect', () => socket.write(message));
    socket.on('data', () => undefined); // nothing is expected; a reply is read and dropped
    socket.once('end', () => socket.end());
    socket.once('error', () => socket.destroy());
    socket.once('close', () => {
      clearTimeout(timer);
      resolve();
    });
  });
}
