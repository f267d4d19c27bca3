/**
 * Turning run records into the summary: medians over rounds, lease/baseline ratios paired
 * within each round, target verdicts, markdown, JSON and charts.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { Environment } from './environment.js';
import type { Interleave, RunRecord, WalRecord } from './measure.js';
import type { ProfileResult } from './profile.js';
import { median, round } from './stats.js';
import { barChart } from './svg.js';
import { TARGETS, WORKLOADS, type Arm, type OpId, type Target } from './workloads.js';

export interface Cell {
  workload: string;
  op: OpId;
  arm: string;
  clients: number;
  rounds: number;
  /** Run TPS (pgbench transactions/s), median over rounds. */
  tps: number;
  /** Rate of this op alone (ops/s). */
  rate: number;
  p50Us: number;
  p95Us: number;
  p99Us: number;
  meanUs: number;
  samples: number;
  /** Server CPU per pgbench transaction (runs of one arm only), median over rounds. */
  serverCpuUs?: number;
}

export interface Ratio {
  workload: string;
  op: OpId;
  arm: string;
  baseline: string;
  clients: number;
  /** Median over rounds of (arm / baseline) measured in the same round. */
  tps: number;
  rate: number;
  p50: number;
  p95: number;
  p99: number;
  /**
   * Median over rounds of the ratio of mean latencies: from the op rates when the arms ran one
   * after the other (exact, no clock involved), from the logged means when they were interleaved
   * in one pgbench run (there the rates only reflect how often pgbench picked each script).
   */
  meanLatency: number;
  /** Largest share of calls logged as 0 us by either side (see LatencySummary.zeroShare). */
  zeroShare: number;
  /** Median over rounds of baseline server CPU per transaction / arm's: the CPU-bound TPS ratio. */
  cpuCapacity?: number;
}

export interface Verdict {
  target: string;
  description: string;
  arm: string;
  clients: number | null;
  value: number;
  limit: number;
  ciLimit: number;
  met: boolean;
  ciPassed: boolean;
  /**
   * Set when a p50 target is judged on the ratio of mean latencies instead, because pgbench
   * logged too many calls as 0 us for its percentiles to hold (see LatencySummary.zeroShare).
   */
  fallback?: string;
}

export interface Summary {
  mode: string;
  settings: {
    clients: number[];
    rounds: number;
    durationSeconds: number;
    walTransactions: number;
    interleave: Interleave | 'auto';
  };
  arms: Arm[];
  cells: Cell[];
  ratios: Ratio[];
  wal: WalRecord[];
  verdicts: Verdict[];
  hot: { arm: string; upd: number; hotUpd: number; ratio: number }[];
  grants: { arm: string; clients: number; grantsPerSecond: number }[];
  runs: RunRecord[];
  profile?: ProfileResult;
  elapsedSeconds: number;
}

function opsOf(
  records: RunRecord[],
): { workload: string; op: OpId; clients: number; arm: string }[] {
  const keys = new Map<string, { workload: string; op: OpId; clients: number; arm: string }>();
  for (const r of records)
    for (const op of Object.keys(r.ops) as OpId[])
      keys.set(`${r.workload}|${op}|${r.clients}|${r.arm}`, {
        workload: r.workload,
        op,
        clients: r.clients,
        arm: r.arm,
      });
  return [...keys.values()];
}

export function aggregate(records: RunRecord[]): { cells: Cell[]; ratios: Ratio[] } {
  const cells: Cell[] = [];
  const ratios: Ratio[] = [];
  for (const key of opsOf(records)) {
    const runs = records.filter(
      (r) => r.workload === key.workload && r.clients === key.clients && r.arm === key.arm,
    );
    const ops = runs.map((r) => r.ops[key.op]!);
    cells.push({
      ...key,
      rounds: runs.length,
      tps: median(runs.map((r) => r.tps)),
      rate: median(ops.map((o) => o.rate)),
      p50Us: median(ops.map((o) => o.p50Us)),
      p95Us: median(ops.map((o) => o.p95Us)),
      p99Us: median(ops.map((o) => o.p99Us)),
      meanUs: median(ops.map((o) => o.meanUs)),
      samples: ops.reduce((sum, o) => sum + o.n, 0),
      ...(runs.every((r) => r.serverCpuUsPerTransaction !== undefined)
        ? { serverCpuUs: median(runs.map((r) => r.serverCpuUsPerTransaction!)) }
        : {}),
    });
    for (const baseline of ['bare', 'advisory']) {
      if (key.arm === baseline || key.arm === 'advisory') continue;
      const pairs = runs
        .map((r) => ({
          arm: r,
          base: records.find(
            (b) =>
              b.round === r.round &&
              b.workload === r.workload &&
              b.clients === r.clients &&
              b.arm === baseline,
          ),
        }))
        .filter((p) => p.base?.ops[key.op]);
      if (pairs.length === 0) continue;
      const ratio = (f: (r: RunRecord) => number) =>
        median(pairs.map((p) => f(p.arm) / f(p.base!)));
      ratios.push({
        ...key,
        baseline,
        tps: ratio((r) => r.tps),
        rate: ratio((r) => r.ops[key.op]!.rate),
        p50: ratio((r) => r.ops[key.op]!.p50Us),
        p95: ratio((r) => r.ops[key.op]!.p95Us),
        p99: ratio((r) => r.ops[key.op]!.p99Us),
        meanLatency: median(
          pairs.map((p) =>
            p.arm.interleave === 'run'
              ? p.base!.ops[key.op]!.rate / p.arm.ops[key.op]!.rate
              : p.arm.ops[key.op]!.meanUs / p.base!.ops[key.op]!.meanUs,
          ),
        ),
        zeroShare: Math.max(
          ...pairs.flatMap((p) => [p.arm.ops[key.op]!.zeroShare, p.base!.ops[key.op]!.zeroShare]),
        ),
        ...(pairs.every((p) => p.arm.serverCpuUsPerTransaction && p.base!.serverCpuUsPerTransaction)
          ? {
              cpuCapacity: median(
                pairs.map(
                  (p) => p.base!.serverCpuUsPerTransaction! / p.arm.serverCpuUsPerTransaction!,
                ),
              ),
            }
          : {}),
      });
    }
  }
  return { cells, ratios };
}

/** WAL records per call of an op for an arm: the pg_walinspect split where there is one, else pg_stat_wal. */
export function walRecordsPerCall(wal: WalRecord[], op: OpId, arm: string): number {
  const workload = WORKLOADS.find((w) => w.ops.some((o) => o.id === op));
  const record = wal.find((w) => w.arm === arm && w.workload === workload?.id);
  if (!record) return Number.NaN;
  // The operation's own records (page-maintenance records left out, see measure.ts); only
  // pg_walinspect (PG15+) can tell them apart, pg_stat_wal counts everything.
  const split = record.byOp?.[op]?.opRecords;
  if (split !== undefined) return split;
  return workload!.ops.length === 1 ? record.perCall.records : Number.NaN;
}

/** Above this share of 0 us log entries, a p50 ratio is replaced by the mean-latency ratio. */
export const ZERO_SHARE_LIMIT = 0.01;

export function evaluate(
  ratios: Ratio[],
  wal: WalRecord[],
  arms: string[],
  clients: number[],
): Verdict[] {
  const verdicts: Verdict[] = [];
  const judge = (
    target: Target,
    value: number,
    arm: string,
    c: number | null,
    fallback?: string,
  ) => {
    const higherIsBetter = target.metric === 'tps';
    const within = (limit: number) => (higherIsBetter ? value >= limit : value <= limit);
    verdicts.push({
      target: target.id,
      description: target.description,
      arm,
      clients: c,
      value,
      limit: target.limit,
      ciLimit: target.ciLimit,
      met: Number.isFinite(value) && within(target.limit),
      ciPassed: Number.isFinite(value) && within(target.ciLimit),
      ...(fallback ? { fallback } : {}),
    });
  };
  for (const arm of arms) {
    for (const target of TARGETS) {
      if (target.metric === 'walRecords') {
        const value =
          walRecordsPerCall(wal, target.op, arm) - walRecordsPerCall(wal, target.op, 'bare');
        // Not measured (workload left out, or no pg_walinspect split on PG14): no verdict.
        if (Number.isFinite(value)) judge(target, value, arm, null);
        continue;
      }
      for (const c of target.clients ?? clients) {
        if (!clients.includes(c)) continue;
        const ratio = ratios.find(
          (r) => r.arm === arm && r.baseline === 'bare' && r.op === target.op && r.clients === c,
        );
        if (!ratio) continue;
        if (target.metric === 'tps') judge(target, ratio.tps, arm, c);
        else if (ratio.zeroShare > ZERO_SHARE_LIMIT)
          judge(
            target,
            ratio.meanLatency,
            arm,
            c,
            `mean latency: pgbench logged up to ${(100 * ratio.zeroShare).toFixed(0)}% of these calls as 0 us`,
          );
        else judge(target, ratio.p50, arm, c);
      }
    }
  }
  return verdicts;
}

const fmt = (v: number, digits = 2) => (Number.isFinite(v) ? v.toFixed(digits) : 'n/a');
const us = (v: number) => (Number.isFinite(v) ? v.toFixed(0) : 'n/a');

export function summaryMarkdown(summary: Summary, env: Environment, folder: string): string {
  const { cells, ratios, wal } = summary;
  const L: string[] = [];
  const cell = (w: string, op: string, arm: string, c: number) =>
    cells.find((x) => x.workload === w && x.op === op && x.arm === arm && x.clients === c);
  const ratio = (op: string, arm: string, c: number, baseline = 'bare') =>
    ratios.find((x) => x.op === op && x.arm === arm && x.clients === c && x.baseline === baseline);
  L.push(
    `# pg_lease benchmark: ${folder}`,
    '',
    `${env.postgres.versionString}; ${env.pgbench.version}; ${env.cpu.logicalCores} cores (${env.cpu.model}), shared with other work.`,
    `Mode **${summary.mode}**: clients ${summary.settings.clients.join(', ')}, ${summary.settings.rounds} rounds of ` +
      `${summary.settings.durationSeconds} s, ` +
      {
        run: 'one pgbench run per arm, back to back, order alternating each round; ',
        transaction:
          'all arms interleaved per transaction in one pgbench run (TPS = clients / mean latency); ',
        auto: 'at 1 client all arms interleaved per transaction in one pgbench run (TPS = 1 / mean latency), at more clients one pgbench run per arm, back to back, order alternating each round; ',
      }[summary.settings.interleave] +
      `WAL phase ${summary.settings.walTransactions} transactions on 1 client. fsync=${env.settings.fsync}, ` +
      `synchronous_commit=${env.settings.synchronous_commit}, full_page_writes=${env.settings.full_page_writes}. ` +
      `Command: \`${env.command}\`. Took ${Math.round(summary.elapsedSeconds)} s.`,
    '',
    'Ratios are lease / bare baseline measured in the same round, median over rounds: for TPS higher is',
    'better (1.00 = as fast as bare SQL), for latency lower is better. Environment: `environment.md`.',
    '',
    '## Headline',
    '',
    '| measure | clients | lease | bare | ratio | target | met |',
    '|---|---:|---:|---:|---:|---:|:---:|',
  );
  const verdictFor = (id: string, c: number | null) =>
    summary.verdicts.find((v) => v.target === id && v.arm === 'lease' && v.clients === c);
  const mark = (v?: Verdict) => (v ? (v.met ? 'yes' : '**no**') : '');
  const headline: {
    label: string;
    workload: string;
    op: OpId;
    metric: 'tps' | 'p50';
    target?: string;
  }[] = [
    { label: 'W1-cycle TPS', workload: 'W1-cycle', op: 'cycle', metric: 'tps' },
    {
      label: 'acquire p50 (us)',
      workload: 'W3-acquire-release',
      op: 'acquire',
      metric: 'p50',
      target: 'T3',
    },
    { label: 'renew p50 (us)', workload: 'W3-renew', op: 'renew', metric: 'p50', target: 'T4' },
    {
      label: 'release p50 (us)',
      workload: 'W3-acquire-release',
      op: 'release',
      metric: 'p50',
      target: 'T5',
    },
    {
      label: 'inspect p50 (us)',
      workload: 'W3-inspect',
      op: 'inspect',
      metric: 'p50',
      target: 'T6',
    },
    { label: 'W2-contend TPS', workload: 'W2-contend', op: 'attempt', metric: 'tps' },
    {
      label: 'fenced write p50 (us)',
      workload: 'W4-fenced-write',
      op: 'fenced',
      metric: 'p50',
      target: 'T9',
    },
    {
      label: 'fenced_row UPDATE p50 (us)',
      workload: 'W4-fenced-trigger',
      op: 'fenced-row',
      metric: 'p50',
    },
  ];
  for (const h of headline) {
    for (const c of summary.settings.clients) {
      const lease = cell(h.workload, h.op, 'lease', c);
      const bare = cell(h.workload, h.op, 'bare', c);
      const r = ratio(h.op, 'lease', c);
      if (!lease || !bare || !r) continue;
      let targetId = h.target;
      if (h.op === 'cycle') targetId = c === 1 ? 'T1' : c === 16 ? 'T2' : undefined;
      const v = targetId ? verdictFor(targetId, c) : undefined;
      const value = v?.fallback
        ? `${fmt(v.value)} (mean)†`
        : fmt(h.metric === 'tps' ? r.tps : r.p50);
      L.push(
        `| ${h.label} | ${c} | ${h.metric === 'tps' ? fmt(lease.tps, 0) : us(lease.p50Us)} | ${h.metric === 'tps' ? fmt(bare.tps, 0) : us(bare.p50Us)} | ${value} | ${v ? `${h.metric === 'tps' ? '>=' : '<='} ${fmt(v.limit)}` : ''} | ${mark(v)} |`,
      );
    }
  }
  for (const [id, op] of [
    ['T7', 'renew'],
    ['T8', 'release'],
  ] as const) {
    const v = verdictFor(id, null);
    const lease = walRecordsPerCall(wal, op, 'lease');
    const bare = walRecordsPerCall(wal, op, 'bare');
    L.push(
      `| WAL records per ${op} | 1 | ${fmt(lease)} | ${fmt(bare)} | ${fmt(lease - bare, 2)} (diff) | <= +0 | ${mark(v)} |`,
    );
  }
  const hot = summary.hot.find((h) => h.arm === 'lease');
  if (hot)
    L.push(
      '',
      `HOT updates of lease.leases over the W1 runs: ${hot.hotUpd} of ${hot.upd} (${fmt(hot.ratio * 100, 1)}%).`,
    );

  L.push(
    '',
    '## Targets (every arm that carries them)',
    '',
    '| target | arm | clients | value | target | met | CI guard | CI |',
    '|---|---|---:|---:|---:|:---:|---:|:---:|',
  );
  for (const v of summary.verdicts) {
    const op = TARGETS.find((t) => t.id === v.target)!.metric === 'tps' ? '>=' : '<=';
    L.push(
      `| ${v.target} ${v.description} | ${v.arm} | ${v.clients ?? 1} | ${fmt(v.value)}${v.fallback ? '†' : ''} | ${op} ${fmt(v.limit)} | ${v.met ? 'yes' : '**no**'} | ${op} ${fmt(v.ciLimit)} | ${v.ciPassed ? 'pass' : '**FAIL**'} |`,
    );
  }
  const fallbacks = summary.verdicts.filter((v) => v.fallback);
  if (fallbacks.length > 0)
    L.push(
      '',
      '† Judged on the ratio of mean latencies (from the op rates when the arms ran one after the ' +
        'other, from the logs when they were interleaved), not p50: pgbench logged too many ' +
        'of the calls as 0 us (its thread lost the core between sending a query and reading the ' +
        `answer, and reused an older clock reading), which understates short calls' percentiles. ` +
        fallbacks
          .map((v) => `${v.target} ${v.arm} ${v.clients} clients: ${v.fallback}`)
          .join('; ') +
        '.',
    );

  L.push(
    '',
    '## Latency and throughput, every arm',
    '',
    'Microseconds; medians over rounds. Ratio columns: p50 and TPS (op rate for split logs) over the bare arm in the same round. Server CPU per transaction (all server processes, from /proc; runs of a single arm only) is immune to waiting for a core; "CPU capacity" = bare CPU/tx over the arm\'s, the TPS ratio a CPU-bound run tends to.',
    '',
    '| workload | op | clients | arm | TPS | op/s | p50 | p95 | p99 | p50 / bare | p99 / bare | op/s / bare | server CPU us/tx | CPU capacity vs bare |',
    '|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
  );
  const armOrder = summary.arms.map((a) => a.id);
  const sorted = [...cells].sort(
    (a, b) =>
      WORKLOADS.findIndex((w) => w.id === a.workload) -
        WORKLOADS.findIndex((w) => w.id === b.workload) ||
      a.op.localeCompare(b.op) ||
      a.clients - b.clients ||
      armOrder.indexOf(a.arm) - armOrder.indexOf(b.arm),
  );
  for (const c of sorted) {
    const r = ratio(c.op, c.arm, c.clients);
    L.push(
      `| ${c.workload} | ${c.op} | ${c.clients} | ${c.arm} | ${fmt(c.tps, 0)} | ${fmt(c.rate, 0)} | ${us(c.p50Us)} | ${us(c.p95Us)} | ${us(c.p99Us)} | ${r ? fmt(r.p50) : ''} | ${r ? fmt(r.p99) : ''} | ${r ? fmt(r.rate) : ''} | ${c.serverCpuUs !== undefined ? fmt(c.serverCpuUs, 0) : ''} | ${r?.cpuCapacity !== undefined ? fmt(r.cpuCapacity) : ''} |`,
    );
  }
  if (summary.grants.length) {
    L.push(
      '',
      'W2-contend grants (epoch increases on the 4 shared keys) per second, median over rounds: ' +
        summary.grants
          .map((g) => `${g.arm} c${g.clients} ${fmt(g.grantsPerSecond, 0)}`)
          .join('; ') +
        '.',
    );
  }

  L.push(
    '',
    '## WAL per call (1 client, fixed transaction count)',
    '',
    "pg_stat_wal deltas divided by calls (the first transaction of renew/inspect, which takes the lease, included). `split` columns: pg_walinspect, records grouped per transaction at each commit, background records left out; `own` leaves out page-maintenance records too (on-access pruning, hint-bit full-page images, new clog pages), whose frequency depends on how full the row's page is, not on the SQL; the WAL targets compare `own` records.",
    '',
    '| workload | arm | calls | records/call | FPI/call | bytes/call | split records/call | own records/call | split bytes/call | updates (HOT) |',
    '|---|---|---:|---:|---:|---:|---|---|---|---|',
  );
  for (const w of wal) {
    const split = Object.entries(w.byOp ?? {})
      .map(([op, v]) => `${op} ${fmt(v!.records)}`)
      .join(', ');
    const own = Object.entries(w.byOp ?? {})
      .map(([op, v]) => `${op} ${fmt(v!.opRecords)}`)
      .join(', ');
    const splitBytes = Object.entries(w.byOp ?? {})
      .map(([op, v]) => `${op} ${fmt(v!.bytes, 0)}`)
      .join(', ');
    const table = w.table && w.table.upd ? `${w.table.upd} (${w.table.hotUpd})` : '';
    L.push(
      `| ${w.workload} | ${w.arm} | ${w.calls} | ${fmt(w.perCall.records)} | ${fmt(w.perCall.fpi, 3)} | ${fmt(w.perCall.bytes, 0)} | ${split} | ${own} | ${splitBytes} | ${table} |`,
    );
  }
  L.push('', 'Most frequent WAL record sequences per transaction:', '');
  for (const w of wal.filter((x) => x.signatures?.length)) {
    L.push(
      `- ${w.workload} / ${w.arm}: ` +
        w
          .signatures!.slice(0, 3)
          .map((s) => `\`${s.signature}\` x${s.count}`)
          .join('; '),
    );
  }

  if (summary.profile) L.push('', ...profileMarkdown(summary.profile));
  L.push(
    '',
    '## Files',
    '',
    '- `summary.json`: everything above plus every run (`runs[]`, with the load average before each run).',
    '- `environment.md`, `environment.json`: versions, machine, storage, settings.',
    '- `charts/*.svg`: latency percentiles per workload and client count, and the ratios against the targets.',
    '- `raw/*.log.gz`: pgbench `-l` logs, subsampled to at most 2000 lines per run (percentiles were computed from the full logs).',
    "- `scripts/`: the exact pgbench scripts each arm ran. `pgbench-output.txt`: pgbench's own reports.",
  );
  if (summary.profile)
    L.push(
      '- `auto-explain.txt`: plans of the statements inside the functions (auto_explain, nested statements, ANALYZE, BUFFERS).',
    );
  return L.join('\n') + '\n';
}

function profileMarkdown(profile: ProfileResult): string[] {
  const L = [
    '## Profile (second cluster, same settings, pg_stat_statements and track_functions on)',
    '',
  ];
  L.push(
    '### Server-side CPU per call (us), no round trip, no parse',
    '',
    'plpgsql loops of 500 calls, COMMIT after each write (synchronous_commit local: pg_lease refuses asynchronous commits of its writes); backend CPU time from /proc/<pid>/schedstat (time spent waiting for a core not counted); median of 5 rounds. `lease-plain` = shipped bodies without SECURITY DEFINER and without SET search_path; `lease-noset` = SECURITY DEFINER kept, SET search_path dropped (diagnostic only: the contract requires both).',
    '',
  );
  const impls = Object.keys(Object.values(profile.serverUsPerCall)[0] ?? {});
  const fixed = ['bare', 'lease-plain', 'lease-noset', 'lease'];
  const ordered = [
    ...fixed.filter((i) => impls.includes(i)),
    ...impls.filter((i) => !fixed.includes(i)),
  ];
  L.push(
    `| op | ${ordered.join(' | ')} | SET search_path (lease - noset) | SECURITY DEFINER (noset - plain) | function layer (plain - bare) |`,
    `|---|${ordered.map(() => '---:').join('|')}|---:|---:|---:|`,
  );
  for (const [op, byImpl] of Object.entries(profile.serverUsPerCall)) {
    const v = (i: string) => byImpl[i] ?? Number.NaN;
    L.push(
      `| ${op} | ${ordered.map((i) => fmt(v(i), 1)).join(' | ')} | ${fmt(v('lease') - v('lease-noset'), 1)} | ${fmt(v('lease-noset') - v('lease-plain'), 1)} | ${fmt(v('lease-plain') - v('bare'), 1)} |`,
    );
  }
  if (Object.keys(profile.callOverhead ?? {}).length) {
    L.push(
      '',
      '### Function-layer features alone (backend CPU us per call, empty loop subtracted)',
      '',
      '| function | us/call |',
      '|---|---:|',
    );
    for (const [name, us] of Object.entries(profile.callOverhead))
      L.push(`| ${name} | ${fmt(us, 2)} |`);
  }
  L.push(
    '',
    '### Commit flush share (renew, 1 client, p50 us; pg_lease turns synchronous_commit off back to local, so its off column still flushes)',
    '',
    '| arm | synchronous_commit on | off | flush share |',
    '|---|---:|---:|---:|',
  );
  for (const [key, v] of Object.entries(profile.flush))
    L.push(`| ${key} | ${us(v.on)} | ${us(v.off)} | ${fmt(((v.on - v.off) / v.on) * 100, 0)}% |`);
  L.push(
    '',
    '### Statements inside the functions (pg_stat_statements, track = all; mean us)',
    '',
    '| workload | arm | level | calls | mean us | statement |',
    '|---|---|---|---:|---:|---|',
  );
  for (const s of profile.statements) {
    L.push(
      `| ${s.workload} | ${s.arm} | ${s.toplevel ? 'top' : 'nested'} | ${s.calls} | ${fmt(s.meanUs, 1)} | \`${s.query.slice(0, 160).replace(/\|/g, '\\|')}\` |`,
    );
  }
  L.push(
    '',
    '### Functions (track_functions = all; us per call)',
    '',
    '| workload: function | calls | total | self |',
    '|---|---:|---:|---:|',
  );
  for (const f of profile.functions)
    L.push(`| ${f.name} | ${f.calls} | ${fmt(f.totalUsPerCall, 1)} | ${fmt(f.selfUsPerCall, 1)} |`);
  L.push('', '### pgbench -r per-statement latencies (1 client)', '');
  for (const [key, text] of Object.entries(profile.perStatement))
    L.push(`${key}:`, '```', text, '```');
  return L;
}

export function hotRatios(records: RunRecord[]): Summary['hot'] {
  const byArm = new Map<string, { upd: number; hotUpd: number }>();
  for (const r of records) {
    if (!r.table) continue;
    const acc = byArm.get(r.arm) ?? { upd: 0, hotUpd: 0 };
    acc.upd += r.table.upd;
    acc.hotUpd += r.table.hotUpd;
    byArm.set(r.arm, acc);
  }
  return [...byArm.entries()].map(([arm, v]) => ({
    arm,
    ...v,
    ratio: v.upd ? v.hotUpd / v.upd : Number.NaN,
  }));
}

export function grantRates(records: RunRecord[]): Summary['grants'] {
  const out: Summary['grants'] = [];
  const keys = new Set(
    records.filter((r) => r.grants !== undefined).map((r) => `${r.arm}|${r.clients}`),
  );
  for (const key of keys) {
    const [arm, c] = key.split('|');
    const runs = records.filter(
      (r) => r.arm === arm && r.clients === Number(c) && r.grants !== undefined,
    );
    out.push({
      arm: arm!,
      clients: Number(c),
      grantsPerSecond: median(runs.map((r) => r.grants! / r.durationSeconds)),
    });
  }
  return out;
}

/** Latency charts per op (p50 bars, p95/p99 marks, per client count) and the ratio chart. */
export function writeCharts(summary: Summary, dir: string): string[] {
  fs.mkdirSync(dir, { recursive: true });
  const written: string[] = [];
  const ops = [...new Set(summary.cells.map((c) => `${c.workload}|${c.op}`))];
  for (const key of ops) {
    const [workload, op] = key.split('|') as [string, OpId];
    const cells = summary.cells.filter((c) => c.workload === workload && c.op === op);
    const series = summary.arms.map((a) => a.id).filter((id) => cells.some((c) => c.arm === id));
    const svg = barChart({
      title: `${workload}: ${op} latency`,
      subtitle: 'bar = p50, ticks = p95 and p99; median over rounds',
      yLabel: 'latency (us)',
      log: true,
      series,
      groups: summary.settings.clients.map((clients) => ({
        label: `${clients} client${clients > 1 ? 's' : ''}`,
        bars: cells
          .filter((c) => c.clients === clients)
          .map((c) => ({
            series: c.arm,
            value: c.p50Us,
            marks: [
              { label: 'p95', value: c.p95Us },
              { label: 'p99', value: c.p99Us },
            ],
          })),
      })),
    });
    const file = `latency-${workload.toLowerCase()}-${op}.svg`;
    fs.writeFileSync(path.join(dir, file), svg);
    written.push(file);
  }
  const ratioSeries = summary.arms
    .filter((a) => a.role !== 'baseline' && a.role !== 'ceiling')
    .map((a) => a.id);
  const groups = [
    { op: 'cycle' as OpId, metric: 'tps' as const, label: 'W1 TPS' },
    { op: 'acquire' as OpId, metric: 'p50' as const, label: 'acquire p50' },
    { op: 'renew' as OpId, metric: 'p50' as const, label: 'renew p50' },
    { op: 'release' as OpId, metric: 'p50' as const, label: 'release p50' },
    { op: 'inspect' as OpId, metric: 'p50' as const, label: 'inspect p50' },
  ];
  for (const clients of summary.settings.clients) {
    const svg = barChart({
      title: `lease / bare baseline, ${clients} client${clients > 1 ? 's' : ''}`,
      subtitle:
        'TPS ratio (higher is better) for W1, p50 latency ratio (lower is better) for single ops; dashed: targets',
      yLabel: 'ratio to bare SQL',
      series: ratioSeries,
      references: [
        { value: 1, label: '1.0 = bare' },
        { value: 1.15, label: 'single-op target 1.15' },
        ...(clients === 1
          ? [{ value: 0.9, label: 'W1 target 0.90' }]
          : clients === 16
            ? [{ value: 0.85, label: 'W1 target 0.85' }]
            : []),
      ],
      groups: groups.map((g) => ({
        label: g.label,
        bars: ratioSeries
          .map((arm) => {
            const r = summary.ratios.find(
              (x) =>
                x.op === g.op && x.arm === arm && x.clients === clients && x.baseline === 'bare',
            );
            return r ? { series: arm, value: g.metric === 'tps' ? r.tps : r.p50 } : undefined;
          })
          .filter((b): b is { series: string; value: number } => b !== undefined),
      })),
    });
    const file = `ratios-c${clients}.svg`;
    fs.writeFileSync(path.join(dir, file), svg);
    written.push(file);
  }
  return written;
}

/** Rounds every number in the summary for a readable JSON file. */
export function toJson(value: unknown): string {
  return (
    JSON.stringify(value, (_, v: unknown) => (typeof v === 'number' ? round(v, 4) : v), 2) + '\n'
  );
}
