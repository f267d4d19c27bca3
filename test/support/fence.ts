/**
 * Helpers for the fence suites: `lease.fence` as a typed call, fenced tables with the
 * `lease.fence_row` trigger, and the PLF01 checks every refusal shares.
 */
import assert from 'node:assert/strict';
import pg from 'pg';
import type { Call, Queryable } from './lease-calls.js';

/** SQLSTATE of a refused fence. */
export const STALE_EPOCH = 'PLF01';

/** `SELECT lease.fence(key, epoch)`: resolves when the fence passes, rejects when refused. */
export function fenceCall(key: string | null, epoch: bigint | number | null): Call<void> {
  return {
    text: 'SELECT lease.fence($1::text, $2::bigint)',
    values: [key, epoch === null ? null : String(epoch)],
    parse(result) {
      assert.equal(result.rows.length, 1, 'lease.fence returns one row');
    },
  };
}

export async function fence(
  db: Queryable,
  key: string | null,
  epoch: bigint | number | null,
): Promise<void> {
  const call = fenceCall(key, epoch);
  call.parse(await db.query(call.text, call.values));
}

/**
 * Asserts that `error` is a fence refusal whose DETAIL says what stands now, e.g.
 * `the key is held under epoch 3`.
 */
export function assertStale(
  error: unknown,
  key: string,
  epoch: bigint | number,
  standing: string,
): void {
  assert.ok(error instanceof pg.DatabaseError, `expected a PostgreSQL error, got ${error}`);
  assert.equal(error.code, STALE_EPOCH, `${error.code}: ${error.message} (${error.detail})`);
  assert.equal(error.message, 'pg_lease: stale epoch');
  assert.equal(
    error.detail,
    `key "${key.replaceAll('"', '""')}": epoch ${epoch} presented, but ${standing}`,
  );
}

/**
 * Creates `name (id int PRIMARY KEY, lease_key text, lease_epoch bigint, note text)` with the
 * fence_row trigger on INSERT OR UPDATE. Runs as whoever `db` connects as.
 */
export async function createFencedTable(db: Queryable, name: string): Promise<void> {
  await db.query(
    `CREATE TABLE ${name} (id int PRIMARY KEY, lease_key text, lease_epoch bigint, note text)`,
  );
  await db.query(
    `CREATE TRIGGER ${name.replace(/\W/g, '_')}_fence BEFORE INSERT OR UPDATE ON ${name}
       FOR EACH ROW EXECUTE FUNCTION lease.fence_row('lease_key', 'lease_epoch')`,
  );
}

/** Whether the current transaction holds a lock on the key's row (superuser only). */
export async function rowLockedByCurrentTransaction(
  session: Queryable,
  key: string,
): Promise<boolean> {
  const { rows } = await session.query(
    `SELECT l.xmax = pg_catalog.xid(pg_current_xact_id()) AS mine
       FROM lease.leases AS l WHERE l.key = $1`,
    [key],
  );
  return (rows[0] as { mine: boolean } | undefined)?.mine === true;
}
