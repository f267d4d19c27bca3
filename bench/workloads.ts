/**
 * The workload catalogue: which pgbench scripts exist, which arms (lease, baselines,
 * diagnostic variants) run each, how a run's log splits into operations, and which bare
 * baseline each lease figure is divided by.
 */
import * as path from 'node:path';

/** The script family an arm runs: `bench/workloads/<workload>.<script>.sql`. */
export type ScriptKind = 'lease' | 'bare' | 'advisory';

/** One contender in a workload. */
export interface Arm {
  /** Stable id used in file names and the summary, e.g. `lease`, `bare`, `lease-noset`. */
  id: string;
  label: string;
  script: ScriptKind;
  /** Schema the lease script's calls are redirected to (`lease.` -> `<schema>.`). */
  schema?: string;
  /** Table the arm writes (none for advisory locks). */
  table?: string;
  /**
   * Tag put into the arm's keys (`w1-k3-0`). Same length for every arm, so every arm's rows
   * are the same size and fill pages, get pruned and stay HOT at the same rate.
   */
  keyTag: string;
  /** Diagnostic arms explain costs; they are not shipped and carry no target. */
  role: 'shipped' | 'baseline' | 'ceiling' | 'diagnostic' | 'candidate';
}

/** Operations a log is split into. */
export type OpId =
  'cycle' | 'attempt' | 'acquire' | 'release' | 'renew' | 'inspect' | 'fenced' | 'fenced-row';

export interface OpSpec {
  id: OpId;
  /** Which transactions of each client's sequence belong to the op. */
  positions: 'all' | 'even' | 'odd' | 'after-first';
  /** Database operations (statements/calls) the op stands for, for WAL per operation. */
  calls: number;
  /** What the bare arm does for this op, named in the summary. */
  baseline: string;
}

export interface Workload {
  id:
    | 'W1-cycle'
    | 'W2-contend'
    | 'W3-acquire-release'
    | 'W3-renew'
    | 'W3-inspect'
    | 'W4-fenced-write'
    | 'W4-fenced-trigger';
  file: string;
  title: string;
  scripts: ScriptKind[];
  ops: OpSpec[];
  defines?: Record<string, string | number>;
  /** Key prefix the workload uses, for resets and sanity checks. */
  keyPrefix: string;
}

export const WORKLOADS: Workload[] = [
  {
    id: 'W1-cycle',
    file: 'w1-cycle',
    title: 'acquire + renew + release of a client-private key (3 autocommit calls)',
    scripts: ['lease', 'bare', 'advisory'],
    ops: [{ id: 'cycle', positions: 'all', calls: 3, baseline: 'bare 3-statement cycle' }],
    keyPrefix: 'w1-',
  },
  {
    id: 'W2-contend',
    file: 'w2-contend',
    title: 'single acquire attempts on 4 keys shared by all clients (TTL 20 ms)',
    scripts: ['lease', 'bare', 'advisory'],
    ops: [{ id: 'attempt', positions: 'all', calls: 1, baseline: 'bare conditional upsert' }],
    keyPrefix: 'w2-',
  },
  {
    id: 'W3-acquire-release',
    file: 'w3-acquire-release',
    title: 'acquire of a free key, then its release, alternating (split by position)',
    scripts: ['lease', 'bare', 'advisory'],
    ops: [
      { id: 'acquire', positions: 'even', calls: 1, baseline: 'bare conditional upsert' },
      { id: 'release', positions: 'odd', calls: 1, baseline: 'bare single-row update' },
    ],
    defines: { phase: 0 },
    keyPrefix: 'w3a-',
  },
  {
    id: 'W3-renew',
    file: 'w3-renew',
    title: 'renew of a held key',
    scripts: ['lease', 'bare'],
    ops: [{ id: 'renew', positions: 'after-first', calls: 1, baseline: 'bare single-row update' }],
    defines: { epoch: -1 },
    keyPrefix: 'w3r-',
  },
  {
    id: 'W3-inspect',
    file: 'w3-inspect',
    title: 'inspect of a held key',
    scripts: ['lease', 'bare'],
    ops: [
      { id: 'inspect', positions: 'after-first', calls: 1, baseline: 'bare primary-key SELECT' },
    ],
    keyPrefix: 'w3i-',
  },
  {
    id: 'W4-fenced-write',
    file: 'w4-fenced-write',
    title: 'a one-row UPDATE of a business table in a transaction fenced by lease.fence',
    scripts: ['lease', 'bare'],
    ops: [
      {
        id: 'fenced',
        positions: 'after-first',
        calls: 1,
        baseline: 'the same UPDATE in BEGIN/COMMIT, unfenced',
      },
    ],
    defines: { epoch: -1 },
    keyPrefix: 'w4-',
  },
  {
    id: 'W4-fenced-trigger',
    file: 'w4-fenced-trigger',
    title: 'a one-row autocommit UPDATE of a table whose lease.fence_row trigger fences it',
    scripts: ['lease', 'bare'],
    ops: [
      {
        id: 'fenced-row',
        positions: 'after-first',
        calls: 1,
        baseline: 'the same UPDATE on a table without the trigger',
      },
    ],
    defines: { epoch: -1 },
    keyPrefix: 'w4t-',
  },
];

/** The template of a workload's script for an arm. */
export function scriptTemplate(
  workloadsDir: string,
  workload: Workload,
  script: ScriptKind,
): string {
  return path.join(workloadsDir, `${workload.file}.${script}.sql`);
}

/** pgbench's own variables, never renamed. */
const BUILTIN_VARIABLES = new Set(['client_id', 'scale', 'random_seed', 'default_seed']);

/** The identifier an arm's variables and keys are prefixed with, e.g. `lease_noset`. */
export function armTag(arm: Arm): string {
  return arm.id.replace(/[^A-Za-z0-9]/g, '_');
}

/**
 * Makes a workload template the script of one arm: lease calls redirected to the arm's
 * schema, keys prefixed with the arm (`w1-` -> `w1-lease_noset-`) and every script variable
 * prefixed with it (`:epoch` -> `:lease_noset_epoch`, `\gset` -> `\gset lease_noset_`), so
 * that arms never share a key or a variable, also when one pgbench run interleaves them.
 */
export function armScript(template: string, arm: Arm): string {
  const tag = armTag(arm);
  return template
    .split('\n')
    .map((line) => {
      if (/^\s*--/.test(line)) return line;
      let out = line.replace(/'(w1|w2|w3a|w3r|w3i|w4|w4t)-'/g, `'$1-${arm.keyTag}-'`);
      if (arm.schema)
        out = out.replace(/\blease\.(acquire|renew|release|inspect|fence)\(/g, `${arm.schema}.$1(`);
      out = out.replace(/\\gset\b/g, `\\gset ${tag}_`);
      out = out.replace(/\\set (\w+)/g, `\\set ${tag}_$1`);
      out = out.replace(/(?<!:):([A-Za-z_]\w*)/g, (match, name: string) =>
        BUILTIN_VARIABLES.has(name) ? match : `:${tag}_${name}`,
      );
      return out;
    })
    .join('\n');
}

/** The `-D` definitions of a workload for an arm (variables prefixed as in {@link armScript}). */
export function armDefines(workload: Workload, arm: Arm): Record<string, string | number> {
  const tag = armTag(arm);
  return Object.fromEntries(
    Object.entries(workload.defines ?? {}).map(([name, value]) => [`${tag}_${name}`, value]),
  );
}

/** Key prefix of a workload for an arm, for resets, seeds and grant counts. */
export function armKeyPrefix(workload: Workload, arm: Arm): string {
  return `${workload.keyPrefix}${arm.keyTag}-`;
}

/** Whether a transaction at `position` of its client's sequence belongs to `op`. */
export function inOp(op: OpSpec, position: number): boolean {
  switch (op.positions) {
    case 'all':
      return true;
    case 'even':
      return position % 2 === 0;
    case 'odd':
      return position % 2 === 1;
    case 'after-first':
      return position > 0;
  }
}

/** A pass/fail rule on a lease/bare ratio. */
export interface Target {
  id: string;
  description: string;
  op: OpId;
  /** `tps`: lease/bare throughput (higher is better); `p50`: lease/bare median latency; `walRecords`: lease - bare WAL records per call. */
  metric: 'tps' | 'p50' | 'walRecords';
  /** Client counts the rule applies to; undefined = every measured count. */
  clients?: number[];
  /** The target. */
  limit: number;
  /** The CI regression guard: the target widened by a margin that noise stays inside. */
  ciLimit: number;
}

export const TARGETS: Target[] = [
  {
    id: 'T1',
    description: 'W1-cycle TPS >= 0.90x bare cycle at 1 client',
    op: 'cycle',
    metric: 'tps',
    clients: [1],
    limit: 0.9,
    // Against the plain-table baseline (no CHECK constraints, issue 16) the ratios sit about
    // 0.1 lower than against the old copy of lease.leases; the guards moved by as much, so
    // noise on a busy machine stays inside them (quick mode measured 0.77 and 0.85).
    ciLimit: 0.65,
  },
  {
    id: 'T2',
    description: 'W1-cycle TPS >= 0.85x bare cycle at 16 clients',
    op: 'cycle',
    metric: 'tps',
    clients: [16],
    limit: 0.85,
    ciLimit: 0.7,
  },
  {
    id: 'T3',
    description: 'acquire p50 <= 1.15x bare upsert',
    op: 'acquire',
    metric: 'p50',
    limit: 1.15,
    ciLimit: 1.55, // plain-table baseline: see T1
  },
  {
    id: 'T4',
    description: 'renew p50 <= 1.15x bare single-row update',
    op: 'renew',
    metric: 'p50',
    limit: 1.15,
    ciLimit: 1.55, // plain-table baseline: see T1
  },
  {
    id: 'T5',
    description: 'release p50 <= 1.15x bare single-row update',
    op: 'release',
    metric: 'p50',
    limit: 1.15,
    ciLimit: 1.55, // plain-table baseline: see T1
  },
  {
    id: 'T6',
    description: 'inspect p50 <= 1.5x bare primary-key SELECT',
    op: 'inspect',
    metric: 'p50',
    limit: 1.5,
    ciLimit: 1.9,
  },
  {
    id: 'T7',
    description: 'WAL records per renew <= bare single-row update',
    op: 'renew',
    metric: 'walRecords',
    limit: 0,
    ciLimit: 0.05,
  },
  {
    id: 'T8',
    description: 'WAL records per release <= bare single-row update',
    op: 'release',
    metric: 'walRecords',
    limit: 0,
    ciLimit: 0.05,
  },
  {
    id: 'T9',
    description: 'fenced write (fence + one-row UPDATE) p50 <= 1.25x the same UPDATE unfenced',
    op: 'fenced',
    metric: 'p50',
    limit: 1.25,
    ciLimit: 1.5,
  },
];
