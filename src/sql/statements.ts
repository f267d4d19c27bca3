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
 * A non-blocking acquire, with `follow` columns: the client waits between attempts itself,
 * holding no transaction (see wait.ts). `wait` is the SQL `wait` argument: only an exclusive
 * acquirer of a key in its shared phase passes one (acquireWaiting below).
 */
function ACQUIRE(follow = '', call = 'lease.acquire', wait = ''): string {
  return `SELECT a.acquired, a.epoch::text AS epoch, ${EXPIRES_MS('a')}, ${REMAINING_US('a')} AS remaining_us${follow}
       FROM ${call}($1, $2, ${MICROSECONDS('$3')}${wait}) AS a`;
}

/**
 * The holder's state after a denied attempt, as a column of the same statement: a CASE runs its
 * subquery only when the key was not granted, after the acquire (with its own snapshot); NULL
 * when the key has no row. `call` is lease.watch (which also asks for a notification of the
 * release, and says with `notifies` whether one will come) or lease.inspect.
 */
function FOLLOW(
  call: string,
  notifies: string,
  remaining = REMAINING_US('i'),
  earliest?: string,
): string {
  return `, CASE WHEN NOT a.acquired THEN (
           SELECT pg_catalog.json_build_object('held', i.held, 'notifies', ${notifies}, 'many',
                    i.held AND i.owner IS NULL, 'remaining_us', ${remaining}${earliest ? `, 'earliest_us', ${earliest}` : ''})
             FROM ${call} AS i) END AS holder`;
}

/**
 * FOLLOW's time left for a permit or a shared grant (SEMANTICS §13): a counted key, or a key in
 * its shared phase, is held while any of its grants is live, and inspect and watch report the
 * latest expiry among them; but a place comes free at the earliest one, so the waiter wakes
 * then (`lease.holders`). A key held by one owner (an exclusive holder) counts as before.
 */
const EARLIEST_REMAINING_US = `pg_catalog.date_part('epoch', CASE WHEN i.held AND i.owner IS NULL
                    THEN (SELECT pg_catalog.min(h.expires_at) FROM lease.holders($1) AS h)
                    ELSE i.expires_at END - pg_catalog.clock_timestamp()) * 1000000`;

/** @internal */
export const STATEMENTS = {
  acquire: statement('acquire', ACQUIRE()),
  /**
   * An exclusive acquire. For a key held by many it also reports the earliest grant's time left
   * (`earliest_us`): a counted key's permit, which it would get, comes free then.
   */
  acquireWatching: statement(
    'acquire_watching',
    ACQUIRE(
      FOLLOW(
        `lease.watch($1, ${MICROSECONDS('$4')})`,
        'i.notifies',
        REMAINING_US('i'),
        EARLIEST_REMAINING_US,
      ),
    ),
  ),
  acquireInspecting: statement(
    'acquire_inspecting',
    ACQUIRE(FOLLOW('lease.inspect($1)', 'false', REMAINING_US('i'), EARLIEST_REMAINING_US)),
  ),
  /** A permit of a counted key (plain lease.acquire), waking at the earliest permit's expiry. */
  acquirePermitWatching: statement(
    'acquire_permit_watching',
    ACQUIRE(FOLLOW(`lease.watch($1, ${MICROSECONDS('$4')})`, 'i.notifies', EARLIEST_REMAINING_US)),
  ),
  acquirePermitInspecting: statement(
    'acquire_permit_inspecting',
    ACQUIRE(FOLLOW('lease.inspect($1)', 'false', EARLIEST_REMAINING_US)),
  ),
  /**
   * An exclusive acquire that waits in the server for up to $4 microseconds: while the key is
   * in its shared phase it marks the key, so that no new shared grant is made (§13).
   */
  acquireWaiting: statement(
    'acquire_waiting',
    ACQUIRE('', 'lease.acquire', `, ${MICROSECONDS('$4')}`),
  ),
  acquireShared: statement('acquire_shared', ACQUIRE('', 'lease.acquire_shared')),
  acquireSharedWatching: statement(
    'acquire_shared_watching',
    ACQUIRE(
      FOLLOW(`lease.watch($1, ${MICROSECONDS('$4')})`, 'i.notifies', EARLIEST_REMAINING_US),
      'lease.acquire_shared',
    ),
  ),
  acquireSharedInspecting: statement(
    'acquire_shared_inspecting',
    ACQUIRE(FOLLOW('lease.inspect($1)', 'false', EARLIEST_REMAINING_US), 'lease.acquire_shared'),
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
