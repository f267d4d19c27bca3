/**
 * Locating and driving the pgbench client: one run = one pgbench process against one database
 * with one script, its per-transaction log split back into the operations the script performs.
 */
import { execFileSync, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as zlib from 'node:zlib';

/** A usable pgbench binary. */
export interface Pgbench {
  path: string;
  /** `pgbench --version` output, e.g. `pgbench (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)`. */
  version: string;
  major: number;
}

/** Raised when no usable pgbench exists; its message says how to get one. */
export class PgbenchMissingError extends Error {
  override name = 'PgbenchMissingError';
}

const MIN_PGBENCH_MAJOR = 12; // \gset, \if and -D with per-client state, prepared mode

/**
 * Finds pgbench: `$PGBENCH`, then `pgbench` on PATH, then Debian's versioned client dirs.
 * The embedded npm server builds ship no pgbench, so a system client is required.
 */
export function findPgbench(): Pgbench {
  const candidates: string[] = [];
  if (process.env.PGBENCH) candidates.push(process.env.PGBENCH);
  candidates.push('pgbench');
  try {
    for (const dir of fs.readdirSync('/usr/lib/postgresql').sort().reverse())
      candidates.push(path.join('/usr/lib/postgresql', dir, 'bin', 'pgbench'));
  } catch {
    // not a Debian-style layout
  }
  for (const candidate of candidates) {
    let version: string;
    try {
      version = execFileSync(candidate, ['--version'], {
        encoding: 'utf8',
        stdio: ['ignore', 'pipe', 'pipe'],
      }).trim();
    } catch {
      continue;
    }
    const major = Number(/\(PostgreSQL\) (\d+)/.exec(version)?.[1] ?? 0);
    if (major >= MIN_PGBENCH_MAJOR) return { path: candidate, version, major };
  }
  throw new PgbenchMissingError(
    'pgbench (PostgreSQL 12 or later) was not found. The embedded server builds in node_modules ' +
      'ship no pgbench; install the PostgreSQL client tools, e.g. on Debian/Ubuntu ' +
      '"apt-get install postgresql-client" (provides /usr/bin/pgbench), or set PGBENCH=/path/to/pgbench.',
  );
}

/** Where and how to connect; the bench uses the cluster's private Unix socket. */
export interface Target {
  socketDir: string;
  port: number;
  user: string;
  database: string;
}

export interface PgbenchRunOptions {
  target: Target;
  /** One script, or several interleaved at random per transaction (equal weights). */
  scriptFile: string | string[];
  clients: number;
  /** Run for this many seconds (`-T`), or ... */
  durationSeconds?: number;
  /** ... exactly this many transactions per client (`-t`). */
  transactions?: number;
  defines?: Record<string, string | number>;
  /** Prefix for `-l` per-transaction logs; omit for no log. */
  logPrefix?: string;
  /** Extra server options for the sessions (`PGOPTIONS`). */
  pgOptions?: string;
  /** Extra pgbench arguments, e.g. `-r` for per-statement latencies. */
  extraArgs?: string[];
}

export interface PgbenchResult {
  tps: number;
  processed: number;
  failed: number;
  stdout: string;
  /** Log files pgbench wrote (one per thread). */
  logFiles: string[];
}

/** Runs pgbench and fails loudly on any aborted client: a bench number from a broken run is worse than none. */
export async function runPgbench(
  pgbench: Pgbench,
  options: PgbenchRunOptions,
): Promise<PgbenchResult> {
  // One thread per client: a pgbench thread serving several connections stamps transaction
  // start and end with a clock reading it reuses within one pass of its event loop, so calls
  // much shorter than a pass log as 0 us. The threads sleep in poll(); the cost is small
  // and the same for every arm.
  const threads = options.clients;
  const args = [
    '-h',
    options.target.socketDir,
    '-p',
    String(options.target.port),
    '-U',
    options.target.user,
    '-n',
    '-M',
    'prepared',
    '-c',
    String(options.clients),
    '-j',
    String(threads),
  ];
  const scripts = Array.isArray(options.scriptFile) ? options.scriptFile : [options.scriptFile];
  for (const script of scripts) args.push('-f', scripts.length > 1 ? `${script}@1` : script);
  if (options.transactions !== undefined) args.push('-t', String(options.transactions));
  else args.push('-T', String(options.durationSeconds ?? 10));
  for (const [name, value] of Object.entries(options.defines ?? {}))
    args.push('-D', `${name}=${value}`);
  if (options.logPrefix) args.push('-l', `--log-prefix=${options.logPrefix}`);
  args.push(...(options.extraArgs ?? []));
  args.push(options.target.database);

  const env = { ...process.env };
  if (options.pgOptions) env.PGOPTIONS = options.pgOptions;
  else delete env.PGOPTIONS;
  const child = spawn(pgbench.path, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (chunk: string) => (stdout += chunk));
  child.stderr.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
  const code = await new Promise<number | null>((resolve) => child.once('close', resolve));
  if (code !== 0) {
    throw new Error(
      `pgbench failed (exit ${code}) running ${scripts.map((f) => path.basename(f)).join(', ')} with ` +
        `${options.clients} client(s):\n${stderr.trim()}\n${stdout.trim()}`,
    );
  }
  const tps = Number(/tps = ([\d.]+) \(without initial connection time\)/.exec(stdout)?.[1]);
  const processed = Number(/number of transactions actually processed: (\d+)/.exec(stdout)?.[1]);
  const failed = Number(/number of failed transactions: (\d+)/.exec(stdout)?.[1] ?? 0);
  let logFiles: string[] = [];
  if (options.logPrefix) {
    const dir = path.dirname(options.logPrefix);
    const base = path.basename(options.logPrefix) + '.';
    logFiles = fs
      .readdirSync(dir)
      .filter((name) => name.startsWith(base))
      .map((name) => path.join(dir, name));
  }
  return { tps, processed, failed, stdout: stdout + stderr, logFiles };
}

/** One line of a pgbench `-l` log. */
export interface LoggedTransaction {
  client: number;
  /** pgbench's per-client transaction counter. */
  transaction: number;
  latencyUs: number;
  /** Index of the `-f` script the transaction ran (several scripts share a run when interleaved). */
  script: number;
}

/** Reads pgbench `-l` logs: `client_id transaction_no time script_no time_epoch time_us [...]`. */
export function readLogs(files: string[]): LoggedTransaction[] {
  const rows: LoggedTransaction[] = [];
  for (const file of files) {
    for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
      if (!line) continue;
      const fields = line.split(' ');
      const latency = fields[2]!;
      if (latency === 'skipped' || latency === 'failed') continue;
      rows.push({
        client: Number(fields[0]),
        transaction: Number(fields[1]),
        latencyUs: Number(latency),
        script: Number(fields[3]),
      });
    }
  }
  return rows;
}

/**
 * Position of each transaction in its client's sequence of the same script (0 = the first),
 * which scripts that alternate two operations (acquire, then release, ...) are split by.
 * Counting per script keeps this right when several scripts are interleaved in one run.
 */
export function withPositions(
  rows: LoggedTransaction[],
): (LoggedTransaction & { position: number })[] {
  const sorted = [...rows].sort(
    (a, b) => a.client - b.client || a.script - b.script || a.transaction - b.transaction,
  );
  const next = new Map<string, number>();
  return sorted.map((row) => {
    const key = `${row.client}/${row.script}`;
    const position = next.get(key) ?? 0;
    next.set(key, position + 1);
    return { ...row, position };
  });
}

/**
 * Keeps a raw log small enough to commit: every k-th line so that at most `maxLines` remain,
 * gzipped, with a header saying what was dropped. Percentiles are computed from the full
 * logs before this runs.
 */
export function archiveLogs(files: string[], destination: string, maxLines = 2000): void {
  const lines: string[] = [];
  for (const file of files) {
    for (const line of fs.readFileSync(file, 'utf8').split('\n')) if (line) lines.push(line);
  }
  const step = Math.max(1, Math.ceil(lines.length / maxLines));
  const kept = lines.filter((_, index) => index % step === 0);
  const header =
    `# pgbench -l log (client_id transaction_no time_us script_no epoch_s epoch_us); ` +
    `${lines.length} transactions, every ${step}. kept (${kept.length} lines)\n`;
  fs.writeFileSync(destination, zlib.gzipSync(header + kept.join('\n') + '\n', { level: 9 }));
  for (const file of files) fs.rmSync(file, { force: true });
}
