/**
 * The measuring phases: interleaved throughput/latency rounds, and the single-client,
 * fixed-count WAL phase (pg_stat_wal deltas, pg_walinspect record breakdown, HOT updates).
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type pg from 'pg';
import type { PgCluster } from 'pg-lease-testing';
import {
  archiveLogs,
  readLogs,
  runPgbench,
  withPositions,
  type Pgbench,
  type Target,
} from './pgbench.js';
import { BENCH_DATABASE, resetForRun, tablesOf, withClient } from './setup.js';
import { summarise, type LatencySummary } from './stats.js';
import {
  armDefines,
  armKeyPrefix,
  armScript,
  inOp,
  scriptTemplate,
  type Arm,
  type OpId,
  type Workload,
} from './workloads.js';

export interface BenchContext {
  cluster: PgCluster;
  pgbench: Pgbench;
  workloadsDir: string;
  resultsDir: string;
  log: (line: string) => void;
}

/** Counters of one table from pg_stat_user_tables. */
export interface TableCounters {
  ins: number;
  upd: number;
  hotUpd: number;
}

export interface OpResult extends LatencySummary {
  /** Operations per second (for split logs, the rate of this op alone). */
  rate: number;
}

/** One pgbench run of the throughput phase. */
export interface RunRecord {
  round: number;
  workload: Workload['id'];
  arm: string;
  clients: number;
  durationSeconds: number;
  interleave: Interleave;
  /** pgbench's TPS (`run`), or clients / mean latency (`transaction`). */
  tps: number;
  processed: number;
  /**
   * CPU time all server processes used per pgbench transaction (runs of a single arm only;
   * Linux). Waiting for a core does not count, so this stays meaningful on a busy machine:
   * in a CPU-bound run the TPS ratio of two arms tends to the inverse of this ratio.
   */
  serverCpuUsPerTransaction?: number;
  /** 1-minute load average just before the run: how busy the shared machine was. */
  loadAverage: number;
  startedAt: string;
  ops: Partial<Record<OpId, OpResult>>;
  /** W2: grants made during the run (sum of epoch increases on the shared keys). */
  grants?: number;
  /** W1: update counters of the table the arm wrote, over this run. */
  table?: TableCounters;
  /** Whether other arms of the same run wrote that table too (variants share lease.leases). */
  tableShared?: boolean;
  /** Archived (subsampled, gzipped) log, relative to the results folder. */
  logFile: string;
}

/** Linux clock ticks are 100 Hz on every mainstream kernel configuration (USER_HZ). */
const TICK_US = 10_000;

/**
 * CPU time, in clock ticks, of the server so far: the postmaster's own and reaped children's
 * (utime, stime, cutime, cstime in /proc/<pid>/stat) plus every live child's. Undefined off
 * Linux or while the server is down.
 */
export function serverCpuTicks(cluster: PgCluster): number | undefined {
  const postmaster = cluster.pid;
  if (postmaster === undefined) return undefined;
  try {
    const own = statFields(postmaster);
    // utime=14, stime=15, cutime=16, cstime=17 (1-based); own[0] is field 3.
    let ticks = Number(own[11]) + Number(own[12]) + Number(own[13]) + Number(own[14]);
    for (const entry of fs.readdirSync('/proc')) {
      if (!/^\d+$/.test(entry)) continue;
      try {
        const child = statFields(entry);
        if (Number(child[1]) === postmaster) ticks += Number(child[11]) + Number(child[12]);
      } catch {
        // exited while we looked
      }
    }
    return ticks;
  } catch {
    return undefined;
  }
}

/** CPU time, in clock ticks, of one live process (utime + stime); undefined once it is gone. */
export function processCpuTicks(pid: number): number | undefined {
  try {
    const own = statFields(pid);
    return Number(own[11]) + Number(own[12]);
  } catch {
    return undefined;
  }
}

/** The fields of /proc/<pid>/stat after the command name (which may contain spaces): field 3 first. */
function statFields(pid: number | string): string[] {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  return stat.slice(stat.lastIndexOf(')') + 2).split(' ');
}

/** Writes the arm's script for a workload into the results folder and returns its path. */
export function materialiseScript(context: BenchContext, workload: Workload, arm: Arm): string {
  const dir = path.join(context.resultsDir, 'scripts');
  fs.mkdirSync(dir, { recursive: true });
  const file = path.join(dir, `${workload.file}.${arm.id}.sql`);
  if (!fs.existsSync(file)) {
    const template = fs.readFileSync(
      scriptTemplate(context.workloadsDir, workload, arm.script),
      'utf8',
    );
    fs.writeFileSync(file, armScript(template, arm));
  }
  return file;
}

function target(context: BenchContext): Target {
  return {
    socketDir: context.cluster.socketDir,
    port: context.cluster.port,
    user: context.cluster.superuser,
    database: BENCH_DATABASE,
  };
}

/**
 * Waits until the pgbench sessions are gone and the cumulative statistics have stopped
 * moving: backends flush their counters on exit (PG15+) or through the stats collector,
 * which lags by up to half a second (PG14).
 */
export async function settle(
  cluster: PgCluster,
  read: (client: pg.Client) => Promise<unknown>,
): Promise<void> {
  await withClient(cluster, BENCH_DATABASE, async (client) => {
    for (let i = 0; i < 200; i++) {
      const { rows } = await client.query<{ n: string }>(
        `SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = 'pgbench'`,
      );
      if (Number(rows[0]!.n) === 0) break;
      await sleep(25);
    }
    let previous = JSON.stringify(await read(client));
    for (let i = 0; i < 20; i++) {
      await sleep(cluster.installation.major >= 15 ? 50 : 300);
      const current = JSON.stringify(await read(client));
      if (current === previous) return;
      previous = current;
    }
  });
}

export async function tableCounters(client: pg.Client, table: string): Promise<TableCounters> {
  const [schema, name] = table.split('.');
  const { rows } = await client.query<{ ins: string; upd: string; hot: string }>(
    `SELECT n_tup_ins AS ins, n_tup_upd AS upd, n_tup_hot_upd AS hot
     FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2`,
    [schema, name],
  );
  const row = rows[0];
  return row
    ? { ins: Number(row.ins), upd: Number(row.upd), hotUpd: Number(row.hot) }
    : { ins: 0, upd: 0, hotUpd: 0 };
}

function counterDelta(after: TableCounters, before: TableCounters): TableCounters {
  return {
    ins: after.ins - before.ins,
    upd: after.upd - before.upd,
    hotUpd: after.hotUpd - before.hotUpd,
  };
}

async function epochSum(client: pg.Client, table: string, prefix: string): Promise<number> {
  const { rows } = await client.query<{ s: string | null }>(
    `SELECT sum(epoch) AS s FROM ${table} WHERE key LIKE $1`,
    [prefix + '%'],
  );
  return Number(rows[0]!.s ?? 0);
}

/** How the arms of one (round, workload, clients) cell share the machine. */
export type Interleave = 'run' | 'transaction';

/**
 * One round of a workload at one client count, for all its arms.
 *
 * `run`: one pgbench run per arm, back to back, in the order given (the caller alternates it
 * between rounds). TPS is pgbench's.
 * `transaction`: one pgbench run with every arm's script, pgbench picking a script at random
 * for each transaction, so lease and baseline transactions alternate within milliseconds and
 * see the same machine. Latency per arm comes from the log's script number; TPS per arm is
 * the closed-loop equivalent clients / mean latency (exact at 1 client; at many clients the
 * shared queueing narrows the ratios, see README).
 */
export async function throughputRound(
  context: BenchContext,
  workload: Workload,
  arms: Arm[],
  clients: number,
  durationSeconds: number,
  round: number,
  interleave: Interleave,
): Promise<RunRecord[]> {
  if (interleave === 'run') {
    const records: RunRecord[] = [];
    for (const arm of arms)
      records.push(
        ...(await pgbenchRun(
          context,
          workload,
          [arm],
          clients,
          durationSeconds,
          round,
          interleave,
        )),
      );
    return records;
  }
  return pgbenchRun(context, workload, arms, clients, durationSeconds, round, interleave);
}

async function pgbenchRun(
  context: BenchContext,
  workload: Workload,
  arms: Arm[],
  clients: number,
  durationSeconds: number,
  round: number,
  interleave: Interleave,
): Promise<RunRecord[]> {
  const tables = tablesOf(arms);
  await resetForRun(context.cluster, tables, workload.keyPrefix);
  const countersOf = async (client: pg.Client) => {
    const result: Record<string, TableCounters> = {};
    for (const table of tables) result[table] = await tableCounters(client, table);
    return result;
  };
  const grantsOf = async (client: pg.Client) => {
    const result: Record<string, number> = {};
    for (const arm of arms)
      if (arm.table)
        result[arm.id] = await epochSum(client, arm.table, armKeyPrefix(workload, arm));
    return result;
  };
  const measureTable = workload.id === 'W1-cycle';
  const measureGrants = workload.id === 'W2-contend';
  const before = await withClient(context.cluster, BENCH_DATABASE, async (client) => ({
    counters: measureTable ? await countersOf(client) : {},
    grants: measureGrants ? await grantsOf(client) : {},
  }));

  const rawDir = path.join(context.resultsDir, 'raw');
  fs.mkdirSync(rawDir, { recursive: true });
  const name = `r${round}-${workload.file}-c${clients}-${arms.map((a) => a.id).join('+')}`;
  const tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-lease-bench-log-'));
  const startedAt = new Date().toISOString();
  const loadAverage = os.loadavg()[0]!;
  const cpuBefore = serverCpuTicks(context.cluster);
  const defines = Object.assign({}, ...arms.map((arm) => armDefines(workload, arm))) as Record<
    string,
    string | number
  >;
  const result = await runPgbench(context.pgbench, {
    target: target(context),
    scriptFile: arms.map((arm) => materialiseScript(context, workload, arm)),
    clients,
    durationSeconds,
    defines,
    logPrefix: path.join(tmpDir, name),
  });

  const rows = withPositions(readLogs(result.logFiles));
  const logFile = path.join('raw', `${name}.log.gz`);
  archiveLogs(result.logFiles, path.join(context.resultsDir, logFile));
  fs.rmSync(tmpDir, { recursive: true, force: true });
  fs.appendFileSync(
    path.join(context.resultsDir, 'pgbench-output.txt'),
    `### ${name} (${startedAt})\n${result.stdout.trim()}\n\n`,
  );

  // Backends are reaped (and their CPU added to the postmaster's children time) once they
  // are gone from pg_stat_activity.
  await settle(context.cluster, async () => null);
  await sleep(100);
  const cpuAfter = serverCpuTicks(context.cluster);
  const after = await (async () => {
    if (measureTable) await settle(context.cluster, countersOf);
    return withClient(context.cluster, BENCH_DATABASE, async (client) => ({
      counters: measureTable ? await countersOf(client) : {},
      grants: measureGrants ? await grantsOf(client) : {},
    }));
  })();

  return arms.map((arm, script) => {
    const mine = arms.length > 1 ? rows.filter((row) => row.script === script) : rows;
    const ops: Partial<Record<OpId, OpResult>> = {};
    for (const op of workload.ops) {
      const latencies = mine.filter((row) => inOp(op, row.position)).map((row) => row.latencyUs);
      ops[op.id] = { ...summarise(latencies), rate: latencies.length / durationSeconds };
    }
    const all = summarise(mine.map((row) => row.latencyUs));
    const record: RunRecord = {
      round,
      workload: workload.id,
      arm: arm.id,
      clients,
      durationSeconds,
      interleave,
      tps: arms.length > 1 ? (clients * 1e6) / all.meanUs : result.tps,
      processed: mine.length,
      loadAverage,
      // Only a run of one arm can be attributed; interleaved arms share the backends.
      ...(arms.length === 1 && cpuBefore !== undefined && cpuAfter !== undefined && mine.length
        ? { serverCpuUsPerTransaction: ((cpuAfter - cpuBefore) * TICK_US) / mine.length }
        : {}),
      startedAt,
      ops,
      logFile,
    };
    if (measureTable && arm.table) {
      record.table = counterDelta(after.counters[arm.table]!, before.counters[arm.table]!);
      record.tableShared = arms.filter((a) => a.table === arm.table).length > 1;
    }
    if (measureGrants && arm.table) record.grants = after.grants[arm.id]! - before.grants[arm.id]!;
    return record;
  });
}

/** WAL written by one fixed-count, single-client run. */
export interface WalRecord {
  workload: Workload['id'];
  arm: string;
  transactions: number;
  /** Database calls made (pgbench transactions x calls per transaction). */
  calls: number;
  /** pg_stat_wal deltas over the run (cluster-wide, so the bench runs nothing else meanwhile). */
  walRecords: number;
  walFpi: number;
  walBytes: number;
  perCall: { records: number; fpi: number; bytes: number };
  table?: TableCounters;
  /** Per-operation figures from pg_walinspect (PG15+), background records left out. */
  byOp?: Partial<
    Record<OpId, { records: number; opRecords: number; bytes: number; fpiBytes: number }>
  >;
  /** The most frequent per-transaction record sequences, e.g. `Heap/HOT_UPDATE + Transaction/COMMIT`. */
  signatures?: { signature: string; count: number }[];
}

interface WalStats {
  records: number;
  fpi: number;
  bytes: number;
}

async function walStats(client: pg.Client): Promise<WalStats> {
  const { rows } = await client.query<{ r: string; f: string; b: string }>(
    'SELECT wal_records AS r, wal_fpi AS f, wal_bytes AS b FROM pg_stat_wal',
  );
  return { records: Number(rows[0]!.r), fpi: Number(rows[0]!.f), bytes: Number(rows[0]!.b) };
}

interface WalInspectRow {
  resource_manager: string;
  record_type: string;
  record_length: number;
  fpi_length: number;
}

/** Records not caused by the benchmarked sessions. */
function isBackground(row: WalInspectRow): boolean {
  if (row.resource_manager === 'Standby') return true;
  return (
    row.resource_manager === 'XLOG' &&
    /^(CHECKPOINT|NEXTOID|SWITCH|BACKUP_END)/.test(row.record_type)
  );
}

/**
 * Records a call writes because of the page it touched rather than the change it made:
 * on-access pruning of dead versions, a full-page image for a hint bit (data checksums),
 * a new clog page. How often they come depends on how full the page is and where the
 * checkpoint fell, and the shipped functions share their table with the variants, so their
 * rows sit on other pages than the baseline's; per-call comparisons use the other records.
 */
function isPageMaintenance(row: WalInspectRow): boolean {
  return (
    (row.resource_manager === 'Heap2' && /^PRUNE/.test(row.record_type)) ||
    (row.resource_manager === 'XLOG' && /^FPI_FOR_HINT/.test(row.record_type)) ||
    (row.resource_manager === 'CLOG' && /^ZEROPAGE/.test(row.record_type))
  );
}

/** WAL per call: N transactions on one client, WAL diffed around them. */
export async function walRun(
  context: BenchContext,
  workload: Workload,
  arm: Arm,
  transactions: number,
): Promise<WalRecord> {
  const tables = tablesOf([arm]);
  await resetForRun(context.cluster, tables, workload.keyPrefix);
  const useWalInspect = context.cluster.installation.major >= 15;
  const snapshot = async (client: pg.Client) => ({
    wal: await walStats(client),
    table: tables[0] ? await tableCounters(client, tables[0]) : undefined,
  });
  const before = await withClient(context.cluster, BENCH_DATABASE, async (client) => ({
    ...(await snapshot(client)),
    lsn: (await client.query<{ lsn: string }>('SELECT pg_current_wal_insert_lsn() AS lsn')).rows[0]!
      .lsn,
  }));
  await runPgbench(context.pgbench, {
    target: target(context),
    scriptFile: materialiseScript(context, workload, arm),
    clients: 1,
    transactions,
    defines: armDefines(workload, arm),
  });
  await settle(context.cluster, snapshot);
  const callsPerTransaction =
    workload.ops.reduce((sum, op) => sum + op.calls, 0) / workload.ops.length;
  const calls = transactions * callsPerTransaction;
  return withClient(context.cluster, BENCH_DATABASE, async (client) => {
    const after = await snapshot(client);
    const record: WalRecord = {
      workload: workload.id,
      arm: arm.id,
      transactions,
      calls,
      walRecords: after.wal.records - before.wal.records,
      walFpi: after.wal.fpi - before.wal.fpi,
      walBytes: after.wal.bytes - before.wal.bytes,
      perCall: {
        records: (after.wal.records - before.wal.records) / calls,
        fpi: (after.wal.fpi - before.wal.fpi) / calls,
        bytes: (after.wal.bytes - before.wal.bytes) / calls,
      },
    };
    if (after.table && before.table) record.table = counterDelta(after.table, before.table);
    if (useWalInspect)
      Object.assign(record, await inspectWal(client, before.lsn, workload, transactions));
    return record;
  });
}

/**
 * Splits the WAL of a single-client run into transactions at each commit record and
 * attributes them: for alternating scripts, even transactions to the first op and odd ones
 * to the second, checked by count. Read-only calls write no commit record; their records,
 * if any, fall into the trailing group.
 */
async function inspectWal(
  client: pg.Client,
  fromLsn: string,
  workload: Workload,
  transactions: number,
): Promise<Pick<WalRecord, 'byOp' | 'signatures'>> {
  // Read up to the flush position: every benchmarked commit is flushed (synchronous_commit
  // on); a background record still in the WAL buffers is not ours anyway. Nothing written
  // (read-only workloads) means no record to read.
  const { rows: range } = await client.query<{ end: string; moved: boolean }>(
    'SELECT pg_current_wal_flush_lsn() AS end, pg_current_wal_flush_lsn() > $1::pg_lsn AS moved',
    [fromLsn],
  );
  let rows: WalInspectRow[] = [];
  if (range[0]!.moved) {
    ({ rows } = await client.query<WalInspectRow>(
      `SELECT resource_manager, record_type, record_length::int AS record_length,
              fpi_length::int AS fpi_length
       FROM pg_get_wal_records_info($1, $2) ORDER BY start_lsn`,
      [fromLsn, range[0]!.end],
    ));
  }
  const groups: WalInspectRow[][] = [];
  let current: WalInspectRow[] = [];
  for (const row of rows) {
    if (isBackground(row)) continue;
    current.push(row);
    if (row.resource_manager === 'Transaction' && /^(COMMIT|ABORT)/.test(row.record_type)) {
      groups.push(current);
      current = [];
    }
  }
  if (current.length) groups.push(current);

  const signatures = new Map<string, number>();
  for (const group of groups) {
    const signature = group.map((r) => `${r.resource_manager}/${r.record_type.trim()}`).join(' + ');
    signatures.set(signature, (signatures.get(signature) ?? 0) + 1);
  }
  const top = [...signatures.entries()]
    .sort((a, b) => b[1] - a[1])
    .slice(0, 6)
    .map(([signature, count]) => ({ signature, count }));

  const byOp: WalRecord['byOp'] = {};
  const total = (list: WalInspectRow[][]) => ({
    records: list.reduce((sum, g) => sum + g.length, 0),
    opRecords: list.reduce((sum, g) => sum + g.filter((r) => !isPageMaintenance(r)).length, 0),
    bytes: list.reduce((sum, g) => sum + g.reduce((s, r) => s + r.record_length, 0), 0),
    fpiBytes: list.reduce((sum, g) => sum + g.reduce((s, r) => s + r.fpi_length, 0), 0),
  });
  const perCall = (t: ReturnType<typeof total>, calls: number) => ({
    records: t.records / calls,
    opRecords: t.opRecords / calls,
    bytes: t.bytes / calls,
    fpiBytes: t.fpiBytes / calls,
  });
  const [first, second] = workload.ops;
  if (workload.ops.length === 2 && first && second) {
    // Alternating script: every transaction commits, so the groups are the transactions.
    if (groups.length === transactions) {
      byOp[first.id] = perCall(
        total(groups.filter((_, i) => i % 2 === 0)),
        Math.ceil(transactions / 2),
      );
      byOp[second.id] = perCall(
        total(groups.filter((_, i) => i % 2 === 1)),
        Math.floor(transactions / 2),
      );
    }
  } else if (first) {
    const calls = transactions * first.calls;
    // Single-op scripts: the first transaction of renew/inspect takes the lease; leave it out.
    const measured =
      first.positions === 'after-first' && groups.length > 1 ? groups.slice(1) : groups;
    const measuredCalls = first.positions === 'after-first' ? calls - 1 : calls;
    byOp[first.id] = perCall(total(measured), measuredCalls);
  }
  return { byOp, signatures: top };
}
