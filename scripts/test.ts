/**
 * `npm test`: every TypeScript suite under test/ against real throwaway PostgreSQL servers.
 *
 * One shared cluster serves the suites that only need a database (each test file creates its
 * own database in it); suites that crash or restart servers start clusters of their own. The
 * server build comes from the environment (PG_LEASE_PG_MAJOR, PG_LEASE_PG_CONFIG, ...), which
 * is how the matrix runs the same suites on every version.
 *
 * Usage: node dist/scripts/test.js [--suites DIR,DIR] [--leave-out DIR]... [test files...]
 *   --suites DIR,...  without files: only the suites under test/DIR (the matrix runs the ones
 *                     whose outcome depends on the server build)
 *   --leave-out DIR   without files: every suite but those under test/DIR
 * Env: PG_LEASE_TEST_SUMMARY=file writes per-suite counts and per-file seconds as JSON;
 * PG_LEASE_NO_SKIP=1 (set by .ci/run) fails the run when any test was skipped, since in CI a
 * skip means a missing tool; PG_LEASE_TEST_CONCURRENCY sets how many files run at once.
 * A test (or test file) that runs longer than TEST_TIMEOUT_MS fails rather than hanging the run.
 * The closing lines name the slowest files, so a file that grows is seen at once.
 */
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { PgCluster } from 'pg-lease-testing';
import type { Summary } from './summary-reporter.js';

const TEST_TIMEOUT_MS = 300_000;
const SLOWEST_SHOWN = 8;
/**
 * Test files run at once. Most of a file's time is spent waiting on its servers (ttls, lock
 * waits, restarts), so four files keep two cores busy without starving any: on 2 cores the
 * whole suite took 183 s at four against 275 s at two.
 */
const FILES_AT_ONCE = 4;

const distRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

function findTestFiles(dir: string): string[] {
  return fs
    .readdirSync(dir, { withFileTypes: true })
    .flatMap((entry) => {
      const full = path.join(dir, entry.name);
      if (entry.isDirectory()) return findTestFiles(full);
      return entry.name.endsWith('.test.js') ? [full] : [];
    })
    .sort();
}

async function main(): Promise<number> {
  const { values, positionals } = parseArgs({
    options: {
      suites: { type: 'string' },
      'leave-out': { type: 'string', multiple: true },
    },
    allowPositionals: true,
  });
  const requested = positionals.map((file) => path.resolve(file));
  const testRoot = path.join(distRoot, 'test');
  const under = (dirs: string[]) => dirs.map((dir) => path.join(testRoot, dir) + path.sep);
  const only = values.suites ? under(values.suites.split(',')) : undefined;
  const leftOut = under(values['leave-out'] ?? []);
  const files =
    requested.length > 0
      ? requested
      : findTestFiles(testRoot).filter(
          (file) =>
            (!only || only.some((dir) => file.startsWith(dir))) &&
            !leftOut.some((dir) => file.startsWith(dir)),
        );
  if (files.length === 0) throw new Error('no test files found under dist/test');

  const cluster = await PgCluster.start();
  const summaryFile = path.join(
    fs.mkdtempSync(path.join(os.tmpdir(), 'pg-lease-summary-')),
    'summary.json',
  );
  try {
    const version = cluster.installation.version;
    console.log(
      `pg-lease tests on PostgreSQL ${version} (${cluster.installation.source}), ${files.length} files`,
    );
    const exitCode = await new Promise<number>((resolve, reject) => {
      const child = spawn(
        process.execPath,
        [
          '--test',
          `--test-concurrency=${process.env.PG_LEASE_TEST_CONCURRENCY ?? FILES_AT_ONCE}`,
          `--test-timeout=${TEST_TIMEOUT_MS}`,
          '--test-reporter=spec',
          '--test-reporter-destination=stdout',
          `--test-reporter=${path.join(distRoot, 'scripts', 'summary-reporter.js')}`,
          `--test-reporter-destination=${summaryFile}`,
          ...files,
        ],
        { stdio: 'inherit', env: { ...process.env, PG_LEASE_TEST_URL: cluster.url() } },
      );
      child.once('error', reject);
      child.once('exit', (code, signal) => resolve(code ?? (signal ? 1 : 0)));
    });

    const { suites, fileSeconds } = JSON.parse(fs.readFileSync(summaryFile, 'utf8')) as Summary;
    if (process.env.PG_LEASE_TEST_SUMMARY) {
      fs.writeFileSync(
        process.env.PG_LEASE_TEST_SUMMARY,
        JSON.stringify({ version, suites, fileSeconds }, null, 2),
      );
    }
    const slowest = Object.entries(fileSeconds)
      .sort(([, a], [, b]) => b - a)
      .slice(0, SLOWEST_SHOWN);
    console.log('\nslowest files (seconds of their top-level tests):');
    for (const [file, seconds] of slowest) {
      console.log(`${seconds.toFixed(1).padStart(8)}  ${path.relative(testRoot, file)}`);
    }
    const total = { passed: 0, failed: 0, skipped: 0 };
    for (const counts of Object.values(suites)) {
      total.passed += counts.passed;
      total.failed += counts.failed;
      total.skipped += counts.skipped;
    }
    console.log(
      `\ntests: ${total.passed} passed, ${total.failed} failed, ${total.skipped} skipped`,
    );
    if (total.skipped > 0 && process.env.PG_LEASE_NO_SKIP === '1') {
      console.log('tests: skipped tests fail this run (PG_LEASE_NO_SKIP=1)');
      return 1;
    }
    return exitCode !== 0 || total.failed > 0 || total.passed === 0 ? 1 : 0;
  } finally {
    await cluster.destroy();
    fs.rmSync(path.dirname(summaryFile), { recursive: true, force: true });
  }
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    console.error(error);
    process.exit(1);
  },
);
