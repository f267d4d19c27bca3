/**
 * `npm run test:matrix`: the suites whose outcome depends on the server build (SERVER_SUITES:
 * the extension's own, its failure model and failover) on every supported major (from its npm
 * binaries package) and on the system PostgreSQL when `pg_config` is on PATH, then a version x
 * suite table. Exits non-zero when any run fails. docs/COMPATIBILITY.md says why the other
 * suites run on the default major alone.
 *
 * Usage: node dist/scripts/matrix.js [--record] [--majors 14,15] [--skip-default] [--all-suites]
 *   --record        rewrites the results table in docs/COMPATIBILITY.md
 *   --skip-default  leaves out the embedded default major, for a caller (CI) whose `npm test`
 *                   has just run the whole suite on it
 *   --all-suites    every suite but test/citus (whose cluster is the Citus build's own
 *                   PostgreSQL whatever the column) on every column
 *   --jobs N        columns run at once (default 3)
 * A column that runs longer than PG_LEASE_MATRIX_COLUMN_MINUTES (default 20) is killed and
 * fails, with the tail of its log.
 */
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { parseArgs } from 'node:util';
import {
  DEFAULT_MAJOR,
  PACKAGE_ROOT,
  SUPPORTED_MAJORS,
  findInstallation,
  findSystemPgConfig,
} from 'pg-lease-testing';
import type { SuiteCounts } from './summary-reporter.js';

/** The suites that exercise the server build: what each column runs unless --all-suites. */
const SERVER_SUITES = ['extension', 'failure', 'failover'];

interface Target {
  label: string;
  env: Record<string, string>;
}

interface Outcome {
  target: Target;
  version: string;
  exitCode: number;
  suites: Record<string, SuiteCounts>;
  seconds: number;
  log: string;
}

const { values } = parseArgs({
  options: {
    record: { type: 'boolean', default: false },
    majors: { type: 'string' },
    'skip-default': { type: 'boolean', default: false },
    'all-suites': { type: 'boolean', default: false },
    jobs: { type: 'string', default: '3' },
  },
});

const majors = (
  values.majors ? values.majors.split(',').map(Number) : [...SUPPORTED_MAJORS]
).filter((major) => !(values['skip-default'] && major === DEFAULT_MAJOR));
const targets: Target[] = majors.map((major) => ({
  label: `embedded ${major}`,
  env: { PG_LEASE_PG_MAJOR: String(major) },
}));
const systemPgConfig = findSystemPgConfig();
if (systemPgConfig && !values.majors) {
  const system = findInstallation({ pgConfig: systemPgConfig });
  targets.push({ label: `system ${system.major}`, env: { PG_LEASE_PG_CONFIG: systemPgConfig } });
}

const jobs = Number(values.jobs);
if (!Number.isInteger(jobs) || jobs < 1)
  throw new Error(`--jobs must be a positive integer, got ${values.jobs}`);
const workDir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-lease-matrix-'));
const columnMs = Number(process.env.PG_LEASE_MATRIX_COLUMN_MINUTES ?? 20) * 60_000;

async function run(target: Target): Promise<Outcome> {
  const summaryFile = path.join(workDir, `${target.label.replace(/\W+/g, '-')}.json`);
  const logFile = summaryFile.replace(/\.json$/, '.log');
  const log = fs.openSync(logFile, 'w');
  const started = Date.now();
  const exitCode = await new Promise<number>((resolve) => {
    const child = spawn(
      process.execPath,
      [
        path.join(PACKAGE_ROOT, 'dist', 'scripts', 'test.js'),
        ...(values['all-suites']
          ? ['--leave-out', 'citus']
          : ['--suites', SERVER_SUITES.join(',')]),
      ],
      {
        stdio: ['ignore', log, log],
        env: { ...process.env, ...target.env, PG_LEASE_TEST_SUMMARY: summaryFile },
        detached: true,
      },
    );
    const watchdog = setTimeout(() => {
      fs.writeSync(log, `\nmatrix: column still running after ${columnMs / 60_000} min, killed\n`);
      if (child.pid !== undefined) process.kill(-child.pid, 'SIGKILL');
    }, columnMs);
    child.once('exit', (code) => {
      clearTimeout(watchdog);
      resolve(code ?? 1);
    });
    child.once('error', () => {
      clearTimeout(watchdog);
      resolve(1);
    });
  });
  fs.closeSync(log);
  let version = '?';
  let suites: Record<string, SuiteCounts> = {};
  if (fs.existsSync(summaryFile)) {
    ({ version, suites } = JSON.parse(fs.readFileSync(summaryFile, 'utf8')) as {
      version: string;
      suites: Record<string, SuiteCounts>;
    });
  }
  return {
    target,
    version,
    exitCode,
    suites,
    seconds: (Date.now() - started) / 1000,
    log: logFile,
  };
}

function cell(counts: SuiteCounts | undefined): string {
  if (!counts) return '-';
  const total = counts.passed + counts.failed + counts.skipped;
  const mark = counts.failed > 0 ? 'FAIL' : counts.skipped > 0 ? 'pass*' : 'pass';
  return `${mark} ${counts.passed}/${total}`;
}

function table(outcomes: Outcome[]): string {
  const suiteNames = [...new Set(outcomes.flatMap((o) => Object.keys(o.suites)))].sort();
  const header = ['build', 'server', ...suiteNames, 'result', 'time'];
  const rows = outcomes.map((o) => [
    o.target.label,
    o.version,
    ...suiteNames.map((name) => cell(o.suites[name])),
    o.exitCode === 0 ? 'PASS' : 'FAIL',
    `${Math.round(o.seconds)} s`,
  ]);
  return [header, header.map(() => '---'), ...rows].map((r) => `| ${r.join(' | ')} |`).join('\n');
}

// Columns run `jobs` at a time: a column mostly waits on its servers (ttls, lock waits,
// restarts), using well under a core, so on 2 cores three at once take little more than one.
const outcomes: Outcome[] = new Array<Outcome>(targets.length);
let nextTarget = 0;
async function worker(): Promise<void> {
  while (nextTarget < targets.length) {
    const index = nextTarget++;
    const target = targets[index]!;
    console.log(`matrix: ${target.label} started`);
    const outcome = await run(target);
    outcomes[index] = outcome;
    console.log(
      `matrix: ${target.label} ${outcome.exitCode === 0 ? 'pass' : 'FAIL'} (PostgreSQL ${outcome.version}, ${Math.round(outcome.seconds)} s)`,
    );
    if (outcome.exitCode !== 0) {
      console.log(fs.readFileSync(outcome.log, 'utf8').split('\n').slice(-80).join('\n'));
    }
  }
}
await Promise.all(Array.from({ length: Math.min(jobs, targets.length) }, worker));

const result = table(outcomes);
console.log(`\n${result}\n`);
if (values.record) {
  const file = path.join(PACKAGE_ROOT, 'docs', 'COMPATIBILITY.md');
  const text = fs.readFileSync(file, 'utf8');
  const stamp = `Recorded ${new Date().toISOString().slice(0, 10)} on ${os.type()} ${os.arch()}, Node.js ${process.version}, by \`npm run test:matrix -- --record\`.`;
  const updated = text.replace(
    /<!-- matrix:start -->[\s\S]*<!-- matrix:end -->/,
    `<!-- matrix:start -->\n${stamp}\n\n${result}\n<!-- matrix:end -->`,
  );
  fs.writeFileSync(file, updated);
  console.log(`recorded in ${path.relative(process.cwd(), file)}`);
}
fs.rmSync(workDir, { recursive: true, force: true });
const failed = outcomes.filter((o) => o.exitCode !== 0);
console.log(`matrix: ${outcomes.length - failed.length} passed, ${failed.length} failed`);
process.exit(failed.length > 0 ? 1 : 0);
