/**
 * Operating pg_lease: every key at a glance (`lease.list`) and bounded table growth
 * (`lease.purge`). The functions take any node-postgres pool or client;
 * {@link LeaseClient.list} and {@link LeaseClient.purge} call them with the client's own.
 */
import type pg from 'pg';
import type { Duration } from './duration.js';
import { LeaseInvalidInputError } from './errors.js';
import { listKeys, purgeKeys } from './sql/operations.js';
import { checkDuration, illFormedText } from './validation.js';

/**
 * Options of {@link listLeases}.
 *
 * @example
 * import type { ListOptions } from 'pg-lease';
 * const options: ListOptions = { prefix: 'job-', all: true };
 */
export interface ListOptions {
  /** Only keys that start with this, byte for byte. Default: every key. */
  prefix?: string;
  /** Also free and lapsed keys (`held_only => false`). Default: held keys only. */
  all?: boolean;
}

/**
 * One key as `lease.list` reports it, under the same rules as `inspect`: a lapsed grant is not
 * held, and a key that is not held shows no owner, no expiry, and its epoch as the watermark.
 *
 * @example
 * import type { ListedLease } from 'pg-lease';
 * const line = (l: ListedLease) => `${l.key} ${l.held ? l.owner : '-'} ${l.epoch}`;
 */
export interface ListedLease {
  key: string;
  held: boolean;
  /** The holder; `null` unless held. */
  owner: string | null;
  epoch: bigint;
  /** Server time the grant ends; `null` unless held. */
  expiresAt: Date | null;
  /** Milliseconds left on the grant as the server measured it while listing; `null` unless held. */
  remainingMs: number | null;
}

/**
 * Options of {@link purgeLeases}.
 *
 * @example
 * import type { PurgeOptions } from 'pg-lease';
 * const options: PurgeOptions = { olderThan: '7 days', batch: 10_000 };
 */
export interface PurgeOptions {
  /**
   * How long a key must have been free (since its release) or lapsed (since its expiry):
   * milliseconds or interval text with a unit (`'7d'`, `'12 hours'`), read like a ttl (a day is
   * 24 hours). 0 purges every dead key.
   */
  olderThan: Duration;
  /**
   * Delete in transactions of at most this many rows, until a call deletes fewer (each batch
   * holds its row locks only until it commits). Default: one call for everything.
   */
  batch?: number;
}

type Database = pg.Pool | pg.ClientBase;

/**
 * Lists keys (held ones unless `all`), in key order (byte order). Advisory: a grant may end or
 * begin as soon as the answer is sent. Any role that may call the lease API may list.
 *
 * @example
 * import { listLeases } from 'pg-lease';
 * for (const lease of await listLeases(pool, { prefix: 'job-' }))
 *   console.log(`${lease.key} held by ${lease.owner} (epoch ${lease.epoch})`);
 */
export async function listLeases(
  database: Database,
  options: ListOptions = {},
): Promise<ListedLease[]> {
  const illFormed =
    typeof options.prefix === 'string' ? illFormedText('prefix', options.prefix) : undefined;
  if (illFormed !== undefined) throw new LeaseInvalidInputError(illFormed);
  return listKeys(database, options.prefix ?? null, !options.all);
}

/**
 * Deletes keys that have been free or lapsed for at least `olderThan` and resolves with how
 * many. Held keys are never touched, and a purged key's next grant still carries an epoch
 * greater than any it had. Needs EXECUTE on `lease.purge`, which only the extension's owner has
 * until it grants it (see the README). With `batch`, runs `lease.purge(olderThan, batch)` until a
 * call deletes fewer than `batch`; each call is its own transaction on a pool.
 *
 * @example
 * import { purgeLeases } from 'pg-lease';
 * const deleted = await purgeLeases(pool, { olderThan: '7 days', batch: 10_000 });
 */
export async function purgeLeases(database: Database, options: PurgeOptions): Promise<number> {
  // The client's duration rules, as for a ttl: the server then gets exact microseconds.
  const olderThan = checkDuration('older_than', options.olderThan, 'non-negative');
  const batch = options.batch;
  const violations = [
    ...(olderThan.violation === undefined ? [] : [olderThan.violation]),
    ...(batch === undefined || (Number.isSafeInteger(batch) && batch >= 1)
      ? []
      : [`batch must be a positive whole number, got ${batch}`]),
  ];
  if (violations.length > 0)
    throw new LeaseInvalidInputError(violations.join('; '), {
      hint: 'older_than is a duration (7d, 12h, or milliseconds); batch is a positive whole number.',
    });
  let total = 0;
  for (;;) {
    const deleted = await purgeKeys(database, olderThan.microseconds!, batch ?? null);
    total += deleted;
    if (batch === undefined || deleted < batch) return total;
  }
}
