/**
 * The operator's statements: `lease.list` (every key at a glance) and `lease.purge` (bounded
 * table growth). Sent unnamed on whatever pool or connection the caller gives: they are rare,
 * and the caller may be an operator's own `pg.Client`.
 */
import type pg from 'pg';
import { translateError } from '../errors.js';

/** One key as `lease.list` reports it (see ListedLease in operations.ts). @internal */
export interface ListedRow {
  key: string;
  held: boolean;
  owner: string | null;
  epoch: bigint;
  expiresAt: Date | null;
  /** Milliseconds left as the server measured it while listing, never below 0; `null` unless held. */
  remainingMs: number | null;
}

/** lease.list: keys starting with `prefix` (every key for `null`), held ones only if `heldOnly`. @internal */
export async function listKeys(
  database: pg.Pool | pg.ClientBase,
  prefix: string | null,
  heldOnly: boolean,
): Promise<ListedRow[]> {
  try {
    const { rows } = await database.query<{
      key: string;
      held: boolean;
      owner: string | null;
      epoch: string;
      expires_at: Date | null;
      remaining_us: number | null;
    }>(
      `SELECT l.key, l.held, l.owner, l.epoch::text AS epoch, l.expires_at,
              pg_catalog.date_part('epoch', l.expires_at - pg_catalog.clock_timestamp()) * 1000000
                AS remaining_us
         FROM lease.list($1::text, $2::boolean) AS l`,
      [prefix, heldOnly],
    );
    return rows.map((row) => ({
      key: row.key,
      held: row.held,
      owner: row.owner,
      epoch: BigInt(row.epoch),
      expiresAt: row.expires_at,
      remainingMs: row.remaining_us === null ? null : Math.max(0, row.remaining_us / 1000),
    }));
  } catch (error) {
    throw translateError(error, prefix ?? '');
  }
}

/**
 * One lease.purge call: deletes at most `batch` keys (all, for `null`) free or lapsed for at
 * least `olderThanMicroseconds`, in its own transaction on a pool; resolves with how many.
 * @internal
 */
export async function purgeKeys(
  database: pg.Pool | pg.ClientBase,
  olderThanMicroseconds: number,
  batch: number | null,
): Promise<number> {
  try {
    const { rows } = await database.query<{ deleted: string }>(
      `SELECT lease.purge($1::float8 * interval '1 microsecond', $2::bigint)::text AS deleted`,
      [olderThanMicroseconds, batch],
    );
    return Number(rows[0]!.deleted);
  } catch (error) {
    throw translateError(error, '');
  }
}
