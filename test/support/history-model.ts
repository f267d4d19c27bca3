/**
 * A model of the pg_lease contract (specs/SEMANTICS.md) that checks a recorded concurrent
 * history: every call with the server's clock read around it, its result or SQLSTATE, and the
 * outcome of its transaction. test/extension/history.test.ts records such histories.
 *
 * What a concurrent history can tell. The commit order of transactions that overlap is unknown,
 * and so is the instant inside a statement at which it read the key's row. So every fact is an
 * interval of server time (microseconds since the Unix epoch, from `clock_timestamp()` and
 * `statement_timestamp()`, all read on the one server clock):
 *
 * - a statement ran within [t0, t1]: `statement_timestamp()` before it began, `clock_timestamp()`
 *   in its own result list after the function returned. Every clock reading the function itself
 *   makes (its `now`, the one `expires_at` is computed from) lies in that interval;
 * - a transaction committed within [endLo, endHi]: after the last clock reading taken inside it,
 *   before the first reading its session took after the commit returned (an autocommit call's
 *   own t1 and its session's next statement);
 * - a call read the key's committed state at one instant of its *state window*. Under READ
 *   COMMITTED that is [t0, t1] for a call whose function is VOLATILE: each of its statements
 *   takes a snapshot of its own inside the call. inspect and list are STABLE: they read with the
 *   snapshot of the SELECT that calls them, and the runner sends that SELECT with the extended
 *   query protocol (Parse, Bind, Describe, Execute, Sync), under which the server takes the
 *   SELECT's snapshot at Bind (PortalStart) but sets statement_timestamp() again when Execute
 *   arrives (postgres.c sets it for each of those messages). A backend that loses the CPU
 *   between Bind and Execute thus reads a state older than t0. Their window therefore starts
 *   at `sent`, the session's last clock reading before the request left the client (the runner
 *   takes one right before each of these calls, so that the window stays narrow).
 *   Under REPEATABLE READ it is the window of the statement that took the snapshot (the runner
 *   takes it with a clock reading right after BEGIN, a simple query).
 *
 * A write of another transaction is then *visible* to a call for certain when it committed before
 * the call's state window began, *maybe* when the windows overlap, and not at all when it committed
 * after the window ended; a session's own writes are visible exactly when they came earlier and
 * were committed or are in the same transaction. A rolled-back transaction's writes are visible to
 * nobody else (§11 item 6). Every check below asserts only what holds in *every* order and timing
 * consistent with those intervals, so a correct implementation cannot fail it, whatever the
 * scheduling: a check that cannot decide stays silent.
 *
 * The model also relies on how the runner uses owners: an owner name is used for grants by one
 * session only (it is checked), so that session's own view of its grants, renewals and
 * releases is exact; other sessions use it only as a fake owner that must always be refused.
 */

/** mulberry32: a small seeded generator of numbers in [0, 1). */
export function generator(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export type Isolation = 'autocommit' | 'read committed' | 'repeatable read';

export interface Txn {
  id: number;
  session: number;
  isolation: Isolation;
  outcome: 'open' | 'committed' | 'rolled back';
  /** The commit (or end) came after this server time: the last clock reading inside it. */
  endLo: bigint;
  /** The commit (or end) came before this server time: the session's next clock reading. */
  endHi: bigint;
  /** REPEATABLE READ: the snapshot was taken in [snapLo, snapHi]. */
  snapLo?: bigint;
  snapHi?: bigint;
  calls: Call[];
}

export type Request =
  | { op: 'acquire'; key: string; owner: string; ttlUs: bigint; waitUs: bigint }
  | { op: 'acquire_many'; keys: string[]; owner: string; ttlUs: bigint }
  | { op: 'renew'; key: string; owner: string; epoch: bigint; ttlUs: bigint }
  | { op: 'renew_many'; keys: string[]; owner: string; epochs: bigint[]; ttlUs: bigint }
  | { op: 'release'; key: string; owner: string; epoch: bigint }
  | { op: 'release_many'; keys: string[]; owner: string; epochs: bigint[] }
  | { op: 'fence'; key: string; epoch: bigint }
  | { op: 'fenced_insert'; key: string; epoch: bigint; id: number }
  | { op: 'fenced_update'; key: string; epoch: bigint; id: number }
  | { op: 'watch'; key: string; waitUs: bigint }
  | { op: 'purge'; olderThanUs: bigint; limit: number | null }
  | { op: 'inspect'; key: string }
  | { op: 'list'; prefix: string; heldOnly: boolean; keys: string[] };

/** A key as inspect, watch and list report it. */
export interface KeyState {
  key: string;
  held: boolean;
  owner: string | null;
  epoch: bigint;
  expiresAt: bigint | null;
}

export interface Granted {
  key: string;
  acquired: boolean;
  epoch: bigint | null;
  expiresAt: bigint | null;
}

export interface Status {
  key: string;
  status: string;
  expiresAt: bigint | null;
}

export type Response =
  | { kind: 'grants'; rows: Granted[] }
  | { kind: 'statuses'; rows: Status[] }
  | { kind: 'states'; rows: KeyState[] }
  | { kind: 'fenced' }
  | { kind: 'purged'; count: number };

export interface Call {
  /** Issue order over all sessions: the number of the operation. */
  id: number;
  session: number;
  /** Position in its session's order of calls. */
  index: number;
  txn: Txn;
  request: Request;
  /**
   * Server time before and after the statement. For a call that failed, the session's clock
   * readings around it (wider, so still bounds).
   */
  t0: bigint;
  t1: bigint;
  /**
   * A server time before the request left the client: the t1 of the session's previous
   * statement (or clock reading). The snapshot of the call's own SELECT is taken after it.
   */
  sent: bigint;
  response?: Response;
  error?: { code: string; message: string; detail?: string };
}

export interface History {
  calls: Call[];
  txns: Txn[];
  /** Every key the runner used (list results are checked against them). */
  keys: string[];
  /** The fenced table as read at the end: id -> key and epoch. */
  fencedRows?: Map<number, { key: string; epoch: bigint }>;
}

export interface Violation {
  /** I1 ... I12, or `§...` for a rule of the operations' tables, or `error`. */
  invariant: string;
  message: string;
  calls: Call[];
}

type Visibility = 'yes' | 'maybe' | 'no';

/** One grant of a new epoch (not a same-owner re-acquire), committed or not. */
interface Lease {
  key: string;
  owner: string;
  epoch: bigint;
  expiresAt: bigint;
  call: Call;
  /** renew ok of this grant, in its session's order. */
  renewals: { call: Call; expiresAt: bigint }[];
  /** release ok of this grant. */
  releases: Call[];
}

/** Where a call read the key, and when its own clock readings were taken. */
interface View {
  call: Call;
  stateLo: bigint;
  stateHi: bigint;
}

/** A state of a key with a place in its commit order, for the epoch-order checks. */
interface OrderItem {
  key: string;
  /** The state's epoch (a release: the watermark it leaves, epoch + 1). */
  value: bigint;
  /** Every state before this one in commit order has an epoch of at most this. */
  maxBefore: bigint;
  /** The state was current (committed, or read) at an instant in [lo, hi]. */
  lo: bigint;
  hi: bigint;
  call: Call;
  what: string;
  fresh: boolean;
}

const RENEW_OPS = new Set(['renew', 'renew_many', 'release', 'release_many']);
const FENCE_OPS = new Set(['fence', 'fenced_insert', 'fenced_update']);

/**
 * Calls of STABLE functions, which read with the snapshot of the SELECT that calls them: taken at
 * Bind, which may come before the statement_timestamp() of Execute (t0). See the header.
 */
export const STATEMENT_SNAPSHOT_OPS: ReadonlySet<Request['op']> = new Set(['inspect', 'list']);

function view(call: Call): View {
  if (call.txn.isolation === 'repeatable read')
    return { call, stateLo: call.txn.snapLo!, stateHi: call.txn.snapHi! };
  if (STATEMENT_SNAPSHOT_OPS.has(call.request.op))
    return { call, stateLo: call.sent, stateHi: call.t1 };
  return { call, stateLo: call.t0, stateHi: call.t1 };
}

/** Whether the write made by call `w` is visible to the state that `v` read. */
function visibility(w: Call, v: View): Visibility {
  const reader = v.call;
  if (w.txn === reader.txn) return w.index < reader.index ? 'yes' : 'no';
  if (w.txn.outcome !== 'committed') return 'no';
  if (w.session === reader.session) return w.index < reader.index ? 'yes' : 'no';
  if (w.txn.endHi < v.stateLo) return 'yes';
  if (w.txn.endLo < v.stateHi) return 'maybe';
  return 'no';
}

const min = (xs: bigint[]) => xs.reduce((a, b) => (b < a ? b : a));
const max = (xs: bigint[]) => xs.reduce((a, b) => (b > a ? b : a));

interface Standing {
  visible: Visibility;
  /** The expiries that may be in force in the view (the grant's, or a renewal's). */
  expiries: bigint[];
  released: Visibility;
}

/** What a view can know of a grant. */
function standing(lease: Lease, v: View): Standing {
  const visible = visibility(lease.call, v);
  let expiries = [lease.expiresAt];
  for (const renewal of lease.renewals) {
    const seen = visibility(renewal.call, v);
    if (seen === 'yes') expiries = [renewal.expiresAt];
    else if (seen === 'maybe') expiries.push(renewal.expiresAt);
  }
  let released: Visibility = 'no';
  for (const release of lease.releases) {
    const seen = visibility(release, v);
    if (seen === 'yes') released = 'yes';
    else if (seen === 'maybe' && released === 'no') released = 'maybe';
  }
  return { visible, expiries, released };
}

/** The request's ttl or wait, if any. */
function ttlOf(request: Request): bigint | undefined {
  return 'ttlUs' in request ? request.ttlUs : undefined;
}

function requestKeys(request: Request): string[] {
  if ('keys' in request) return request.keys;
  if ('key' in request) return [request.key];
  return [];
}

/** Checks a history against the contract; returns every violation found. */
export function checkHistory(history: History): Violation[] {
  const found: Violation[] = [];
  const violation = (invariant: string, message: string, ...calls: Call[]) =>
    found.push({ invariant, message, calls: [...new Set(calls)] });

  const calls = [...history.calls].sort((a, b) => a.id - b.id);
  const ownerSession = new Map<string, number>();
  const leasesByKey = new Map<string, Lease[]>();
  const leasesOf = (key: string) => {
    let list = leasesByKey.get(key);
    if (!list) leasesByKey.set(key, (list = []));
    return list;
  };
  /** Same-owner re-acquires: the grant they returned. */
  const sameOwner = new Map<Granted, Lease>();
  const freshOf = new Map<Granted, Lease>();

  // Pass 1: grants of new epochs, and the renewals and releases of each.
  for (const call of calls) {
    if (!call.response || call.response.kind === 'fenced' || call.response.kind === 'purged')
      continue;
    const request = call.request;
    if (call.response.kind === 'grants') {
      const owner = (request as { owner: string }).owner;
      const session = ownerSession.get(owner);
      if (session === undefined) ownerSession.set(owner, call.session);
      else if (session !== call.session)
        throw new Error(`history runner: owner ${owner} acquired from two sessions`);
      const v = view(call);
      for (const row of call.response.rows) {
        if (!row.acquired || row.epoch === null || row.expiresAt === null) continue;
        // The same owner's grant of that epoch, if it was still its own and live: then this is
        // a same-owner re-acquire. After a release or a lapse (the session knows its own
        // expiry exactly) a grant is a new one, whatever epoch it carries.
        const previous = leasesOf(row.key)
          .filter(
            (lease) =>
              lease.owner === owner &&
              lease.epoch === row.epoch &&
              visibility(lease.call, v) === 'yes',
          )
          .pop();
        const s = previous && standing(previous, v);
        if (previous && s && s.released !== 'yes' && max(s.expiries) > call.t0) {
          sameOwner.set(row, previous);
        } else {
          const lease: Lease = {
            key: row.key,
            owner,
            epoch: row.epoch,
            expiresAt: row.expiresAt,
            call,
            renewals: [],
            releases: [],
          };
          leasesOf(row.key).push(lease);
          freshOf.set(row, lease);
        }
      }
    } else if (call.response.kind === 'statuses') {
      const owner = (request as { owner: string }).owner;
      const epochs = 'epochs' in request ? request.epochs : [(request as { epoch: bigint }).epoch];
      const keys = requestKeys(request);
      const v = view(call);
      call.response.rows.forEach((row, i) => {
        if (row.status !== 'ok') return;
        const lease = leasesOf(keys[i]!)
          .filter(
            (l) => l.owner === owner && l.epoch === epochs[i] && visibility(l.call, v) !== 'no',
          )
          .pop();
        if (!lease) return; // reported in pass 2
        if (request.op.startsWith('renew'))
          lease.renewals.push({ call, expiresAt: row.expiresAt! });
        else lease.releases.push(call);
      });
    }
  }

  const allLeases = [...leasesByKey.values()].flat();
  const describeLease = (lease: Lease) =>
    `epoch ${lease.epoch} of ${lease.key} granted to ${lease.owner} by #${lease.call.id}`;

  /**
   * The grant that certainly holds the key throughout the call, if one does: its commit is
   * visible for certain, no release of it may be, every expiry that may be in force is after the
   * call's last clock reading, and no grant of a greater epoch may be visible. Only then is the
   * state the call decided on known (purge never deletes a held key).
   */
  const certainHolder = (key: string, v: View): Lease | undefined => {
    let top: { lease: Lease; s: Standing } | undefined;
    for (const lease of leasesOf(key)) {
      const s = standing(lease, v);
      if (s.visible === 'no') continue;
      if (!top || lease.epoch > top.lease.epoch) top = { lease, s };
    }
    if (!top) return undefined;
    const { lease, s } = top;
    return s.visible === 'yes' && s.released === 'no' && min(s.expiries) > v.call.t1
      ? lease
      : undefined;
  };

  /** I5: an expiry computed in this call is server time + ttl, the time read inside the call. */
  const checkExpiry = (call: Call, expiresAt: bigint | null, ttl: bigint, what: string) => {
    if (expiresAt === null) {
      violation('I5', `${what} returned no expiry`, call);
      return;
    }
    const at = expiresAt - ttl;
    if (at < call.t0 || at > call.t1)
      violation(
        'I5',
        `${what}: expires_at - ttl is ${at - call.t0} us after the statement began, ` +
          `outside the statement [0, ${call.t1 - call.t0}] us`,
        call,
      );
  };

  const checkError = (call: Call) => {
    const { code, message, detail } = call.error!;
    const request = call.request;
    if (code === '40P01') return; // any transaction may be a deadlock's victim
    if (code === '40001' && call.txn.isolation === 'repeatable read') return; // §5, §10
    if (code === 'PLF01' && FENCE_OPS.has(request.op)) return; // checked below
    if (
      code === '57014' &&
      request.op === 'acquire' &&
      request.waitUs > 0n &&
      message === 'pg_lease: acquire timed out'
    )
      return;
    violation(
      code === '40001' ? '§5' : 'error',
      `unexpected error ${code} under ${call.txn.isolation}: ${message}${detail ? ` (${detail})` : ''}`,
      call,
    );
  };

  /** Calls of a transaction that wrote a key, by key: the index of its first write. */
  const firstWrite = new Map<Txn, Map<string, number>>();
  const wrote = (call: Call, key: string | '*') => {
    let keys = firstWrite.get(call.txn);
    if (!keys) firstWrite.set(call.txn, (keys = new Map()));
    if (!keys.has(key)) keys.set(key, call.index);
  };
  for (const call of calls) {
    const response = call.response;
    if (!response) continue;
    if (response.kind === 'purged') wrote(call, '*');
    else if (response.kind === 'grants')
      for (const row of response.rows) if (freshOf.has(row)) wrote(call, row.key);
    if (response.kind === 'statuses')
      for (const row of response.rows) if (row.status === 'ok') wrote(call, row.key);
  }
  /** Whether the call may have read a write of its own uncommitted transaction to the key. */
  const tainted = (call: Call, key: string) => {
    const keys = firstWrite.get(call.txn);
    if (!keys) return false;
    const first = [keys.get(key), keys.get('*')].filter((i): i is number => i !== undefined);
    return first.some((i) => i < call.index);
  };

  const items: OrderItem[] = [];
  const readItem = (call: Call, v: View, key: string, epoch: bigint, what: string) => {
    if (tainted(call, key)) return;
    items.push({
      key,
      value: epoch,
      maxBefore: epoch,
      lo: v.stateLo,
      hi: v.stateHi,
      call,
      what,
      fresh: false,
    });
  };

  // Pass 2: each call's answer against what its view allows.
  for (const call of calls) {
    const v = view(call);
    const request = call.request;
    if (call.error) {
      checkError(call);
      if (call.error.code === 'PLF01' && FENCE_OPS.has(request.op)) {
        const { key, epoch } = request as { key: string; epoch: bigint };
        const holder = certainHolder(key, v);
        if (holder && holder.epoch === epoch)
          violation(
            'I12',
            `fence of ${key} under epoch ${epoch} refused, but ${describeLease(holder)} was live throughout`,
            call,
            holder.call,
          );
      }
      continue;
    }
    const response = call.response!;
    if (response.kind === 'grants') {
      const { owner } = request as { owner: string };
      for (const row of response.rows) {
        if (!row.acquired) {
          if (row.epoch !== null || row.expiresAt !== null)
            violation('§4 acquire', `${row.key}: a denial returned an epoch or expiry`, call);
          if (request.op === 'acquire' && request.waitUs > 0n)
            violation('§4 acquire', `${row.key}: a blocking acquire returned not acquired`, call);
          const holders = leasesOf(row.key).filter((lease) => {
            if (lease.owner === owner) return false;
            const s = standing(lease, v);
            return s.visible !== 'no' && s.released !== 'yes' && max(s.expiries) > call.t0;
          });
          if (holders.length === 0)
            violation(
              'I1',
              `${row.key}: denied to ${owner}, but no other owner's grant can have been live during the call`,
              call,
            );
          continue;
        }
        const same = sameOwner.get(row);
        if (same) {
          const s = standing(same, v);
          if (!s.expiries.includes(row.expiresAt!))
            violation(
              'I4',
              `${owner} re-acquired ${row.key} (epoch ${row.epoch}) with another expiry than its grant's`,
              call,
              same.call,
              ...same.renewals.map((r) => r.call),
            );
          readItem(call, v, row.key, row.epoch!, `same-owner acquire of epoch ${row.epoch}`);
          continue;
        }
        const lease = freshOf.get(row)!;
        checkExpiry(
          call,
          row.expiresAt,
          ttlOf(request)!,
          `${row.key}: grant of epoch ${row.epoch}`,
        );
        const holder = certainHolder(row.key, v);
        if (holder && holder.owner !== owner)
          violation(
            'I1',
            `${row.key}: granted epoch ${lease.epoch} to ${owner} while ${describeLease(holder)} was live throughout the call`,
            call,
            holder.call,
          );
        else if (holder)
          violation(
            'I4',
            `${row.key}: granted a new epoch ${lease.epoch} to ${owner}, whose ${describeLease(holder)} was live throughout the call`,
            call,
            holder.call,
          );
      }
    } else if (response.kind === 'statuses') {
      const { owner } = request as { owner: string };
      const keys = requestKeys(request);
      const epochs = 'epochs' in request ? request.epochs : [(request as { epoch: bigint }).epoch];
      if (response.rows.map((r) => r.key).join('\n') !== keys.join('\n'))
        violation('§4 batches', `the rows do not follow the order of the keys`, call);
      response.rows.forEach((row, i) => {
        const key = keys[i]!;
        const epoch = epochs[i]!;
        const what = `${request.op}(${key}, ${owner}, ${epoch}) = ${row.status}`;
        const mine = leasesOf(key)
          .filter((lease) => lease.owner === owner)
          .map((lease) => ({ lease, s: standing(lease, v) }))
          .filter(({ s }) => s.visible !== 'no');
        const holder = certainHolder(key, v);
        if (holder) {
          const expected =
            holder.owner !== owner ? 'not_owner' : holder.epoch === epoch ? 'ok' : 'epoch_mismatch';
          if (row.status !== expected)
            violation(
              row.status === 'ok' || expected === 'ok' ? 'I6' : 'I8',
              `${what}, but ${describeLease(holder)} was live throughout the call: expected ${expected}`,
              call,
              holder.call,
            );
        }
        if (row.status !== 'ok' && row.expiresAt !== null)
          violation('§4 renew', `${what} with an expiry`, call);
        switch (row.status) {
          case 'ok': {
            const granted = mine.filter(({ lease }) => lease.epoch === epoch).pop();
            if (!granted) {
              violation('I6', `${what}, but no such grant was visible to it`, call);
            } else if (granted.s.released === 'yes') {
              violation(
                'I6',
                `${what} after its release had committed`,
                call,
                ...granted.lease.releases,
              );
            } else if (max(granted.s.expiries) <= call.t0) {
              violation(
                'I6',
                `${what}, but the grant lapsed ${call.t0 - max(granted.s.expiries)} us before the call began`,
                call,
                granted.lease.call,
              );
            }
            if (request.op === 'renew' || request.op === 'renew_many')
              checkExpiry(call, row.expiresAt, request.ttlUs, what);
            break;
          }
          case 'epoch_mismatch':
            if (
              !mine.some(
                ({ lease, s }) =>
                  lease.epoch !== epoch && s.released !== 'yes' && max(s.expiries) > call.t0,
              )
            )
              violation(
                'I8',
                `${what}, but the caller held no other epoch of the key that can have been live`,
                call,
              );
            break;
          case 'lapsed':
            if (!mine.some(({ s }) => s.released !== 'yes' && min(s.expiries) <= call.t1))
              violation(
                'I8',
                `${what}, but no grant of the key to the caller can have lapsed by the end of the call`,
                call,
              );
            break;
          case 'not_owner':
            break;
          default:
            violation('§4 renew', `${what}: not a status`, call);
        }
      });
    } else if (response.kind === 'states') {
      const keys =
        request.op === 'list'
          ? request.keys.filter((key) => key.startsWith(request.prefix))
          : requestKeys(request);
      if (request.op === 'list') {
        const listed = response.rows.map((row) => row.key);
        const sorted = [...listed].sort((a, b) => (Buffer.from(a) < Buffer.from(b) ? -1 : 1));
        if (listed.join('\n') !== sorted.join('\n'))
          violation('§4 list', 'rows are not in key order', call);
        for (const key of new Set(listed.filter((key, i) => listed.indexOf(key) !== i)))
          violation('§4 list', `listed ${key} more than once`, call);
        for (const row of response.rows) {
          if (!keys.includes(row.key))
            violation('§4 list', `listed ${row.key}, which does not match the prefix`, call);
          if (request.heldOnly && !row.held)
            violation('§4 list', `held_only listed ${row.key}, which is not held`, call);
        }
      }
      for (const key of keys) {
        const row = response.rows.find((r) => r.key === key);
        const holder = certainHolder(key, v);
        if (row?.held) {
          const lease = leasesOf(key)
            .filter(
              (l) =>
                l.owner === row.owner && l.epoch === row.epoch && visibility(l.call, v) !== 'no',
            )
            .pop();
          if (!lease || row.expiresAt === null) {
            violation(
              'I1',
              `${request.op} reported ${key} held by ${row.owner} under epoch ${row.epoch}, a grant it could not see`,
              call,
            );
          } else {
            const s = standing(lease, v);
            if (s.released === 'yes')
              violation(
                'I7',
                `${request.op} reported ${key} held under epoch ${row.epoch} after its release had committed`,
                call,
                ...lease.releases,
              );
            if (!s.expiries.includes(row.expiresAt))
              violation(
                'I5',
                `${request.op} reported ${key} (epoch ${row.epoch}) with an expiry its grant never had in view`,
                call,
                lease.call,
                ...lease.renewals.map((r) => r.call),
              );
            if (row.expiresAt <= call.t0)
              violation(
                'I5',
                `${request.op} reported ${key} held although its expiry had passed before the call began`,
                call,
                lease.call,
              );
          }
          if (holder && holder !== lease)
            violation(
              'I1',
              `${request.op} reported ${key} held by ${row.owner} under epoch ${row.epoch}, but ${describeLease(holder)} was live throughout`,
              call,
              holder.call,
            );
        } else {
          if (row && (row.owner !== null || row.expiresAt !== null))
            violation('§4 inspect', `${key} not held, but reported with an owner or expiry`, call);
          if (holder)
            violation(
              'I5',
              `${request.op} reported ${key} ${row ? 'not held' : request.op === 'list' && request.heldOnly ? 'not held' : 'without a row'}, but ${describeLease(holder)} was live throughout`,
              call,
              holder.call,
            );
        }
        if (row)
          readItem(
            call,
            v,
            key,
            row.epoch,
            `${request.op} of ${key} (${row.held ? `held by ${row.owner}` : 'not held'}) reading epoch ${row.epoch}`,
          );
      }
    } else if (response.kind === 'fenced') {
      const { key, epoch } = request as { key: string; epoch: bigint };
      const lease = leasesOf(key)
        .filter((l) => l.epoch === epoch && visibility(l.call, v) !== 'no')
        .pop();
      if (!lease) {
        violation(
          'I12',
          `fence of ${key} under epoch ${epoch} passed, but no such grant was visible`,
          call,
        );
      } else {
        const s = standing(lease, v);
        if (s.released === 'yes')
          violation(
            'I12',
            `fence of ${key} under epoch ${epoch} passed after the grant's release had committed`,
            call,
            ...lease.releases,
          );
        else if (max(s.expiries) <= call.t0)
          violation(
            'I12',
            `fence of ${key} under epoch ${epoch} passed, but the grant lapsed before the fence began`,
            call,
            lease.call,
          );
      }
      readItem(call, v, key, epoch, `fence of ${key} under epoch ${epoch}`);
    }
  }

  // I3 without any timing: one key never has two committed grants of the same epoch.
  for (const [key, leases] of leasesByKey) {
    const byEpoch = new Map<bigint, Lease[]>();
    for (const lease of leases) {
      if (lease.call.txn.outcome !== 'committed') continue;
      byEpoch.set(lease.epoch, [...(byEpoch.get(lease.epoch) ?? []), lease]);
    }
    for (const [epoch, same] of byEpoch)
      if (same.length > 1)
        violation(
          'I3',
          `${key}: epoch ${epoch} was granted and committed ${same.length} times (to ${same.map((l) => l.owner).join(', ')})`,
          ...same.map((l) => l.call),
        );
  }

  // I2, I3, I6, I7: the epochs of committed writes and of reads, in every commit order the
  // intervals allow. A state certainly before another has an epoch of at most its maxBefore.
  for (const lease of allLeases) {
    const txn = lease.call.txn;
    if (txn.outcome !== 'committed') continue;
    items.push({
      key: lease.key,
      value: lease.epoch,
      maxBefore: lease.epoch - 1n,
      lo: txn.endLo,
      hi: txn.endHi,
      call: lease.call,
      what: `grant of epoch ${lease.epoch} to ${lease.owner}`,
      fresh: true,
    });
    for (const renewal of lease.renewals)
      if (renewal.call.txn.outcome === 'committed')
        items.push({
          key: lease.key,
          value: lease.epoch,
          maxBefore: lease.epoch,
          lo: renewal.call.txn.endLo,
          hi: renewal.call.txn.endHi,
          call: renewal.call,
          what: `renewal of epoch ${lease.epoch}`,
          fresh: false,
        });
    for (const release of lease.releases)
      if (release.txn.outcome === 'committed')
        items.push({
          key: lease.key,
          value: lease.epoch + 1n,
          maxBefore: lease.epoch,
          lo: release.txn.endLo,
          hi: release.txn.endHi,
          call: release,
          what: `release of epoch ${lease.epoch} (watermark ${lease.epoch + 1n})`,
          fresh: false,
        });
  }
  const itemsByKey = new Map<string, OrderItem[]>();
  for (const item of items) itemsByKey.set(item.key, [...(itemsByKey.get(item.key) ?? []), item]);
  for (const [key, list] of itemsByKey) {
    list.sort((a, b) => (a.hi < b.hi ? -1 : a.hi > b.hi ? 1 : 0));
    const best: OrderItem[] = [];
    for (const item of list) {
      const previous = best[best.length - 1];
      best.push(previous && previous.value >= item.value ? previous : item);
    }
    for (const later of list) {
      // The last item whose state was certainly before this one's.
      let lo = 0;
      let hi = list.length;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (list[mid]!.hi < later.lo) lo = mid + 1;
        else hi = mid;
      }
      if (lo === 0) continue;
      const earlier = best[lo - 1]!;
      if (earlier.value <= later.maxBefore) continue;
      const invariant = later.fresh
        ? 'I3'
        : RENEW_OPS.has(later.call.request.op)
          ? 'I6'
          : earlier.what.startsWith('release')
            ? 'I7'
            : 'I2';
      violation(
        invariant,
        `${key}: ${later.what} (#${later.call.id}), but before it ${earlier.what} (#${earlier.call.id}) ` +
          `had ${earlier.fresh || earlier.what.startsWith('re') ? 'committed' : 'been read'}, ` +
          `${later.lo - earlier.hi} us earlier at least`,
        earlier.call,
        later.call,
      );
    }
  }

  // I1: two owners' committed grants never overlap: in every commit order the intervals allow,
  // the earlier grant's holding (its expiry in force then, unless a release came first) must be
  // able to end before the later grant committed.
  const expiriesAtCommit = (lease: Lease, txn: Txn) => {
    let expiries = [lease.expiresAt];
    for (const renewal of lease.renewals) {
      const r = renewal.call.txn;
      if (r.outcome !== 'committed') continue;
      if (r.endHi < txn.endLo) expiries = [renewal.expiresAt];
      else if (r.endLo < txn.endHi) expiries.push(renewal.expiresAt);
    }
    return expiries;
  };
  const overlapCertain = (first: Lease, second: Lease) => {
    const txn = second.call.txn;
    if (first.releases.some((r) => r.txn.outcome === 'committed' && r.txn.endLo < txn.endHi))
      return false;
    return min(expiriesAtCommit(first, txn)) >= txn.endHi;
  };
  for (const leases of leasesByKey.values()) {
    const committed = leases.filter((lease) => lease.call.txn.outcome === 'committed');
    for (let i = 0; i < committed.length; i++)
      for (let j = i + 1; j < committed.length; j++) {
        const a = committed[i]!;
        const b = committed[j]!;
        if (a.owner === b.owner) continue;
        const orders: boolean[] = [];
        if (!(b.call.txn.endHi < a.call.txn.endLo)) orders.push(overlapCertain(a, b));
        if (!(a.call.txn.endHi < b.call.txn.endLo)) orders.push(overlapCertain(b, a));
        if (orders.length > 0 && orders.every(Boolean))
          violation(
            'I1',
            `${a.key}: ${describeLease(a)} and ${describeLease(b)} were both held at once`,
            a.call,
            b.call,
          );
      }
  }

  // I12: no later grant of a key commits before a committed fenced write under an earlier epoch.
  for (const call of calls) {
    if (!call.response || call.response.kind !== 'fenced') continue;
    const txn = call.txn;
    if (txn.outcome !== 'committed') continue;
    const { key, epoch } = call.request as { key: string; epoch: bigint };
    for (const later of leasesOf(key)) {
      const t = later.call.txn;
      if (later.epoch <= epoch || t === txn || t.outcome !== 'committed') continue;
      if (t.endHi < txn.endLo)
        violation(
          'I12',
          `${key}: a ${call.request.op} under epoch ${epoch} (#${call.id}) committed after ${describeLease(later)} had committed`,
          call,
          later.call,
        );
    }
  }

  // The fenced table holds exactly the committed writes (I9: a rolled-back write leaves no trace).
  if (history.fencedRows) {
    const expected = new Map<number, { key: string; epoch: bigint }>();
    for (const call of calls) {
      const r = call.request;
      if ((r.op === 'fenced_insert' || r.op === 'fenced_update') && call.response)
        if (call.txn.outcome === 'committed') expected.set(r.id, { key: r.key, epoch: r.epoch });
    }
    const show = (rows: Map<number, { key: string; epoch: bigint }>) =>
      [...rows]
        .sort(([a], [b]) => a - b)
        .map(([id, row]) => `${id}:${row.key}:${row.epoch}`)
        .join(' ');
    if (show(expected) !== show(history.fencedRows))
      violation(
        'I9',
        `the fenced table holds ${history.fencedRows.size} rows, the committed writes ${expected.size}`,
      );
  }

  return found;
}

/** The invariants a list of violations names, with counts: `I3 x2, I2 x5`. */
export function summarize(violations: Violation[]): string {
  const counts = new Map<string, number>();
  for (const v of violations) counts.set(v.invariant, (counts.get(v.invariant) ?? 0) + 1);
  return [...counts].map(([invariant, n]) => `${invariant} x${n}`).join(', ');
}

/** The number of operations a history needed to show a violation: the last call it involves. */
export function operationsToShow(violation: Violation): number {
  return Math.max(...violation.calls.map((call) => call.id)) + 1;
}

function shortKey(key: string, prefix: string): string {
  return key.startsWith(prefix) ? key.slice(prefix.length) : key;
}

/** One call on one line: number, session, transaction, server times, request and answer. */
export function describeCall(call: Call, base: bigint, prefix = ''): string {
  const ms = (t: bigint) =>
    `${t < base ? '-' : '+'}${(Math.abs(Number(t - base)) / 1000).toFixed(3)}`;
  const k = (key: string) => shortKey(key, prefix);
  const r = call.request;
  const d = (us: bigint) => `${Number(us) / 1000}ms`;
  let args: string;
  switch (r.op) {
    case 'acquire':
      args = `${k(r.key)}, ${r.owner}, ${d(r.ttlUs)}, wait ${d(r.waitUs)}`;
      break;
    case 'acquire_many':
      args = `[${r.keys.map(k).join(',')}], ${r.owner}, ${d(r.ttlUs)}`;
      break;
    case 'renew':
      args = `${k(r.key)}, ${r.owner}, ${r.epoch}, ${d(r.ttlUs)}`;
      break;
    case 'renew_many':
      args = `[${r.keys.map(k).join(',')}], ${r.owner}, [${r.epochs.join(',')}], ${d(r.ttlUs)}`;
      break;
    case 'release':
      args = `${k(r.key)}, ${r.owner}, ${r.epoch}`;
      break;
    case 'release_many':
      args = `[${r.keys.map(k).join(',')}], ${r.owner}, [${r.epochs.join(',')}]`;
      break;
    case 'fence':
    case 'fenced_insert':
    case 'fenced_update':
      args = `${k(r.key)}, ${r.epoch}${r.op === 'fence' ? '' : `, row ${r.id}`}`;
      break;
    case 'watch':
      args = `${k(r.key)}, ${d(r.waitUs)}`;
      break;
    case 'purge':
      args = `${d(r.olderThanUs)}, limit ${r.limit ?? 'NULL'}`;
      break;
    case 'inspect':
      args = k(r.key);
      break;
    case 'list':
      args = `'${k(r.prefix)}', held_only ${r.heldOnly}`;
      break;
  }
  let answer: string;
  const response = call.response;
  if (call.error) answer = `ERROR ${call.error.code} ${call.error.detail ?? call.error.message}`;
  else if (!response) answer = '?';
  else if (response.kind === 'grants')
    answer = response.rows
      .map(
        (g) =>
          `${k(g.key)} ${g.acquired ? `epoch ${g.epoch} until ${ms(g.expiresAt!)}` : 'denied'}`,
      )
      .join('; ');
  else if (response.kind === 'statuses')
    answer = response.rows
      .map(
        (s) => `${k(s.key)} ${s.status}${s.expiresAt === null ? '' : ` until ${ms(s.expiresAt)}`}`,
      )
      .join('; ');
  else if (response.kind === 'states')
    answer =
      response.rows
        .map((s) =>
          s.held
            ? `${k(s.key)} held by ${s.owner} epoch ${s.epoch} until ${ms(s.expiresAt!)}`
            : `${k(s.key)} not held, epoch ${s.epoch}`,
        )
        .join('; ') || 'no row';
  else if (response.kind === 'fenced') answer = 'passed';
  else answer = `${response.count} purged`;
  const txn = call.txn;
  const where =
    txn.isolation === 'autocommit'
      ? 'auto'
      : `T${txn.id} ${txn.isolation === 'repeatable read' ? 'RR' : 'RC'}`;
  const outcome = txn.outcome === 'committed' ? 'committed' : txn.outcome;
  return (
    `#${call.id} s${call.session} ${where} ${outcome} [${ms(call.t0)} .. ${ms(call.t1)}] ` +
    (STATEMENT_SNAPSHOT_OPS.has(r.op) && txn.isolation !== 'repeatable read'
      ? `(sent after ${ms(call.sent)}) `
      : '') +
    `${r.op}(${args}) -> ${answer}` +
    (txn.isolation === 'autocommit' || txn.outcome !== 'committed'
      ? ''
      : ` (commit in ${ms(txn.endLo)} .. ${ms(txn.endHi)})`)
  );
}

/**
 * A readable trace of the first violations: each one's message, then, in order of server time
 * (milliseconds from the history's first call), the calls it involves (marked `*`), the other
 * calls of their transactions, and the other calls on its key that ran between them (the last
 * ones before the violation, when there are many), purges that deleted something included.
 */
export function formatViolations(
  history: History,
  violations: Violation[],
  limit = 6,
  prefix = '',
): string {
  const base = history.calls.reduce((m, c) => (c.t0 < m ? c.t0 : m), history.calls[0]?.t0 ?? 0n);
  const first = [...violations].sort((a, b) => operationsToShow(a) - operationsToShow(b));
  const lines = [`${violations.length} violations (${summarize(violations)}); times in ms:`];
  for (const v of first.slice(0, limit)) {
    lines.push('', `${v.invariant}: ${v.message}`);
    const keys = history.keys.filter((key) =>
      new RegExp(`${key.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}(?![0-9])`).test(v.message),
    );
    const shown = new Set<Call>();
    for (const call of v.calls) {
      shown.add(call);
      if (call.txn.isolation !== 'autocommit') for (const c of call.txn.calls) shown.add(c);
    }
    const context: Call[] = [];
    if (v.calls.length > 0) {
      const from = v.calls.reduce((m, c) => (c.t0 < m ? c.t0 : m), v.calls[0]!.t0);
      const to = v.calls.reduce((m, c) => (c.t1 > m ? c.t1 : m), v.calls[0]!.t1);
      for (const c of history.calls) {
        if (shown.has(c) || c.t1 < from || c.t0 > to) continue;
        const r = c.request;
        const onKey =
          r.op === 'purge'
            ? c.response?.kind === 'purged' && c.response.count > 0
            : requestKeys(r).some((key) => keys.includes(key)) ||
              (r.op === 'list' && keys.some((key) => key.startsWith(r.prefix)));
        if (onKey) context.push(c);
      }
    }
    // The calls just before the last one involved are where a violation shows: keep those.
    const room = Math.max(0, 30 - shown.size);
    const omitted = Math.max(0, context.length - room);
    const kept = context.slice(omitted);
    const ordered = [...shown, ...kept].sort((a, b) =>
      a.t0 < b.t0 ? -1 : a.t0 > b.t0 ? 1 : a.id - b.id,
    );
    for (const c of ordered) {
      if (omitted > 0 && c === kept[0])
        lines.push(`    (${omitted} calls on the key in between left out)`);
      lines.push(`  ${v.calls.includes(c) ? '*' : ' '} ${describeCall(c, base, prefix)}`);
    }
  }
  if (violations.length > limit) lines.push('', `... and ${violations.length - limit} more`);
  return lines.join('\n');
}
