/**
 * pg_lease benchmark runner: `npm run bench -- [options]`. See bench/README.md.
 *
 * Starts a throwaway cluster with durable settings (fsync, synchronous_commit and
 * full_page_writes on), runs the pgbench workloads for pg_lease and its bare-SQL and
 * advisory-lock baselines interleaved in rounds, measures WAL per call, optionally profiles,
 * and writes bench/results/<timestamp>/. With --check it exits 1 when a lease/baseline ratio
 * crosses its CI guard.
 */
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { parseArgs } from 'node:util';
import {
  PgCluster,
  findInstallation,
  type InstallationRequest,
  PACKAGE_ROOT,
} from 'pg-lease-testing';
import { recordEnvironment, writeEnvironment } from './environment.js';
import {
  throughputRound,
  walRun,
  type BenchContext,
  type Interleave,
  type RunRecord,
  type WalRecord,
} from './measure.js';
import { findPgbench, PgbenchMissingError } from './pgbench.js';
import { profile } from './profile.js';
import {
  aggregate,
  evaluate,
  grantRates,
  hotRatios,
  summaryMarkdown,
  toJson,
  writeCharts,
  type Summary,
} from './report.js';
import {
  BENCH_SETTINGS,
  buildArms,
  candidateScript,
  setupBenchDatabase,
  UsageError,
} from './setup.js';
import { waitBench, waitMarkdown, type WaitResults } from './wait.js';
import { WORKLOADS, type Arm, type Workload } from './workloads.js';

const USAGE = `Usage: npm run bench -- [options]

  --quick               CI mode: clients 1 and 16, 3 rounds of 2 s, lease and bare arms only,
                        no profile (about 2-3 minutes)
  --check               exit 1 when a lease/bare ratio crosses its CI guard (see README)
  --major N             embedded PostgreSQL N (14-18; default 18)
  --pg-config PATH      a system build, by its pg_config
  --clients LIST        client counts (default 1,4,16)
  --rounds N            interleaved rounds per arm (default 3)
  --duration S          seconds per pgbench run (default 8)
  --wal-transactions N  transactions of the single-client WAL phase (default 1000)
  --workloads LIST      subset, e.g. W1-cycle,W3-renew (default all)
  --interleave MODE     transaction: all arms in one pgbench run, pgbench picking a script at
                        random per transaction; run: one pgbench run per arm, back to back,
                        order alternating per round; auto: transaction at 1 client, run at
                        more (default in full mode; quick mode defaults to transaction)
  --candidate FILE      also bench this install script, loaded by hand into its own schema
                        (repeatable); it runs as arm "candidate" (candidate1, 2... for several)
  --no-variants         skip the diagnostic arms (no SET clause / no SECURITY DEFINER)
  --no-profile          skip the profiling phase
  --fsync-test          record pg_test_fsync figures for the data dir (on in full mode)
  --out DIR             results folder (default bench/results/<timestamp>)
  --no-wait             skip the wait phase (wake and takeover latency, 100 waiters)
  --wait-only           run only the wait phase
  --wait-rounds N       rounds per wait measurement (default 100, 30 in quick mode)
  -h, --help            this text
`;

interface Options {
  quick: boolean;
  check: boolean;
  installation: InstallationRequest;
  clients: number[];
  rounds: number;
  duration: number;
  walTransactions: number;
  workloads: Workload[];
  interleave: Interleave | 'auto';
  candidates: string[];
  variants: boolean;
  profile: boolean;
  fsyncTest: boolean;
  out: string;
  wait: boolean;
  waitOnly: boolean;
  waitRounds: number;
}

function parseOptions(argv: string[]): Options {
  const { values } = parseArgs({
    args: argv,
    options: {
      quick: { type: 'boolean', default: false },
      check: { type: 'boolean', default: false },
      major: { type: 'string' },
      'pg-config': { type: 'string' },
      clients: { type: 'string' },
      rounds: { type: 'string' },
      duration: { type: 'string' },
      'wal-transactions': { type: 'string' },
      workloads: { type: 'string' },
      interleave: { type: 'string' },
      candidate: { type: 'string', multiple: true },
      'no-variants': { type: 'boolean', default: false },
      'no-profile': { type: 'boolean', default: false },
      'fsync-test': { type: 'boolean' },
      out: { type: 'string' },
      'no-wait': { type: 'boolean', default: false },
      'wait-only': { type: 'boolean', default: false },
      'wait-rounds': { type: 'string' },
      help: { type: 'boolean', short: 'h', default: false },
    },
    strict: true,
  });
  if (values.help) {
    process.stdout.write(USAGE);
    process.exit(0);
  }
  const positiveInt = (name: string, raw: string | undefined, fallback: number) => {
    if (raw === undefined) return fallback;
    const n = Number(raw);
    if (!Number.isInteger(n) || n <= 0)
      throw new UsageError(`--${name} must be a positive integer, got "${raw}"`);
    return n;
  };
  const quick = values.quick ?? false;
  const installation: InstallationRequest = {};
  if (values['pg-config']) installation.pgConfig = values['pg-config'];
  if (values.major) installation.major = positiveInt('major', values.major, 18);
  const clients = values.clients
    ? values.clients.split(',').map((c) => positiveInt('clients', c, 1))
    : quick
      ? [1, 16]
      : [1, 4, 16];
  let workloads = WORKLOADS;
  if (values.workloads) {
    const wanted = values.workloads.split(',');
    const unknown = wanted.filter((id) => !WORKLOADS.some((w) => w.id === id));
    if (unknown.length)
      throw new UsageError(
        `unknown workload(s) ${unknown.join(', ')}; known: ${WORKLOADS.map((w) => w.id).join(', ')}`,
      );
    workloads = WORKLOADS.filter((w) => wanted.includes(w.id));
  }
  const candidates = (values.candidate ?? []).map((file) => path.resolve(file));
  for (const file of candidates)
    if (!fs.existsSync(file)) throw new UsageError(`--candidate ${file}: no such file`);
  // Quick mode interleaves per transaction at every client count: short runs alternated
  // per arm are at the mercy of the shared machine, and the CI guard must not flap.
  const interleave = values.interleave ?? (quick ? 'transaction' : 'auto');
  if (interleave !== 'run' && interleave !== 'transaction' && interleave !== 'auto')
    throw new UsageError(`--interleave must be auto, run or transaction, got "${interleave}"`);
  const stamp = new Date().toISOString().replace(/[:]/g, '').replace(/\..*$/, 'Z');
  return {
    quick,
    check: values.check ?? false,
    installation,
    clients,
    rounds: positiveInt('rounds', values.rounds, 3),
    duration: positiveInt('duration', values.duration, quick ? 2 : 8),
    walTransactions: positiveInt(
      'wal-transactions',
      values['wal-transactions'],
      quick ? 300 : 1000,
    ),
    workloads,
    interleave,
    candidates,
    variants: !quick && !values['no-variants'],
    profile: !quick && !values['no-profile'],
    fsyncTest: values['fsync-test'] ?? !quick,
    out: path.resolve(
      values.out ?? path.join(PACKAGE_ROOT, 'bench', 'results', stamp + (quick ? '-quick' : '')),
    ),
    wait: !values['no-wait'],
    waitOnly: values['wait-only'] ?? false,
    waitRounds: positiveInt('wait-rounds', values['wait-rounds'], quick ? 30 : 100),
  };
}

function sha256File(file: string): string | undefined {
  try {
    return createHash('sha256').update(fs.readFileSync(file)).digest('hex');
  } catch {
    return undefined;
  }
}

/** Which arms run a workload: the script must exist; quick mode runs lease and bare only. */
function armsFor(workload: Workload, arms: Arm[], quick: boolean): Arm[] {
  return arms.filter(
    (arm) =>
      workload.scripts.includes(arm.script) &&
      (!quick || arm.id === 'lease' || arm.id === 'bare' || arm.role === 'candidate') &&
      // The variants explain per-call costs; the contention workload adds nothing to that.
      !(workload.id === 'W2-contend' && arm.role === 'diagnostic') &&
      // The trigger calls the shipped lease.fence, which knows nothing of another arm's table.
      !(workload.id === 'W4-fenced-trigger' && arm.role !== 'shipped' && arm.role !== 'baseline'),
  );
}

async function main(): Promise<number> {
  const started = Date.now();
  const options = parseOptions(process.argv.slice(2));
  const pgbench = findPgbench();
  const installation = findInstallation(options.installation);
  const command = `npm run bench -- ${process.argv.slice(2).join(' ')}`.trim();
  fs.mkdirSync(options.out, { recursive: true });
  const log = (line: string) =>
    process.stderr.write(`[bench ${new Date().toISOString().slice(11, 19)}] ${line}\n`);
  log(
    `PostgreSQL ${installation.version} (${installation.source}); ${pgbench.version}; results in ${options.out}`,
  );

  const candidateScripts = options.candidates.map(candidateScript);
  const arms = buildArms(options.variants, options.candidates);
  const maxClients = Math.max(...options.clients);
  const cluster = await PgCluster.start({ installation, settings: BENCH_SETTINGS });
  const records: RunRecord[] = [];
  const wal: WalRecord[] = [];
  let waitResults: WaitResults | undefined;
  let env;
  try {
    await setupBenchDatabase(cluster, arms, candidateScripts, maxClients);
    env = await recordEnvironment({
      cluster,
      pgbench,
      packageRoot: PACKAGE_ROOT,
      command,
      candidates: options.candidates,
      fsyncTest: options.fsyncTest,
    });
    const context: BenchContext = {
      cluster,
      pgbench,
      workloadsDir: path.join(PACKAGE_ROOT, 'bench', 'workloads'),
      resultsDir: options.out,
      log,
    };

    // Throughput/latency: every (round, clients, workload) runs all its arms together, either
    // back to back in alternating order or interleaved per transaction, so drift on the
    // shared machine hits lease and baseline alike.
    const total = options.waitOnly
      ? 0
      : options.rounds * options.clients.length * options.workloads.length;
    let done = 0;
    for (let round = 1; round <= (options.waitOnly ? 0 : options.rounds); round++) {
      for (const clients of options.clients) {
        for (const workload of options.workloads) {
          const workloadArms = armsFor(workload, arms, options.quick);
          const ordered = round % 2 ? workloadArms : [...workloadArms].reverse();
          const interleave =
            options.interleave === 'auto'
              ? clients === 1
                ? 'transaction'
                : 'run'
              : options.interleave;
          const batch = await throughputRound(
            context,
            workload,
            ordered,
            clients,
            options.duration,
            round,
            interleave,
          );
          records.push(...batch);
          const brief = batch
            .map(
              (r) =>
                `${r.arm} ${r.tps.toFixed(0)} tps p50 ${Object.values(r.ops)[0]!.p50Us.toFixed(0)} us`,
            )
            .join(', ');
          log(`[${++done}/${total}] round ${round} ${workload.id} c${clients}: ${brief}`);
        }
      }
    }

    // WAL per call: one client, fixed count, nothing else running.
    for (const workload of options.waitOnly ? [] : options.workloads) {
      for (const arm of armsFor(workload, arms, options.quick)) {
        const record = await walRun(context, workload, arm, options.walTransactions);
        wal.push(record);
        log(
          `WAL ${workload.id} ${arm.id}: ${record.perCall.records.toFixed(2)} records, ${record.perCall.bytes.toFixed(0)} bytes per call`,
        );
      }
    }

    // Waiting: wake and takeover latency, client wait beside the SQL wait (this build, 0.1.0).
    if (options.wait || options.waitOnly) {
      waitResults = await waitBench(cluster, {
        rounds: options.waitRounds,
        v010Script: path.join(PACKAGE_ROOT, 'extension', 'test', 'fixtures', 'pg_lease--0.1.0.sql'),
        log,
      });
      fs.writeFileSync(path.join(options.out, 'wait.json'), toJson(waitResults));
      fs.writeFileSync(path.join(options.out, 'wait.md'), waitMarkdown(waitResults, command));
    }
  } finally {
    await cluster.destroy();
  }
  if (options.waitOnly) {
    writeEnvironment(options.out, env!, toJson);
    if (waitResults) process.stdout.write(waitMarkdown(waitResults, command));
    return 0;
  }

  // The profile cluster stages extension/ anew: if the SQL changed meanwhile (people are
  // editing it), say so rather than mix two versions silently.
  const changed = env!.extensionScripts.filter(
    (script) => sha256File(path.join(PACKAGE_ROOT, script.file)) !== script.sha256,
  );
  if (changed.length) {
    const note = `${changed.map((c) => c.file).join(', ')} changed during the run: the profile phase ran a newer version than the throughput and WAL phases.`;
    env!.notes.push(note);
    log(`WARNING: ${note}`);
  }

  let profileResult;
  if (options.profile) {
    log('profiling on a second cluster (pg_stat_statements, auto_explain, server-side loops)');
    profileResult = await profile(
      installation,
      BENCH_SETTINGS,
      {
        pgbench,
        workloadsDir: path.join(PACKAGE_ROOT, 'bench', 'workloads'),
        resultsDir: options.out,
        log,
      },
      options.walTransactions,
      candidateScripts,
    );
  }

  const { cells, ratios } = aggregate(records);
  const carrying = arms
    .filter((a) => a.role === 'shipped' || a.role === 'candidate' || a.role === 'diagnostic')
    .map((a) => a.id);
  const summary: Summary = {
    mode: options.quick ? 'quick' : 'full',
    settings: {
      clients: options.clients,
      rounds: options.rounds,
      durationSeconds: options.duration,
      walTransactions: options.walTransactions,
      interleave: options.interleave,
    },
    arms,
    cells,
    ratios,
    wal,
    verdicts: evaluate(ratios, wal, carrying, options.clients),
    hot: hotRatios(records),
    grants: grantRates(records),
    runs: records,
    elapsedSeconds: (Date.now() - started) / 1000,
  };
  if (profileResult) summary.profile = profileResult;
  const folder = path.relative(PACKAGE_ROOT, options.out);
  writeEnvironment(options.out, env!, toJson);
  fs.writeFileSync(path.join(options.out, 'summary.json'), toJson(summary));
  writeCharts(summary, path.join(options.out, 'charts'));
  let markdown = summaryMarkdown(summary, env!, folder);
  if (waitResults) markdown += `\n${waitMarkdown(waitResults, command)}`;
  fs.writeFileSync(path.join(options.out, 'summary.md'), markdown);
  process.stdout.write(markdown.slice(0, markdown.indexOf('## Latency and throughput')));
  if (waitResults) process.stdout.write(waitMarkdown(waitResults, command));
  log(`done in ${Math.round(summary.elapsedSeconds)} s: ${folder}/summary.md`);

  if (options.check) {
    const failures = summary.verdicts.filter((v) => v.arm === 'lease' && !v.ciPassed);
    if (failures.length) {
      for (const f of failures)
        log(
          `CHECK FAILED ${f.target} (${f.description}) at ${f.clients ?? 1} client(s): ${f.value.toFixed(3)} vs CI guard ${f.ciLimit}`,
        );
      return 1;
    }
    log(
      `check passed: ${summary.verdicts.filter((v) => v.arm === 'lease').length} lease ratios inside their CI guards`,
    );
  }
  return 0;
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    if (error instanceof PgbenchMissingError || error instanceof UsageError) {
      process.stderr.write(`bench: ${error.message}\n`);
      if (error instanceof UsageError) process.stderr.write(USAGE);
      process.exit(2);
    }
    process.stderr.write(
      `bench: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`,
    );
    process.exit(1);
  },
);
