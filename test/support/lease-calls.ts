/**
 * Typed calls of the pg_lease SQL API for tests, written from specs/SEMANTICS.md: the one
 * wrapper every suite uses (extension, failure, client), plain node-postgres as an application
 * would call the SQL, never the package's client.
 *
 * Timestamps travel as microseconds since the Unix epoch (bigint), never as JS `Date`, so that
 * comparisons keep the server's full precision: `expires_at = now + ttl` can then be checked to
 * the microsecond against `clock_timestamp()` read before and after a call.
 */
import assert from 'node:assert/strict';
import pg from 'pg';

/** Anything that runs a parameterised query: a pool, a client or an isolation session. */
export interface Queryable {
  query<R extends pg.QueryResultRow = pg.QueryResultRow>(
    text: string,
    values?: unknown[],
  ): Promise<pg.QueryResult<R>>;
}

/** A call of the API: its SQL, its parameters and how to read its result rows. */
export interface Call<T> {
  readonly text: string;
  readonly values: unknown[];
  parse(result: pg.QueryResult): T;
}

/** One row of `lease.acquire`. */
export interface Acquired {
  acquired: boolean;
  epoch: bigint | null;
  /** `expires_at` in microseconds since 1970-01-01 UTC. */
  expiresAt: bigint | null;
}

/** One row of `lease.renew`. */
export interface Renewed {
  status: string;
  expiresAt: bigint | null;
}

/** One row of `lease.release`. */
export interface Released {
  status: string;
}

/** The row of `lease.inspect`, or undefined for a key never granted (zero rows). */
export interface Inspected {
  held: boolean;
  owner: string | null;
  epoch: bigint;
  expiresAt: bigint | null;
}

/** SQL expression: a timestamptz as microseconds since the Unix epoch. */
export function micros(expression: string): string {
  return `(extract(epoch FROM ${expression}) * 1000000)::bigint::text`;
}

function bigintOrNull(value: unknown): bigint | null {
  return value === null || value === undefined ? null : BigInt(value as string);
}

function oneRow(result: pg.QueryResult, what: string): Record<string, unknown> {
  assert.equal(result.rows.length, 1, `${what} must return exactly one row`);
  return result.rows[0] as Record<string, unknown>;
}

export function acquireCall(
  key: string | null,
  owner: string | null,
  ttl: string | null,
  wait?: string | null,
): Call<Acquired> {
  return grantCall('lease.acquire', key, owner, ttl, wait);
}

/** lease.acquire_shared (SEMANTICS §13): a shared grant, answered as lease.acquire answers. */
export function acquireSharedCall(
  key: string | null,
  owner: string | null,
  ttl: string | null,
  wait?: string | null,
): Call<Acquired> {
  return grantCall('lease.acquire_shared', key, owner, ttl, wait);
}

function grantCall(
  fn: 'lease.acquire' | 'lease.acquire_shared',
  key: string | null,
  owner: string | null,
  ttl: string | null,
  wait?: string | null,
): Call<Acquired> {
  const withWait = wait !== undefined;
  return {
    text:
      `SELECT acquired, epoch::text AS epoch, ${micros('expires_at')} AS expires_us ` +
      `FROM ${fn}($1::text, $2::text, $3::interval${withWait ? ', $4::interval' : ''})`,
    values: withWait ? [key, owner, ttl, wait] : [key, owner, ttl],
    parse(result) {
      const row = oneRow(result, fn);
      return {
        acquired: row.acquired as boolean,
        epoch: bigintOrNull(row.epoch),
        expiresAt: bigintOrNull(row.expires_us),
      };
    },
  };
}

/** lease.set_limit (SEMANTICS §13): the key's limit and live holders afterwards. */
export function setLimitCall(
  key: string,
  limit: number | null,
): Call<{ permit_limit: number | null; holders: number }> {
  return {
    text: 'SELECT permit_limit, holders FROM lease.set_limit($1, $2)',
    values: [key, limit],
    parse: (result) =>
      oneRow(result, 'lease.set_limit') as { permit_limit: number | null; holders: number },
  };
}

export function renewCall(
  key: string | null,
  owner: string | null,
  epoch: bigint | number | null,
  ttl: string | null,
): Call<Renewed> {
  return {
    text:
      `SELECT status, ${micros('expires_at')} AS expires_us ` +
      `FROM lease.renew($1::text, $2::text, $3::bigint, $4::interval)`,
    values: [key, owner, epoch === null ? null : String(epoch), ttl],
    parse(result) {
      const row = oneRow(result, 'lease.renew');
      return { status: row.status as string, expiresAt: bigintOrNull(row.expires_us) };
    },
  };
}

export function releaseCall(
  key: string | null,
  owner: string | null,
  epoch: bigint | number | null,
): Call<Released> {
  return {
    text: 'SELECT status FROM lease.release($1::text, $2::text, $3::bigint)',
    values: [key, owner, epoch === null ? null : String(epoch)],
    parse(result) {
      return { status: oneRow(result, 'lease.release').status as string };
    },
  };
}

export function inspectCall(key: string | null): Call<Inspected | undefined> {
  return {
    text:
      `SELECT held, owner, epoch::text AS epoch, ${micros('expires_at')} AS expires_us ` +
      `FROM lease.inspect($1::text)`,
    values: [key],
    parse(result) {
      assert.ok(result.rows.length <= 1, 'lease.inspect must return at most one row');
      const row = result.rows[0] as Record<string, unknown> | undefined;
      if (!row) return undefined;
      return {
        held: row.held as boolean,
        owner: row.owner as string | null,
        epoch: BigInt(row.epoch as string),
        expiresAt: bigintOrNull(row.expires_us),
      };
    },
  };
}

export async function run<T>(db: Queryable, call: Call<T>): Promise<T> {
  return call.parse(await db.query(call.text, call.values));
}

export const acquire = (
  db: Queryable,
  key: string | null,
  owner: string | null,
  ttl: string | null,
  wait?: string | null,
): Promise<Acquired> => run(db, acquireCall(key, owner, ttl, wait));

export const acquireShared = (
  db: Queryable,
  key: string | null,
  owner: string | null,
  ttl: string | null,
  wait?: string | null,
): Promise<Acquired> => run(db, acquireSharedCall(key, owner, ttl, wait));

/** lease.holders: every live grant of a key, [owner, epoch] in the function's order. */
export async function holders(db: Queryable, key: string): Promise<[string, bigint][]> {
  const { rows } = await db.query('SELECT owner, epoch::text FROM lease.holders($1)', [key]);
  return (rows as { owner: string; epoch: string }[]).map((r) => [r.owner, BigInt(r.epoch)]);
}

export const renew = (
  db: Queryable,
  key: string | null,
  owner: string | null,
  epoch: bigint | number | null,
  ttl: string | null,
): Promise<Renewed> => run(db, renewCall(key, owner, epoch, ttl));

export const release = (
  db: Queryable,
  key: string | null,
  owner: string | null,
  epoch: bigint | number | null,
): Promise<Released> => run(db, releaseCall(key, owner, epoch));

export const inspect = (db: Queryable, key: string | null): Promise<Inspected | undefined> =>
  run(db, inspectCall(key));

/** An acquire with the server time of the granting statement (`expires_at - ttl`). */
export interface TimedAcquired extends Acquired {
  /** When the grant was made, in microseconds; null when not granted. */
  grantedAt: bigint | null;
}

/** `lease.acquire`, also reporting when the grant was made by the server's clock. */
export async function acquireTimed(
  db: Queryable,
  key: string,
  owner: string,
  ttl: string,
  wait = '0',
): Promise<TimedAcquired> {
  const result = await db.query(
    `SELECT a.acquired, a.epoch::text AS epoch, ${micros('a.expires_at')} AS expires_us,
            ${micros('a.expires_at - $3::interval')} AS granted_us
       FROM lease.acquire($1::text, $2::text, $3::interval, $4::interval) AS a`,
    [key, owner, ttl, wait],
  );
  const row = oneRow(result, 'lease.acquire');
  return {
    acquired: row.acquired as boolean,
    epoch: bigintOrNull(row.epoch),
    expiresAt: bigintOrNull(row.expires_us),
    grantedAt: row.acquired ? bigintOrNull(row.granted_us) : null,
  };
}

/** `lease.release`, with the server clock read right after it in the same statement. */
export async function releaseTimed(
  db: Queryable,
  key: string,
  owner: string,
  epoch: bigint,
): Promise<Released & { at: bigint }> {
  const result = await db.query(
    `SELECT r.status, ${micros('clock_timestamp()')} AS at_us
       FROM lease.release($1::text, $2::text, $3::bigint) AS r`,
    [key, owner, String(epoch)],
  );
  const row = oneRow(result, 'lease.release');
  return { status: row.status as string, at: BigInt(row.at_us as string) };
}

/** inspect of several keys, one after another on the same connection. */
export async function inspectAll(
  db: Queryable,
  keys: string[],
): Promise<(Inspected | undefined)[]> {
  const states: (Inspected | undefined)[] = [];
  for (const key of keys) states.push(await inspect(db, key));
  return states;
}

/** The server clock (`clock_timestamp()`) in microseconds. */
export async function serverNow(db: Queryable): Promise<bigint> {
  const { rows } = await db.query(`SELECT ${micros('clock_timestamp()')} AS now`);
  return BigInt((rows[0] as { now: string }).now);
}

/**
 * Sleeps on the server until its clock has passed `expiresAt` (plus a millisecond, so that a
 * float rounding in pg_sleep cannot wake it a fraction of a microsecond early). This is how
 * tests let a lease lapse: by the server's clock, which is the only clock the contract knows.
 */
export async function sleepPast(db: Queryable, expiresAt: bigint | null): Promise<void> {
  assert.ok(expiresAt !== null, 'no expiry to wait for');
  await db.query(
    `SELECT pg_sleep_until(to_timestamp($1::numeric / 1000000) + interval '1 millisecond')`,
    [String(expiresAt)],
  );
}

/** Microseconds in an interval literal, computed by the server. */
export async function intervalMicros(db: Queryable, interval: string): Promise<bigint> {
  const { rows } = await db.query(
    `SELECT (extract(epoch FROM $1::interval) * 1000000)::bigint::text AS us`,
    [interval],
  );
  return BigInt((rows[0] as { us: string }).us);
}

/** The extension's one table, found in the catalog rather than assumed by name. */
export async function leaseTable(db: Queryable): Promise<string> {
  const { rows } = await db.query(
    `SELECT c.oid::regclass::text AS name
       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = 'lease' AND c.relkind IN ('r', 'p')
        AND EXISTS (SELECT FROM pg_index i JOIN pg_attribute a
                            ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                     WHERE i.indrelid = c.oid AND i.indisprimary AND i.indnatts = 1
                       AND a.attname = 'key')`,
  );
  // lease.permits (0.3.0) has a key column too, but its primary key is (key, owner).
  assert.equal(rows.length, 1, 'schema lease must hold exactly one table of keys');
  return (rows[0] as { name: string }).name;
}

/** The stored row of a key, read directly (superuser only), with its tuple identity. */
export interface StoredRow {
  owner: string | null;
  epoch: string;
  expiresAt: string | null;
  /** Physical identity of the row version: changes whenever the row is written. */
  version: string;
}

export async function storedRow(db: Queryable, key: string): Promise<StoredRow | undefined> {
  const table = await leaseTable(db);
  const { rows } = await db.query(
    `SELECT owner, epoch::text AS epoch, ${micros('expires_at')} AS "expiresAt",
            xmin::text || '/' || ctid::text AS version
       FROM ${table} WHERE key = $1`,
    [key],
  );
  return rows[0] as StoredRow | undefined;
}

/**
 * Every stored row, ordered by key, for "nothing changed" checks; only the rows of `keys` when
 * given, which a test that runs beside others of its file must pass (their rows change too).
 */
export async function allRows(db: Queryable, keys?: readonly string[]): Promise<unknown[]> {
  const table = await leaseTable(db);
  const { rows } = await db.query(
    `SELECT key, owner, epoch::text AS epoch, ${micros('expires_at')} AS expires_at,
            xmin::text || '/' || ctid::text AS version
       FROM ${table} WHERE $1::text[] IS NULL OR key = ANY ($1::text[]) ORDER BY key COLLATE "C"`,
    [keys ?? null],
  );
  return rows;
}

/** The PostgreSQL error of a rejected promise (fails the test if it resolved). */
export async function pgError(promise: Promise<unknown>): Promise<pg.DatabaseError> {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof pg.DatabaseError, `expected a PostgreSQL error, got ${error}`);
    return error;
  }
  assert.fail('expected the call to raise an error, but it succeeded');
}

/** `server_version_num` of the server behind `db`. */
export async function serverVersionNum(db: Queryable): Promise<number> {
  const { rows } = await db.query(`SELECT current_setting('server_version_num')::int AS v`);
  return (rows[0] as { v: number }).v;
}

/** A transaction left open on a lease's row by {@link blockTakeovers}. */
export interface OpenRenew {
  /** Commits the renew: the holder keeps the key, renewed. */
  commit(): Promise<void>;
  /** Rolls back if not committed, and gives the connection back. For `finally`. */
  close(): Promise<void>;
}

/**
 * Makes every attempt to take `key` over block on a row lock: renews the holder's grant in a
 * transaction left open, and waits until the committed grant (taken with a ttl of at most
 * `lapseMs`) has lapsed. A takeover of a lapsed key must lock the row; a denied acquire of a
 * held key, an inspect or a watch never waits for it.
 */
export async function blockTakeovers(
  pool: pg.Pool,
  key: string,
  holder: { owner: string; epoch: bigint },
  lapseMs = 1_200,
): Promise<OpenRenew> {
  const blocker = await pool.connect();
  let open = true;
  await blocker.query('BEGIN');
  await blocker.query('SELECT * FROM lease.renew($1, $2, $3, $4)', [
    key,
    holder.owner,
    holder.epoch.toString(),
    '1 hour',
  ]);
  await new Promise((resolve) => setTimeout(resolve, lapseMs));
  return {
    async commit() {
      await blocker.query('COMMIT');
      open = false;
    },
    async close() {
      if (open) await blocker.query('ROLLBACK').catch(() => undefined);
      open = false;
      blocker.release();
    },
  };
}
