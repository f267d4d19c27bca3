/**
 * The SQL the client sends, one named statement per call.
 *
 * node-postgres sends a query with a `name` as a prepared statement: parsed and planned once per
 * connection, then only bound and executed. An unnamed query is parsed and planned on every
 * call, which costs the server more than some of pg_lease's calls do themselves. Names carry a
 * hash of the text, so two versions of the client on one connection never share a name for
 * different SQL (node-postgres refuses that).
 *
 * Behind a pooler in transaction mode (PgBouncer before 1.21, or with
 * `max_prepared_statements = 0`) consecutive statements of a client may run on different server
 * connections, where a statement prepared on one is unknown. The client then falls back to
 * unnamed statements at the first refusal (see `Wire.query` in wire.ts); its
 * `preparedStatements: false` option starts unnamed.
 */
import { createHash } from 'node:crypto';

/** One statement of the client: its SQL and the name it is prepared under. @internal */
export interface Statement {
  readonly name: string;
  readonly text: string;
}

function statement(label: string, text: string): Statement {
  const hash = createHash('sha256').update(text).digest('hex').slice(0, 12);
  return { name: `pg_lease_${label}_${hash}`, text };
}

/** `$n` microseconds as an interval, exactly (float8 holds every whole number up to 2^53). */
function MICROSECONDS(parameter: string): string {
  return `(${parameter}::float8 * interval '1 microsecond')`;
}

/**
 * Time left on a grant in microseconds, measured by the server while it answers: any
 * clock_timestamp() of the statement is later than the client's send, which is all the
 * deadline needs.
 */
export function REMAINING_US(alias: string): string {
  return `pg_catalog.date_part('epoch', ${alias}.expires_at - pg_catalog.clock_timestamp()) * 1000000`;
}

/**
 * A grant's expiry as milliseconds since the Unix epoch (float8). Cheaper than a timestamptz on
 * both sides: the server formats no date text, the client parses none (see {@link dateFromMs}).
 */
export function EXPIRES_MS(alias: string): string {
  // Whole milliseconds computed in numeric, as a float8 (exact below 2^53): a float8 product
  // would put some instants of later centuries a fraction below their millisecond.
  return `pg_catalog.trunc(EXTRACT(EPOCH FROM ${alias}.expires_at) * 1000)::pg_catalog.float8 AS expires_ms`;
}

/** An `expires_ms` column as a Date (millisecond precision, as node-postgres parses dates). */
export function dateFromMs(ms: number | null): Date | null {
  return ms === null ? null : new Date(ms);
}

/** A `remaining_us` column (see {@link REMAINING_US}) in milliseconds. */
export function msFromUs(us: number | null | undefined): number | null {
  return us == null ? null : us / 1000;
}

/**
 * A non-blocking acquire. `wait` is the SQL `wait` argument: only an exclusive acquirer of a key
 * in its shared phase passes one (acquireWaiting below).
 */
function ACQUIRE(call = 'lease.acquire', wait = ''): string {
  return `SELECT a.acquired, a.epoch::text AS epoch, ${EXPIRES_MS('a')}, ${REMAINING_US('a')} AS remaining_us
       FROM ${call}($1, $2, ${MICROSECONDS('$3')}${wait}) AS a`;
}

/**
 * A non-blocking acquire followed by the holder's state after a denied attempt, as a column:
 * the client waits between attempts itself, holding no transaction (see wait.ts). The CASE runs
 * its subquery only when the key was not granted, after the acquire; the column is NULL when the
 * key has no row. lease.watch (VOLATILE) reads the key anew; lease.inspect and lease.holders
 * (STABLE) read it in the statement's snapshot, on the server's clock at their call. `follow` is lease.watch (which also asks for a
 * notification of the release, and says with `notifies` whether one will come) or
 * lease.inspect. `remaining_us` is the holder's time left, the latest grant's for a key held by
 * many.
 *
 * `earliest_us` is the time left on the key's earliest grant when many hold it (SEMANTICS §13):
 * a counted key, or a key in its shared phase, is held while any of its grants is live, and
 * inspect and watch report the latest expiry among them; but a place comes free at the earliest
 * one, so the waiter wakes then. That expiry (`b.earliest`) is read before the attempt: the
 * LATERAL reference to `b.key` makes the server read it first. Read after a denial it would miss
 * a grant that lapsed in between, and the waiter would sleep until the next grant's expiry or its
 * poll. A grant made in between with an earlier expiry is missed either way, as is any grant
 * made after the answer. A key held by one owner, or by many none of whom held it before the
 * attempt, reports its holder's expiry.
 */
function ACQUIRE_FOLLOWING(follow: 'watch' | 'inspect', call = 'lease.acquire'): string {
  const [state, notifies] =
    follow === 'watch'
      ? [`lease.watch(b.key, ${MICROSECONDS('$4')})`, 'i.notifies']
      : ['lease.inspect(b.key)', 'false'];
  return `SELECT a.acquired, a.epoch::text AS epoch, ${EXPIRES_MS('a')}, ${REMAINING_US('a')} AS remaining_us,
         CASE WHEN NOT a.acquired THEN (
           SELECT pg_catalog.json_build_object('held', i.held, 'notifies', ${notifies}, 'many',
                    i.held AND i.owner IS NULL, 'remaining_us', ${REMAINING_US('i')}, 'earliest_us', ${EARLIEST})
             FROM ${state} AS i) END AS holder
       FROM (SELECT $1::text AS key, pg_catalog.min(h.expires_at) AS earliest
               FROM lease.holders($1) AS h) AS b
       CROSS JOIN LATERAL ${call}(b.key, $2, ${MICROSECONDS('$3')}) AS a`;
}

/** ACQUIRE_FOLLOWING's `earliest_us`. */
const EARLIEST = `pg_catalog.date_part('epoch', CASE WHEN i.held AND i.owner IS NULL AND b.earliest IS NOT NULL
                    THEN b.earliest ELSE i.expires_at END - pg_catalog.clock_timestamp()) * 1000000`;

/** @internal */
export const STATEMENTS = {
  acquire: statement('acquire', ACQUIRE()),
  /** An exclusive acquire; on a counted key it gets a permit (§13), as a permit's acquire does. */
  acquireWatching: statement('acquire_watching', ACQUIRE_FOLLOWING('watch')),
  acquireInspecting: statement('acquire_inspecting', ACQUIRE_FOLLOWING('inspect')),

  /**
   * An exclusive acquire that waits in the server for up to $4 microseconds: while the key is
   * in its shared phase it marks the key, so that no new shared grant is made (§13).
   */
  acquireWaiting: statement('acquire_waiting', ACQUIRE('lease.acquire', `, ${MICROSECONDS('$4')}`)),
  acquireShared: statement('acquire_shared', ACQUIRE('lease.acquire_shared')),
  acquireSharedWatching: statement(
    'acquire_shared_watching',
    ACQUIRE_FOLLOWING('watch', 'lease.acquire_shared'),
  ),
  acquireSharedInspecting: statement(
    'acquire_shared_inspecting',
    ACQUIRE_FOLLOWING('inspect', 'lease.acquire_shared'),
  ),
  setLimit: statement(
    'set_limit',
    'SELECT s.permit_limit, s.holders FROM lease.set_limit($1, $2::integer) AS s',
  ),
  holders: statement(
    'holders',
    `SELECT h.owner, h.epoch::text AS epoch, ${EXPIRES_MS('h')}, ${REMAINING_US('h')} AS remaining_us
       FROM lease.holders($1) AS h`,
  ),
  renew: statement(
    'renew',
    `SELECT r.status, ${EXPIRES_MS('r')}, ${REMAINING_US('r')} AS remaining_us
       FROM lease.renew($1, $2, $3::bigint, ${MICROSECONDS('$4')}) AS r`,
  ),
  release: statement('release', 'SELECT r.status FROM lease.release($1, $2, $3::bigint) AS r'),
  inspect: statement(
    'inspect',
    'SELECT i.held, i.owner, i.epoch::text AS epoch, i.expires_at FROM lease.inspect($1) AS i',
  ),
  /**
   * The time left on one live grant: lease.holders, which also lists a permit or shared grant
   * (lease.inspect names no owner for a key held by many, §13).
   */
  measureDeadline: statement(
    'measure_deadline',
    `SELECT h.owner, h.epoch::text AS epoch, ${REMAINING_US('h')} AS remaining_us
       FROM lease.holders($1) AS h WHERE h.owner = $2 AND h.epoch = $3::bigint`,
  ),
  acquireMany: statement(
    'acquire_many',
    `SELECT a.key, a.acquired, a.epoch::text AS epoch, ${EXPIRES_MS('a')}, ${REMAINING_US('a')} AS remaining_us
       FROM lease.acquire_many($1::text[], $2, ${MICROSECONDS('$3')}) AS a`,
  ),
  renewMany: statement(
    'renew_many',
    `SELECT r.key, r.status, ${EXPIRES_MS('r')}, ${REMAINING_US('r')} AS remaining_us
       FROM lease.renew_many($1::text[], $2, $3::bigint[], ${MICROSECONDS('$4')}) AS r`,
  ),
  /** renew_many that answers `locked` for a key whose row another transaction holds. */
  renewManySkippingLocked: statement(
    'renew_many_skipping_locked',
    `SELECT r.key, r.status, ${EXPIRES_MS('r')}, ${REMAINING_US('r')} AS remaining_us
       FROM lease.renew_many($1::text[], $2, $3::bigint[], ${MICROSECONDS('$4')}, true) AS r`,
  ),
  releaseMany: statement(
    'release_many',
    'SELECT r.key, r.status FROM lease.release_many($1::text[], $2, $3::bigint[]) AS r',
  ),
} as const;

/** Most keys one batch statement takes (the server's limit, `lease._max_keys()`). */
export { MAX_BATCH_KEYS } from '../generated/sql.js';
