/**
 * What the client knows about the connections it is given: whether it has a pool, and when a
 * connection must not be used again. Every module that takes a connection asks here.
 */
import pg from 'pg';
import { LeaseError } from './errors.js';

/** Whether `db` is a pool (the client's calls then each take a connection of it). @internal */
export function isPool(db: pg.Pool | pg.ClientBase): db is pg.Pool {
  return 'totalCount' in db && typeof (db as pg.Pool).connect === 'function';
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
 * Whether a connection that one of the client's own statements failed on must not be reused:
 * anything but an error the server reported for the statement (or the client's own refusal,
 * which sent nothing), since a driver error leaves the connection in an unknown state. @internal
 */
export function isBrokenBy(error: unknown): boolean {
  if (error instanceof LeaseError) return isConnectionGone(error);
  if (!(error instanceof pg.DatabaseError)) return true;
  return isConnectionGone(error);
}
