/**
 * The four pg_lease functions called with plain node-postgres, as an application would call
 * them. The failure suite deliberately does not use the package's client: it tests the SQL.
 *
 * Timestamps come back as microseconds since the Unix epoch (`bigint`), computed by the
 * server, so comparisons keep PostgreSQL's full precision; a JS `Date` would round to
 * milliseconds.
 */
import type pg from 'pg';

/** Anything that runs a query: a client, a pool client or a pool. */
export interface Queryable {
  query<R extends pg.QueryResultRow = pg.QueryResultRow>(
    text: string,
    values?: unknown[],
  ): Promise<pg.QueryResult<R>>;
}

/** The row `lease.acquire` returns. */
export interface AcquireResult {
  acquired: boolean;
  epoch: number | null;
  /** `expires_at` in microseconds since the Unix epoch. */
  expiresUs: bigint | null;
  /** Server time of the granting statement (`expires_at - ttl`), when granted. */
  grantedUs: bigint | null;
}

/** The row `lease.renew` returns. */
export interface RenewResult {
  status: LeaseStatus;
  expiresUs: bigint | null;
}

/** The row `lease.inspect` returns for a key that was ever granted. */
export interface Inspection {
  held: boolean;
  owner: string | null;
  epoch: number;
  expiresUs: bigint | null;
}

export type LeaseStatus = 'ok' | 'not_owner' | 'lapsed' | 'epoch_mismatch';

interface RawGrant extends pg.QueryResultRow {
  acquired: boolean;
  epoch: string | null;
  expires_us: string | null;
  granted_us: string | null;
}

const US = `(extract(epoch FROM %s) * 1000000)::bigint`;
const us = (expression: string) => US.replace('%s', expression);

export async function acquire(
  db: Queryable,
  key: string,
  owner: string,
  ttl: string,
  wait = '0',
): Promise<AcquireResult> {
  const { rows } = await db.query<RawGrant>(
    `SELECT r.acquired, r.epoch, ${us('r.expires_at')} AS expires_us,
            ${us('r.expires_at - $3::interval')} AS granted_us
       FROM lease.acquire($1, $2, $3::interval, $4::interval) AS r`,
    [key, owner, ttl, wait],
  );
  return toGrant(onlyRow(rows, 'lease.acquire'));
}

export async function renew(
  db: Queryable,
  key: string,
  owner: string,
  epoch: number,
  ttl: string,
): Promise<RenewResult> {
  const { rows } = await db.query<{ status: LeaseStatus; expires_us: string | null }>(
    `SELECT r.status, ${us('r.expires_at')} AS expires_us
       FROM lease.renew($1, $2, $3, $4::interval) AS r`,
    [key, owner, epoch, ttl],
  );
  const row = onlyRow(rows, 'lease.renew');
  return { status: row.status, expiresUs: toBigInt(row.expires_us) };
}

/** Release; `atUs` is the server clock read right after the call, in the same statement. */
export async function release(
  db: Queryable,
  key: string,
  owner: string,
  epoch: number,
): Promise<{ status: LeaseStatus; atUs: bigint }> {
  const { rows } = await db.query<{ status: LeaseStatus; at_us: string }>(
    `SELECT r.status, ${us('clock_timestamp()')} AS at_us FROM lease.release($1, $2, $3) AS r`,
    [key, owner, epoch],
  );
  const row = onlyRow(rows, 'lease.release');
  return { status: row.status, atUs: BigInt(row.at_us) };
}

/** The key's state as inspect reports it, or undefined for a key never granted. */
export async function inspect(db: Queryable, key: string): Promise<Inspection | undefined> {
  const { rows } = await db.query<{
    held: boolean;
    owner: string | null;
    epoch: string;
    expires_us: string | null;
  }>(
    `SELECT r.held, r.owner, r.epoch, ${us('r.expires_at')} AS expires_us
       FROM lease.inspect($1) AS r`,
    [key],
  );
  if (rows.length > 1) throw new Error(`lease.inspect returned ${rows.length} rows`);
  const row = rows[0];
  if (!row) return undefined;
  return {
    held: row.held,
    owner: row.owner,
    epoch: Number(row.epoch),
    expiresUs: toBigInt(row.expires_us),
  };
}

/** inspect of several keys, one after another on the same connection. */
export async function inspectAll(
  db: Queryable,
  keys: string[],
): Promise<(Inspection | undefined)[]> {
  const states: (Inspection | undefined)[] = [];
  for (const key of keys) states.push(await inspect(db, key));
  return states;
}

/** The server's `clock_timestamp()` in microseconds since the Unix epoch. */
export async function serverNowUs(db: Queryable): Promise<bigint> {
  const { rows } = await db.query<{ now_us: string }>(
    `SELECT ${us('clock_timestamp()')} AS now_us`,
  );
  return BigInt(onlyRow(rows, 'clock_timestamp').now_us);
}

function toGrant(row: RawGrant): AcquireResult {
  return {
    acquired: row.acquired,
    epoch: row.epoch === null ? null : Number(row.epoch),
    expiresUs: toBigInt(row.expires_us),
    grantedUs: row.acquired ? toBigInt(row.granted_us) : null,
  };
}

function toBigInt(value: string | null): bigint | null {
  return value === null ? null : BigInt(value);
}

function onlyRow<R>(rows: R[], what: string): R {
  if (rows.length !== 1) throw new Error(`${what} returned ${rows.length} rows, expected 1`);
  return rows[0]!;
}
