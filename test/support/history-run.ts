/**
 * The randomized history of every call of the SQL API (test/extension/history.test.ts says what
 * it does and what it proves), as a runner that any suite can point at a database: the sessions,
 * the random mix, the recording of server times, and the checks after every round against the
 * model (history-model.ts) and the table's rows. test/citus runs it through a Citus coordinator.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import type { TestDatabase } from './database.js';
import {
  STATEMENT_SNAPSHOT_OPS,
  checkHistory,
  generator,
  type Call,
  type History,
  type Isolation,
  type KeyState,
  type Request,
  type Response,
  type Txn,
  type Violation,
} from './history-model.js';
import { micros } from './lease-calls.js';
import { createRole, type TestRole } from './roles.js';

const SESSIONS = 5;
const KEYS = 4;
export const PREFIX = 'h:';
const FAKE_OWNER = 'nobody';
/** Operations of the run against the current extension. */
export const OPERATIONS = 4_000;
/** The most operations the run against 0.2.0 may take to show its defect. */
export const DETECTION_BUDGET = 6_000;
/** Operations between two checks of the history (the sessions pause at each check). */
const ROUND = 500;

/** How often each kind of step is drawn, outside and inside explicit transactions. */
const MIX: Record<string, [autocommit: number, inTransaction: number]> = {
  acquire: [12, 8],
  acquireWait: [3, 2],
  acquireMany: [12, 12],
  renew: [8, 6],
  renewMany: [4, 3],
  release: [7, 5],
  releaseMany: [4, 3],
  fence: [0, 8],
  fencedWrite: [4, 4],
  watch: [3, 0],
  purge: [6, 9],
  inspect: [6, 5],
  list: [4, 3],
};
const P_TRANSACTION = 0.4;
const P_REPEATABLE_READ = 0.4;
/** Chance that a transaction sits (on its locks, or its snapshot) at one of its steps. */
const P_SIT = 0.5;
const P_COMMIT = 0.8;
/** Chance that a fenced write in a transaction stalls until its grant has lapsed, if it is near. */
const P_STALL = 0.4;
/** Chance that a transaction whose purge deleted rows sits before its next step. */
const P_PURGE_SITS = 0.6;
const TTLS_MS = [20, 40, 80, 150, 300, 600, 1000];

const T0 = `${micros('statement_timestamp()')} AS t0`;
const T1 = `${micros('clock_timestamp()')} AS t1`;
const US = `* interval '1 microsecond'`;

interface Held {
  key: string;
  owner: string;
  epoch: bigint;
  expiresAt: bigint;
}

interface Run {
  calls: Call[];
  txns: Txn[];
  keys: string[];
  /** Operations left in the current round. */
  budget: number;
  nextRow: number;
  /** HistoryOptions.repeatableRead and .list. */
  repeatableRead: boolean;
  list: boolean;
}

type Row = Record<string, unknown>;

const big = (value: unknown) =>
  value === null || value === undefined ? null : BigInt(value as string);

function states(rows: Row[]): KeyState[] {
  return rows
    .filter((row) => row.held !== null && row.held !== undefined)
    .map((row) => ({
      key: row.key as string,
      held: row.held as boolean,
      owner: row.owner as string | null,
      epoch: BigInt(row.epoch as string),
      expiresAt: big(row.x),
    }));
}

/** The statement of a request, and how to read its answer. */
export function statement(request: Request): {
  text: string;
  values: unknown[];
  parse(rows: Row[]): Response;
} {
  const grants = (rows: Row[], keys: string[]): Response => ({
    kind: 'grants',
    rows: rows.map((row, i) => ({
      key: (row.key as string | undefined) ?? keys[i]!,
      acquired: row.acquired as boolean,
      epoch: big(row.epoch),
      expiresAt: big(row.x),
    })),
  });
  const statuses = (rows: Row[], keys: string[]): Response => ({
    kind: 'statuses',
    rows: rows.map((row, i) => ({
      key: (row.key as string | undefined) ?? keys[i]!,
      status: row.status as string,
      expiresAt: big(row.x),
    })),
  });
  const view = (fn: string) =>
    `SELECT ${T0}, s.held, s.owner, s.epoch::text AS epoch, ${micros('s.expires_at')} AS x, ${T1}
       FROM (VALUES (1)) AS one (n) LEFT JOIN LATERAL ${fn} AS s ON true`;
  switch (request.op) {
    case 'acquire':
      return {
        text: `SELECT a.acquired, a.epoch::text AS epoch, ${micros('a.expires_at')} AS x, ${T0}, ${T1}
                 FROM lease.acquire($1::text, $2::text, $3::bigint ${US}, $4::bigint ${US}) AS a`,
        values: [request.key, request.owner, request.ttlUs, request.waitUs],
        parse: (rows) => grants(rows, [request.key]),
      };
    case 'acquire_many':
      return {
        text: `SELECT m.key, m.acquired, m.epoch::text AS epoch, ${micros('m.expires_at')} AS x, ${T0}, ${T1}
                 FROM lease.acquire_many($1::text[], $2::text, $3::bigint ${US}) AS m`,
        values: [request.keys, request.owner, request.ttlUs],
        parse: (rows) => grants(rows, request.keys),
      };
    case 'renew':
      return {
        text: `SELECT r.status, ${micros('r.expires_at')} AS x, ${T0}, ${T1}
                 FROM lease.renew($1::text, $2::text, $3::bigint, $4::bigint ${US}) AS r`,
        values: [request.key, request.owner, request.epoch, request.ttlUs],
        parse: (rows) => statuses(rows, [request.key]),
      };
    case 'renew_many':
      return {
        text: `SELECT r.key, r.status, ${micros('r.expires_at')} AS x, ${T0}, ${T1}
                 FROM lease.renew_many($1::text[], $2::text, $3::bigint[], $4::bigint ${US}) AS r`,
        values: [request.keys, request.owner, request.epochs, request.ttlUs],
        parse: (rows) => statuses(rows, request.keys),
      };
    case 'release':
      return {
        text: `SELECT r.status, ${T0}, ${T1} FROM lease.release($1::text, $2::text, $3::bigint) AS r`,
        values: [request.key, request.owner, request.epoch],
        parse: (rows) => statuses(rows, [request.key]),
      };
    case 'release_many':
      return {
        text: `SELECT r.key, r.status, ${T0}, ${T1}
                 FROM lease.release_many($1::text[], $2::text, $3::bigint[]) AS r`,
        values: [request.keys, request.owner, request.epochs],
        parse: (rows) => statuses(rows, request.keys),
      };
    case 'fence':
      return {
        text: `SELECT ${T0}, ${T1} FROM lease.fence($1::text, $2::bigint) AS f`,
        values: [request.key, request.epoch],
        parse: () => ({ kind: 'fenced' }),
      };
    case 'fenced_insert':
      return {
        text: `INSERT INTO hist.fenced (id, lease_key, lease_epoch, note) VALUES ($1, $2, $3, 'insert')
               RETURNING ${T0}, ${T1}`,
        values: [request.id, request.key, request.epoch],
        parse: () => ({ kind: 'fenced' }),
      };
    case 'fenced_update':
      return {
        text: `UPDATE hist.fenced SET lease_epoch = $3, note = 'update' WHERE id = $1 AND lease_key = $2
               RETURNING ${T0}, ${T1}`,
        values: [request.id, request.key, request.epoch],
        parse: (rows) => {
          if (rows.length !== 1)
            throw new Error(`history runner: fenced row ${request.id} missing`);
          return { kind: 'fenced' };
        },
      };
    case 'watch':
      return {
        text: view(`lease.watch($1::text, $2::bigint ${US})`),
        values: [request.key, request.waitUs],
        parse: (rows) => ({
          kind: 'states',
          rows: states(rows.map((r) => ({ ...r, key: request.key }))),
        }),
      };
    case 'inspect':
      return {
        text: view('lease.inspect($1::text)'),
        values: [request.key],
        parse: (rows) => ({
          kind: 'states',
          rows: states(rows.map((r) => ({ ...r, key: request.key }))),
        }),
      };
    case 'list':
      return {
        text: `SELECT ${T0}, coalesce(json_agg(json_build_object(
                        'key', l.key, 'held', l.held, 'owner', l.owner, 'epoch', l.epoch::text,
                        'x', ${micros('l.expires_at')}) ORDER BY l.n), '[]') AS rows, ${T1}
                 FROM lease.list($1::text, $2::boolean) WITH ORDINALITY
                      AS l (key, held, owner, epoch, expires_at, n)`,
        values: [request.prefix, request.heldOnly],
        parse: (rows) => ({ kind: 'states', rows: states(rows[0]!.rows as Row[]) }),
      };
    case 'purge':
      return {
        text: `SELECT p.n::text AS n, ${T0}, ${T1} FROM lease.purge($1::bigint ${US}, $2::bigint) AS p (n)`,
        values: [request.olderThanUs, request.limit],
        parse: (rows) => ({ kind: 'purged', count: Number(rows[0]!.n) }),
      };
  }
}

/** One session: its connection, its view of what it holds, and its random choices. */
class Worker {
  holdings = new Map<string, Held>();
  past: Held[] = [];
  /** Rows of the fenced table this session committed, by id: their key. */
  rows = new Map<number, string>();
  #gen = 0;
  #index = 0;
  #lastT1 = 0n;
  #waiting: ((t0: bigint) => void)[] = [];

  constructor(
    readonly id: number,
    readonly client: pg.Client,
    readonly run: Run,
    readonly random: () => number,
  ) {}

  get owner(): string {
    return `s${this.id}.${this.#gen}`;
  }

  pick<T>(items: readonly T[]): T {
    return items[Math.floor(this.random() * items.length)]!;
  }

  /** A clock reading of this session: the bound every earlier end was waiting for. */
  #clock(t0: bigint, t1: bigint): void {
    for (const resolve of this.#waiting.splice(0)) resolve(t0);
    this.#lastT1 = t1;
  }

  async marker(): Promise<{ t0: bigint; t1: bigint }> {
    const { rows } = await this.client.query<{ t0: string; t1: string }>(`SELECT ${T0}, ${T1}`);
    const t0 = BigInt(rows[0]!.t0);
    const t1 = BigInt(rows[0]!.t1);
    this.#clock(t0, t1);
    return { t0, t1 };
  }

  newTxn(isolation: Isolation): Txn {
    const txn: Txn = {
      id: this.run.txns.length + 1,
      session: this.id,
      isolation,
      outcome: 'open',
      endLo: 0n,
      endHi: 0n,
      calls: [],
    };
    this.run.txns.push(txn);
    return txn;
  }

  /** The end of a transaction: its commit lies before this session's next clock reading. */
  #ended(txn: Txn, outcome: 'committed' | 'rolled back', endLo: bigint): void {
    txn.outcome = outcome;
    txn.endLo = endLo;
    this.#waiting.push((t0) => {
      txn.endHi = t0;
    });
  }

  async call(txn: Txn, request: Request): Promise<Call> {
    // The snapshot of a list or inspect may be older than its statement_timestamp(), by the
    // time between its Bind and its Execute; the model bounds it by the reading before it.
    if (STATEMENT_SNAPSHOT_OPS.has(request.op) && txn.isolation !== 'repeatable read')
      await this.marker();
    const call: Call = {
      id: this.run.calls.length,
      session: this.id,
      index: this.#index++,
      txn,
      request,
      t0: 0n,
      t1: 0n,
      sent: this.#lastT1,
    };
    this.run.calls.push(call);
    txn.calls.push(call);
    this.run.budget--;
    const { text, values, parse } = statement(request);
    try {
      const { rows } = await this.client.query<Row>(text, values);
      const t0 = BigInt(rows[0]!.t0 as string);
      const t1 = rows.reduce(
        (m, row) => {
          const t = BigInt(row.t1 as string);
          return t < m ? t : m;
        },
        BigInt(rows[0]!.t1 as string),
      );
      call.t0 = t0;
      call.t1 = t1;
      call.response = parse(rows);
      this.#clock(t0, t1);
    } catch (error) {
      if (!(error instanceof pg.DatabaseError)) throw error;
      call.error = { code: error.code ?? '?', message: error.message, detail: error.detail };
      call.t0 = this.#lastT1;
      this.#waiting.push((t0) => {
        call.t1 = t0;
      });
    }
    this.#observe(call);
    return call;
  }

  /** Keeps the session's own idea of what it holds, for choosing its next calls. */
  #observe(call: Call): void {
    const response = call.response;
    const r = call.request;
    const drop = (key: string, owner: string, epoch: bigint) => {
      const held = this.holdings.get(key);
      if (held && held.owner === owner && held.epoch === epoch) {
        this.holdings.delete(key);
        this.past = [held, ...this.past].slice(0, 8);
      }
    };
    if (call.error) {
      if (call.error.code === 'PLF01' && 'epoch' in r && 'key' in r) {
        const held = this.holdings.get(r.key);
        if (held?.epoch === r.epoch) drop(r.key, held.owner, held.epoch);
      }
      return;
    }
    if (response?.kind === 'grants') {
      for (const row of response.rows)
        if (row.acquired) {
          const previous = this.holdings.get(row.key);
          if (previous && previous.epoch !== row.epoch)
            this.past = [previous, ...this.past].slice(0, 8);
          this.holdings.set(row.key, {
            key: row.key,
            owner: (r as { owner: string }).owner,
            epoch: row.epoch!,
            expiresAt: row.expiresAt!,
          });
        }
    } else if (response?.kind === 'statuses') {
      const owner = (r as { owner: string }).owner;
      const epochs = 'epochs' in r ? r.epochs : [(r as { epoch: bigint }).epoch];
      response.rows.forEach((row, i) => {
        const held = this.holdings.get(row.key);
        if (!held || held.owner !== owner || held.epoch !== epochs[i]) return;
        if (row.status === 'ok' && r.op.startsWith('renew')) held.expiresAt = row.expiresAt!;
        else drop(row.key, owner, held.epoch);
      });
    }
  }

  /** What to lease next: a held lease mostly, sometimes a stale one or a wrong claim. */
  #claim(): { key: string; owner: string; epoch: bigint } {
    const held = [...this.holdings.values()];
    const roll = this.random();
    if (held.length > 0 && roll < 0.75) {
      const lease = this.pick(held);
      const twist = this.random();
      if (twist < 0.1) return { ...lease, epoch: lease.epoch + 1n };
      if (twist < 0.15 && lease.epoch > 1n) return { ...lease, epoch: lease.epoch - 1n };
      if (twist < 0.25) return { ...lease, owner: FAKE_OWNER };
      return lease;
    }
    if (this.past.length > 0 && roll < 0.92) return this.pick(this.past);
    return {
      key: this.pick(this.run.keys),
      owner: this.random() < 0.5 ? FAKE_OWNER : this.owner,
      epoch: BigInt(1 + Math.floor(this.random() * 20)),
    };
  }

  /** Several claims of one owner, distinct keys, in random order. */
  #claims(): { keys: string[]; owner: string; epochs: bigint[] } {
    const first = this.#claim();
    const sameOwner = [...this.holdings.values()].filter(
      (h) => h.owner === first.owner && h.key !== first.key,
    );
    const claims = [first, ...sameOwner.filter(() => this.random() < 0.6)];
    if (this.random() < 0.3) {
      const other = this.run.keys.filter((key) => !claims.some((c) => c.key === key));
      if (other.length > 0)
        claims.push({ key: this.pick(other), owner: first.owner, epoch: first.epoch });
    }
    claims.sort(() => this.random() - 0.5);
    return {
      keys: claims.map((c) => c.key),
      owner: first.owner,
      epochs: claims.map((c) => c.epoch),
    };
  }

  #ttl(): bigint {
    return BigInt(this.pick(TTLS_MS) * 1000);
  }

  /** The next step: one request, or a fence followed by the write it guards. */
  #choose(inTransaction: boolean): Request[] {
    const column = inTransaction ? 1 : 0;
    const entries = Object.entries(MIX).filter(
      ([name, w]) => w[column] > 0 && (name !== 'list' || this.run.list),
    );
    let roll = this.random() * entries.reduce((sum, [, w]) => sum + w[column], 0);
    let kind = entries[0]![0];
    for (const [name, w] of entries) {
      roll -= w[column];
      if (roll < 0) {
        kind = name;
        break;
      }
    }
    const key = this.pick(this.run.keys);
    switch (kind) {
      case 'acquire':
      case 'acquireWait':
        return [
          {
            op: 'acquire',
            key,
            owner: this.owner,
            ttlUs: this.#ttl(),
            waitUs: kind === 'acquire' ? 0n : BigInt(this.pick([20, 50, 100]) * 1000),
          },
        ];
      case 'acquireMany': {
        const keys = this.run.keys.filter(() => this.random() < 0.6);
        if (keys.length === 0) keys.push(key);
        keys.sort(() => this.random() - 0.5);
        return [{ op: 'acquire_many', keys, owner: this.owner, ttlUs: this.#ttl() }];
      }
      case 'renew': {
        const c = this.#claim();
        return [{ op: 'renew', key: c.key, owner: c.owner, epoch: c.epoch, ttlUs: this.#ttl() }];
      }
      case 'renewMany':
        return [{ op: 'renew_many', ...this.#claims(), ttlUs: this.#ttl() }];
      case 'release': {
        const c = this.#claim();
        return [{ op: 'release', key: c.key, owner: c.owner, epoch: c.epoch }];
      }
      case 'releaseMany':
        return [{ op: 'release_many', ...this.#claims() }];
      case 'fence':
      case 'fencedWrite': {
        const c = this.#claim();
        const ownRows = [...this.rows].filter(([, k]) => k === c.key);
        const write: Request =
          ownRows.length > 0 && this.random() < 0.4
            ? { op: 'fenced_update', key: c.key, epoch: c.epoch, id: this.pick(ownRows)[0] }
            : { op: 'fenced_insert', key: c.key, epoch: c.epoch, id: this.run.nextRow++ };
        return kind === 'fence' ? [{ op: 'fence', key: c.key, epoch: c.epoch }, write] : [write];
      }
      case 'watch':
        return [{ op: 'watch', key, waitUs: BigInt(this.pick([50, 200, 500]) * 1000) }];
      case 'purge':
        return [
          {
            op: 'purge',
            olderThanUs: this.random() < 0.7 ? 0n : BigInt(this.pick([5, 20, 50]) * 1000),
            limit: this.random() < 0.4 ? null : 1 + Math.floor(this.random() * 3),
          },
        ];
      case 'inspect':
        return [{ op: 'inspect', key }];
      default:
        return [
          {
            op: 'list',
            prefix: this.pick(['', PREFIX, key]),
            heldOnly: this.random() < 0.5,
            keys: this.run.keys,
          },
        ];
    }
  }

  async #autocommit(): Promise<void> {
    for (const request of this.#choose(false)) {
      const txn = this.newTxn('autocommit');
      const call = await this.call(txn, request);
      this.#ended(txn, call.error ? 'rolled back' : 'committed', call.error ? call.t0 : call.t1);
      if (!call.error && (request.op === 'fenced_insert' || request.op === 'fenced_update'))
        this.rows.set(request.id, request.key);
    }
  }

  async #transaction(): Promise<void> {
    const isolation: Isolation =
      this.random() < P_REPEATABLE_READ && this.run.repeatableRead
        ? 'repeatable read'
        : 'read committed';
    const txn = this.newTxn(isolation);
    const saved = {
      holdings: new Map([...this.holdings].map(([k, h]) => [k, { ...h }])),
      past: this.past,
    };
    const steps = 1 + Math.floor(this.random() * 3);
    const sitAt = this.random() < P_SIT ? Math.floor(this.random() * (steps + 1)) : -1;
    const sit = () => sleep(this.pick([5, 20, 50, 100]));
    await this.client.query(
      isolation === 'repeatable read' ? 'BEGIN ISOLATION LEVEL REPEATABLE READ' : 'BEGIN',
    );
    if (isolation === 'repeatable read') {
      const { t0, t1 } = await this.marker();
      txn.snapLo = t0;
      txn.snapHi = t1;
    }
    let failed = false;
    for (let step = 0; step < steps && !failed; step++) {
      if (step === sitAt) await sit();
      for (const request of this.#choose(true)) {
        const call = await this.call(txn, request);
        failed = !!call.error;
        if (failed) break;
        if (request.op === 'fenced_insert' || request.op === 'fenced_update')
          await this.#stallPastExpiry(request.key, request.epoch);
        // A purge that deleted rows often keeps its transaction open for a while: acquires of
        // those keys then race its commit.
        if (
          call.response?.kind === 'purged' &&
          call.response.count > 0 &&
          this.random() < P_PURGE_SITS
        )
          await sit();
      }
    }
    if (!failed && sitAt === steps) {
      await sit();
      await this.marker();
    }
    const commit = !failed && this.random() < P_COMMIT;
    const endLo = this.#lastT1;
    let committed = false;
    try {
      await this.client.query(commit ? 'COMMIT' : 'ROLLBACK');
      committed = commit;
    } catch (error) {
      if (!(error instanceof pg.DatabaseError)) throw error;
      await this.client.query('ROLLBACK');
    }
    this.#ended(txn, committed ? 'committed' : 'rolled back', endLo);
    if (committed) {
      for (const call of txn.calls) {
        const r = call.request;
        if (r.op === 'fenced_insert' || r.op === 'fenced_update') this.rows.set(r.id, r.key);
      }
    } else {
      this.holdings = saved.holdings;
      this.past = saved.past;
    }
  }

  /**
   * Sometimes a fenced transaction stalls, holding its fence, until just past the expiry of the
   * grant it wrote under (when that is near): others may then try to take the key over, which
   * must wait for this transaction to end (I12).
   */
  async #stallPastExpiry(key: string, epoch: bigint): Promise<void> {
    const held = this.holdings.get(key);
    if (!held || held.epoch !== epoch || this.random() >= P_STALL) return;
    const leftMs = Number(held.expiresAt - this.#lastT1) / 1000;
    if (leftMs > 120) return;
    await sleep(Math.max(0, leftMs) + 5 + this.random() * 25);
    await this.marker();
  }

  /** Runs steps until the round's budget is spent. */
  async loop(): Promise<void> {
    while (this.run.budget > 0) {
      if (this.random() < 0.03) this.#gen++;
      if (this.random() < P_TRANSACTION) await this.#transaction();
      else await this.#autocommit();
      if (this.random() < 0.3) await sleep(Math.floor(this.random() * 5));
    }
  }
}

interface Outcome {
  history: History;
  violations: Violation[];
  /** Operations issued in all. */
  operations: number;
}

/**
 * §2's rule across columns, read from the table itself (as a superuser, through `pool`): a row is
 * held or lapsed with owner and expiry both set, or free with both NULL. No constraint of the
 * table holds it; the write core does.
 */
export async function checkRowShapes(pool: pg.Pool): Promise<void> {
  const { rows } = await pool.query<{
    key: string;
    owner: string | null;
    expires_at: string | null;
  }>(
    `SELECT key, owner, expires_at::text FROM lease.leases WHERE (owner IS NULL) <> (expires_at IS NULL)`,
  );
  assert.deepEqual(rows, [], 'rows of lease.leases with only one of owner and expires_at set');
}

/** What a history run may do and what it checks besides the model. */
export interface HistoryOptions {
  /** Stop once the violations found so far suffice. */
  enough?: (violations: Violation[]) => boolean;
  /** A superuser pool: after every round, every row of lease.leases is checked (checkRowShapes). */
  rowsOf?: pg.Pool;
  /**
   * Transactions may run under REPEATABLE READ (default true). The model takes a REPEATABLE
   * READ transaction's snapshot as one instant at its first statement, as one server does; on
   * Citus each node takes its own when the transaction first reaches it.
   */
  repeatableRead?: boolean;
  /**
   * The mix includes list (default true). The model reads list as one snapshot of every key; on
   * Citus it is one per shard.
   */
  list?: boolean;
}

/**
 * Runs the random mix on `url` in rounds of ROUND operations until `operations` have been
 * issued or `options.enough` says the violations found so far suffice; checks after every round.
 */
export async function runHistory(
  url: string,
  seed: number,
  operations: number,
  options: HistoryOptions = {},
): Promise<Outcome> {
  const { enough = () => false, rowsOf } = options;
  const random = generator(seed);
  const run: Run = {
    calls: [],
    txns: [],
    keys: Array.from({ length: KEYS }, (_, i) => `${PREFIX}k${i}`),
    budget: 0,
    nextRow: 1,
    repeatableRead: options.repeatableRead ?? true,
    list: options.list ?? true,
  };
  const workers: Worker[] = [];
  try {
    for (let i = 1; i <= SESSIONS; i++) {
      const client = new pg.Client({ connectionString: url, application_name: `history:s${i}` });
      client.on('error', () => undefined);
      await client.connect();
      // A safety net far above any wait the mix makes; hitting it is reported as an error.
      await client.query(`SET statement_timeout = '20s'`);
      workers.push(new Worker(i, client, run, generator(Math.floor(random() * 2 ** 31))));
    }
    await Promise.all(workers.map((w) => w.marker()));
    let violations: Violation[] = [];
    let history: History = { calls: run.calls, txns: run.txns, keys: run.keys };
    while (run.calls.length < operations) {
      run.budget = Math.min(ROUND, operations - run.calls.length);
      await Promise.all(workers.map((w) => w.loop()));
      // Every end and every failed call gets its upper bound from the session's next reading.
      await Promise.all(workers.map((w) => w.marker()));
      const { rows } = await workers[0]!.client.query<{
        id: number;
        lease_key: string;
        lease_epoch: string;
      }>('SELECT id, lease_key, lease_epoch::text FROM hist.fenced');
      history = {
        calls: run.calls,
        txns: run.txns,
        keys: run.keys,
        fencedRows: new Map(
          rows.map((r) => [r.id, { key: r.lease_key, epoch: BigInt(r.lease_epoch) }]),
        ),
      };
      violations = checkHistory(history);
      if (rowsOf) await checkRowShapes(rowsOf);
      if (enough(violations)) break;
    }
    return { history, violations, operations: run.calls.length };
  } finally {
    await Promise.all(workers.map((w) => w.client.end().catch(() => undefined)));
  }
}

/**
 * A role that installs pg_lease itself (a trusted extension: CREATE on the database suffices),
 * so that it owns the extension and may call lease.purge (80-list-purge.sql: PUBLIC may not;
 * the extension's owner may), and owns the fenced table.
 */
export async function prepare(
  db: TestDatabase,
  version?: string,
): Promise<{ role: TestRole; url: string; version: string }> {
  const role = await createRole(db, 'GRANT CREATE ON DATABASE %D TO %I');
  const database = pg.escapeIdentifier(decodeURIComponent(new URL(db.url).pathname.slice(1)));
  // Deadlocks between transactions that fence one key and take another are possible and
  // legitimate; have them detected quickly.
  await db.pool.query(`ALTER DATABASE ${database} SET deadlock_timeout = '50ms'`);
  const client = await role.connect();
  await client.query(
    version
      ? `CREATE EXTENSION pg_lease VERSION ${pg.escapeLiteral(version)}`
      : 'CREATE EXTENSION pg_lease',
  );
  await createFencedTable(client);
  const { rows } = await client.query<{ extversion: string }>(
    `SELECT extversion FROM pg_extension WHERE extname = 'pg_lease'`,
  );
  return { role, url: db.urlAs(role.name), version: rows[0]!.extversion };
}

/** The business table the history writes through lease.fence_row, which runHistory reads. */
export async function createFencedTable(client: pg.ClientBase): Promise<void> {
  await client.query('CREATE SCHEMA hist');
  await client.query(
    'CREATE TABLE hist.fenced (id int PRIMARY KEY, lease_key text NOT NULL, lease_epoch bigint NOT NULL, note text)',
  );
  await client.query(
    `CREATE TRIGGER fenced_fence BEFORE INSERT OR UPDATE ON hist.fenced
       FOR EACH ROW EXECUTE FUNCTION lease.fence_row('lease_key', 'lease_epoch')`,
  );
}

export function seedFor(): number {
  const fixed = process.env.PG_LEASE_HISTORY_SEED;
  return fixed ? Number(fixed) : randomBytes(4).readUInt32BE() >>> 1;
}

/** What the history exercised, so that a pass means something. */
export function coverage(history: History): Record<string, number> {
  const count: Record<string, number> = {};
  const add = (what: string) => (count[what] = (count[what] ?? 0) + 1);
  for (const call of history.calls) {
    add(call.request.op);
    if (call.error) add(`error ${call.error.code}`);
    const response = call.response;
    if (response?.kind === 'grants')
      for (const row of response.rows) add(row.acquired ? 'acquired' : 'denied');
    if (response?.kind === 'statuses') for (const row of response.rows) add(`status ${row.status}`);
    if (response?.kind === 'purged' && response.count > 0 && call.txn.outcome === 'committed')
      add('purged rows');
  }
  for (const txn of history.txns)
    if (txn.isolation !== 'autocommit') add(`${txn.isolation} ${txn.outcome}`);
  return count;
}
