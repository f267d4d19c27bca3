/**
 * Throwaway PostgreSQL clusters for tests, after PostgreSQL::Test::Cluster: `initdb` into a
 * private temp dir, start on a reserved loopback port with a private socket dir, change
 * settings with `appendConf` + `reload`/`restart`, `pollQueryUntil`, crash or restart on
 * demand, and always clean up, except what a failed run leaves for inspection.
 *
 * Clean-up does not depend on the test process behaving: every cluster gets a small watchdog
 * process that outlives a killed parent, stops the server and removes the files (unless the
 * run failed and they are kept; see {@link PgCluster.destroy}).
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import {
  findInstallation,
  stageInstallation,
  type InstallationRequest,
  type PgInstallation,
} from './installation.js';
import { reservePort, type PortReservation } from './ports.js';

/** Options for {@link PgCluster.start}. */
export interface ClusterOptions {
  /** Which server build to use; defaults to the environment's choice (see `findInstallation`). */
  installation?: PgInstallation | InstallationRequest;
  /**
   * Server settings passed as `-c name=value`. The harness defaults favour fast tests
   * (`fsync=off`); pass `{ fsync: 'on' }` when the test is about durability on real disks.
   */
  settings?: Record<string, string | number | boolean>;
  /**
   * Unix user that runs the server when the harness runs as root, which PostgreSQL refuses.
   * Default: `PG_LEASE_RUN_AS` or `nobody`.
   */
  runAs?: string;
  /**
   * More files for the server's extension dir besides pg_lease's own, e.g. a released install
   * script that the package no longer ships, to test updates from it.
   */
  extraExtensionFiles?: readonly string[];
  /**
   * Fills the data directory instead of `initdb` (a base backup, for a standby: see
   * `startStandby` in `standby.ts`). Called once, before the first start, with the
   * private dirs made; `dataDir` does not exist yet.
   */
  populate?: (cluster: PgCluster) => void | Promise<void>;
}

/** Stop modes, as in `pg_ctl stop -m`: `fast` rolls back sessions and checkpoints, `immediate` does neither. */
export type StopMode = 'fast' | 'immediate';

/** A setting value as `appendConf` and `ClusterOptions.settings` take it. */
export type SettingValue = string | number | boolean;

/** Options of {@link PgCluster.pollQueryUntil}. */
export interface PollOptions {
  /** Database to run the query in (default `postgres`). */
  database?: string;
  /** Give up after this long (default 180 s, as PostgreSQL::Test::Cluster). */
  timeoutMs?: number;
}

/**
 * What {@link PgCluster.destroy} does with a cluster's files, from `PG_LEASE_KEEP`:
 * `failed` (default) removes them when the process exits with status 0 and keeps them, naming
 * them on stderr, when it exits otherwise (a failed test file); `always` keeps them; `never`
 * removes them at once.
 */
export type KeepPolicy = 'failed' | 'always' | 'never';

function keepPolicy(): KeepPolicy {
  const value = process.env.PG_LEASE_KEEP ?? 'failed';
  if (value === 'failed' || value === 'always' || value === 'never') return value;
  throw new Error(
    `pg-lease-testing: PG_LEASE_KEEP must be failed, always or never, got "${value}"`,
  );
}

const SUPERUSER = 'postgres';
/** A file in a cluster's base dir that tells the watchdog and the exit hook to keep it. */
const KEEP_MARKER = 'KEPT';
const HOST = '127.0.0.1';
const START_TIMEOUT_MS = 60_000;
const STOP_TIMEOUT_MS = 60_000;

const DEFAULT_SETTINGS: Record<string, string> = {
  fsync: 'off',
  full_page_writes: 'off',
  max_connections: '200',
  shared_buffers: '32MB',
  log_min_messages: 'warning',
  log_statement: 'none',
  timezone: 'UTC',
};

const live = new Set<PgCluster>();
/** Destroyed clusters whose files wait for the exit status to decide (policy `failed`). */
const pendingRemoval = new Set<PgCluster>();
let exitHookInstalled = false;

/**
 * A PostgreSQL cluster owned by this process.
 *
 * @example
 * await using cluster = await PgCluster.start({ installation: { major: 16 } });
 * const url = await cluster.createDatabase('orders_test'); // pg_lease installed in it
 * await cluster.crash();    // kill -9 of the postmaster and its backends
 * await cluster.start();    // recovery on the same data dir and port
 */
export class PgCluster implements AsyncDisposable {
  /** The staged build the server runs from (pg_lease's files included). */
  readonly installation: PgInstallation;
  /** Loopback address the server listens on. */
  readonly host = HOST;
  /** Superuser role created by `initdb`. */
  readonly superuser = SUPERUSER;
  /** Private folder holding `data/`, `socket/` and `server.log`. */
  readonly baseDir: string;
  readonly dataDir: string;
  readonly socketDir: string;
  readonly logFile: string;

  #port = 0;
  #reservation: PortReservation | undefined;
  #settings: Record<string, string>;
  #owner: { uid: number; gid: number } | undefined;
  #server: ChildProcess | undefined;
  #exited: Promise<void> = Promise.resolve();
  #watchdog: ChildProcess | undefined;
  #databaseCount = 0;
  #destroyed = false;

  private constructor(
    installation: PgInstallation,
    settings: Record<string, string>,
    runAs: string | undefined,
  ) {
    this.installation = installation;
    this.#settings = settings;
    this.#owner = runAs ? lookupUser(runAs) : undefined;
    this.baseDir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-lease-cluster-'));
    this.dataDir = path.join(this.baseDir, 'data');
    this.socketDir = path.join(this.baseDir, 'socket');
    this.logFile = path.join(this.baseDir, 'server.log');
  }

  /** Creates and starts a new cluster. Linux only (see the package README). */
  static async start(options: ClusterOptions = {}): Promise<PgCluster> {
    if (process.platform !== 'linux')
      throw new Error(
        `pg-lease-testing runs on Linux only (it finds server processes in /proc); this is ${process.platform}`,
      );
    const requested = options.installation ?? {};
    const installation = stageInstallation(
      'versionString' in requested ? requested : findInstallation(requested),
      options.extraExtensionFiles,
    );
    const settings = { ...DEFAULT_SETTINGS };
    for (const [name, value] of Object.entries(options.settings ?? {}))
      settings[name] = String(value);
    const runAs =
      process.getuid?.() === 0
        ? (options.runAs ?? process.env.PG_LEASE_RUN_AS ?? 'nobody')
        : undefined;

    const cluster = new PgCluster(installation, settings, runAs);
    live.add(cluster);
    installExitHook();
    try {
      cluster.#makeDirs();
      if (options.populate) await options.populate(cluster);
      else cluster.#initdb();
      cluster.#reservation = await reservePort(HOST);
      cluster.#port = cluster.#reservation.port;
      cluster.#startWatchdog();
      await cluster.start();
    } catch (error) {
      await cluster.destroy();
      throw error;
    }
    return cluster;
  }

  /** TCP port the server listens on (stable across restarts). */
  get port(): number {
    return this.#port;
  }

  /** Process id of the running postmaster, or undefined when stopped. */
  get pid(): number | undefined {
    return this.#server?.exitCode === null && this.#server.signalCode === null
      ? this.#server.pid
      : undefined;
  }

  /**
   * The Unix account the server runs as (`nobody` or `runAs` when the harness runs as root),
   * for other server programs on the same data directory; undefined when it is this process's.
   */
  get serverAccount(): { uid: number; gid: number } | undefined {
    return this.#owner;
  }

  /** The `-c` settings the server starts with (harness defaults plus the options'). */
  get settings(): Readonly<Record<string, string>> {
    return { ...this.#settings };
  }

  /** Whether the postmaster is running. */
  get running(): boolean {
    return this.pid !== undefined;
  }

  /** Connection string for a database of this cluster. */
  url(database = 'postgres', user = SUPERUSER): string {
    return `postgresql://${encodeURIComponent(user)}@${HOST}:${this.#port}/${encodeURIComponent(database)}`;
  }

  /**
   * Creates a database (named uniquely when no name is given) and, unless told otherwise,
   * installs pg_lease in it. Returns its connection string.
   */
  async createDatabase(name?: string, options: { extension?: boolean } = {}): Promise<string> {
    const database = name ?? `test_${process.pid}_${++this.#databaseCount}`;
    await this.query(`CREATE DATABASE ${pg.escapeIdentifier(database)}`);
    if (options.extension ?? true) await this.query('CREATE EXTENSION pg_lease', [], database);
    return this.url(database);
  }

  /** Runs one statement as the superuser on a short-lived connection. */
  async query<R extends pg.QueryResultRow = pg.QueryResultRow>(
    text: string,
    values: unknown[] = [],
    database = 'postgres',
  ): Promise<pg.QueryResult<R>> {
    const client = new pg.Client({ connectionString: this.url(database) });
    await client.connect();
    try {
      return await client.query<R>(text, values);
    } finally {
      await client.end();
    }
  }

  /** Starts the server on the existing data dir (after {@link stop} or {@link crash}). */
  async start(): Promise<void> {
    if (this.#destroyed) throw new Error('pg-lease-testing: cluster was destroyed');
    if (this.running) return;
    if (this.#port === 0) {
      this.#reservation = await reservePort(HOST);
      this.#port = this.#reservation.port;
    }
    // Only what must never change is on the command line (it would override the file); the
    // settings live in postgresql.conf, where appendConf can change them.
    const args = [
      '-D',
      this.dataDir,
      '-p',
      String(this.#port),
      '-k',
      this.socketDir,
      '-c',
      `listen_addresses=${HOST}`,
    ];

    const log = fs.openSync(this.logFile, 'a');
    const server = spawn(path.join(this.installation.bindir, 'postgres'), args, {
      stdio: ['ignore', log, log],
      ...this.#owner,
    });
    fs.closeSync(log);
    this.#server = server;
    this.#exited = new Promise((resolve) => server.once('exit', () => resolve()));
    server.once('error', () => undefined);

    const deadline = Date.now() + START_TIMEOUT_MS;
    for (;;) {
      if (!this.running)
        throw new Error(`pg-lease-testing: server failed to start\n${this.logTail()}`);
      if (await this.#accepting()) return;
      if (Date.now() > deadline) {
        await this.stop('immediate');
        throw new Error(
          `pg-lease-testing: server not ready after ${START_TIMEOUT_MS} ms\n${this.logTail()}`,
        );
      }
      await sleep(50);
    }
  }

  /** Stops the server: `fast` is a clean shutdown, `immediate` skips the shutdown checkpoint. */
  async stop(mode: StopMode = 'fast'): Promise<void> {
    const server = this.#server;
    if (!this.running || !server) return;
    server.kill(mode === 'fast' ? 'SIGINT' : 'SIGQUIT');
    if (!(await settlesWithin(this.#exited, STOP_TIMEOUT_MS))) {
      server.kill('SIGKILL');
      await this.#exited;
    }
    await this.#waitForBackendsToExit();
  }

  /**
   * Simulates a crash: `kill -9` of the postmaster and of every backend it had, so nothing gets
   * to flush or clean up. The next {@link start} runs crash recovery.
   */
  async crash(): Promise<void> {
    const pid = this.pid;
    if (pid === undefined) return;
    const backends = childPids(pid);
    process.kill(pid, 'SIGKILL');
    for (const child of backends) tryKill(child, 'SIGKILL');
    await this.#exited;
    await this.#waitForBackendsToExit();
  }

  /** Stops (fast) and starts again on the same data dir and port, with the settings of postgresql.conf. */
  async restart(): Promise<void> {
    await this.stop('fast');
    await this.start();
  }

  /**
   * Appends settings to the cluster's postgresql.conf, as PostgreSQL::Test::Cluster's
   * `append_conf`; later lines win. They take effect with {@link reload} (for settings a
   * reload can change) or {@link restart}.
   *
   * @example
   * cluster.appendConf({ log_min_duration_statement: 0, 'lease.custom': 'x' });
   * await cluster.reload();
   * cluster.appendConf({ max_connections: 300 });
   * await cluster.restart();
   */
  appendConf(settings: Record<string, SettingValue> | string): void {
    const lines =
      typeof settings === 'string'
        ? settings
        : Object.entries(settings)
            .map(([name, value]) => `${name} = ${quoteSetting(value)}`)
            .join('\n');
    if (typeof settings !== 'string')
      for (const [name, value] of Object.entries(settings)) this.#settings[name] = String(value);
    fs.appendFileSync(path.join(this.dataDir, 'postgresql.conf'), `${lines}\n`);
  }

  /**
   * Makes the running server re-read its configuration (SIGHUP, as `pg_ctl reload`) and
   * resolves once it has: when `pg_conf_load_time()` has moved.
   */
  async reload(): Promise<void> {
    const pid = this.pid;
    if (pid === undefined) throw new Error('pg-lease-testing: reload of a stopped cluster');
    const loaded = async () =>
      (await this.query<{ t: string }>('SELECT pg_conf_load_time()::text AS t')).rows[0]!.t;
    const before = await loaded();
    process.kill(pid, 'SIGHUP');
    const deadline = Date.now() + START_TIMEOUT_MS;
    while ((await loaded()) === before) {
      if (Date.now() > deadline)
        throw new Error(`pg-lease-testing: the server did not reload\n${this.logTail()}`);
      await sleep(20);
    }
  }

  /**
   * Runs `sql` every 100 ms until its first column of its first row, as text, equals
   * `expected` (default `t`), as PostgreSQL::Test::Cluster's `poll_query_until`. Errors of the
   * query count as "not yet" (the server may be starting). Rejects after the timeout with the
   * last answer or error.
   *
   * @example
   * await cluster.pollQueryUntil("SELECT count(*) = 0 FROM pg_stat_activity WHERE query LIKE '%acquire%'");
   */
  async pollQueryUntil(sql: string, expected = 't', options: PollOptions = {}): Promise<void> {
    const deadline = Date.now() + (options.timeoutMs ?? 180_000);
    let last = '(no answer yet)';
    for (;;) {
      try {
        const { rows } = await this.query(sql, [], options.database);
        const first = rows[0] ? Object.values(rows[0])[0] : undefined;
        last = first === null || first === undefined ? '(null)' : String(first);
        if (typeof first === 'boolean') last = first ? 't' : 'f';
        if (last === expected) return;
      } catch (error) {
        last = `error: ${(error as Error).message}`;
      }
      if (Date.now() > deadline)
        throw new Error(
          `pg-lease-testing: timed out polling until ${JSON.stringify(sql)} gives ${JSON.stringify(expected)}; last: ${last}`,
        );
      await sleep(100);
    }
  }

  /**
   * Stops the server if running and frees its port. The files (`data/` and `server.log` in
   * {@link baseDir}) follow `PG_LEASE_KEEP` (see {@link KeepPolicy}): by default they stay
   * until the process exits, and survive it, named on stderr, when it exits with a failure.
   * Safe to call twice.
   */
  async destroy(): Promise<void> {
    if (this.#destroyed) return;
    await this.stop('immediate').catch(() => undefined);
    this.#destroyed = true;
    live.delete(this);
    this.#reservation?.release();
    const policy = keepPolicy();
    if (policy === 'never') {
      this.#watchdog?.kill('SIGKILL');
      fs.rmSync(this.baseDir, { recursive: true, force: true });
    } else {
      // The watchdog stays: should this process be killed, it removes the files as before.
      pendingRemoval.add(this);
      if (policy === 'always') this.#keep('PG_LEASE_KEEP=always');
    }
  }

  #lockFileOf(): string {
    return this.#reservation?.lockFile ?? '/nonexistent';
  }

  /** Marks the files to survive the process and says where they are. */
  #keep(why: string): void {
    if (!fs.existsSync(this.baseDir)) return;
    fs.writeFileSync(path.join(this.baseDir, KEEP_MARKER), `${why}\n`);
    process.stderr.write(
      `pg-lease-testing: kept the cluster (${why}): data dir ${this.dataDir}, log ${this.logFile}\n`,
    );
  }

  /** At exit: keep the files of a failed run, remove the others. @internal */
  settleFiles(exitCode: number): void {
    if (fs.existsSync(path.join(this.baseDir, KEEP_MARKER))) return;
    if (exitCode !== 0) {
      this.#keep(`the process exited with status ${exitCode}`);
      return;
    }
    fs.rmSync(this.baseDir, { recursive: true, force: true });
    this.#watchdog?.kill('SIGKILL');
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.destroy();
  }

  /** The last lines of the server log, for error messages. */
  logTail(lines = 30): string {
    try {
      return fs.readFileSync(this.logFile, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
    } catch {
      return '(no server log)';
    }
  }

  #makeDirs(): void {
    fs.chmodSync(this.baseDir, 0o700);
    fs.mkdirSync(this.socketDir, { mode: 0o700 });
    if (this.#owner) {
      for (const dir of [this.baseDir, this.socketDir])
        fs.chownSync(dir, this.#owner.uid, this.#owner.gid);
    }
  }

  #initdb(): void {
    const result = spawnSync(
      path.join(this.installation.bindir, 'initdb'),
      [
        '-D',
        this.dataDir,
        '-U',
        SUPERUSER,
        '--auth=trust',
        '--encoding=UTF8',
        '--no-locale',
        '--no-sync',
      ],
      { encoding: 'utf8', ...this.#owner, cwd: this.baseDir },
    );
    if (result.status !== 0) {
      throw new Error(
        `pg-lease-testing: initdb failed (${result.status ?? result.signal})\n${result.stderr || result.stdout}`,
      );
    }
    fs.appendFileSync(
      path.join(this.dataDir, 'postgresql.conf'),
      `\n# pg-lease-testing settings (ClusterOptions.settings over the harness defaults)\n` +
        Object.entries(this.#settings)
          .map(([name, value]) => `${name} = ${quoteSetting(value)}\n`)
          .join(''),
    );
  }

  /**
   * A detached shell that waits for this process to disappear, however it ends, then stops
   * the server (whatever postmaster pid the data dir names at that moment) and removes the
   * cluster's files. destroy() kills it once the cluster is gone.
   */
  #startWatchdog(): void {
    const script = `
      while kill -0 "$1" 2>/dev/null; do sleep 1; done
      pidfile="$2/data/postmaster.pid"
      if [ -f "$pidfile" ]; then
        pid=$(head -n 1 "$pidfile")
        if [ -n "$pid" ] && tr '\\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$2/data"; then
          kill -QUIT "$pid" 2>/dev/null
          for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
          kill -KILL "$pid" 2>/dev/null
        fi
      fi
      rm -f "$3"
      [ -e "$2/${KEEP_MARKER}" ] || rm -rf "$2"
    `;
    const watchdog = spawn(
      'sh',
      ['-c', script, 'pg-lease-watchdog', String(process.pid), this.baseDir, this.#lockFileOf()],
      {
        detached: true,
        stdio: 'ignore',
      },
    );
    watchdog.unref();
    this.#watchdog = watchdog;
  }

  async #accepting(): Promise<boolean> {
    const client = new pg.Client({ connectionString: this.url(), connectionTimeoutMillis: 2_000 });
    client.on('error', () => undefined);
    try {
      await client.connect();
      await client.query('SELECT 1');
      return true;
    } catch {
      return false;
    } finally {
      await client.end().catch(() => undefined);
    }
  }

  /**
   * Backends notice a dead postmaster on their own and exit; a new postmaster refuses to start
   * while any of them still holds the old shared memory, so wait for them.
   */
  async #waitForBackendsToExit(): Promise<void> {
    const deadline = Date.now() + STOP_TIMEOUT_MS;
    while (processesUsingDataDir(this.dataDir).length > 0 && Date.now() < deadline) await sleep(50);
  }
}

/** Whether `promise` settles within `ms`; the timer never keeps the process alive. */
async function settlesWithin(promise: Promise<unknown>, ms: number): Promise<boolean> {
  const timer = new AbortController();
  const timeout = sleep(ms, false, { signal: timer.signal }).catch(() => false);
  try {
    return await Promise.race([promise.then(() => true), timeout]);
  } finally {
    timer.abort();
  }
}

/** A value as postgresql.conf takes it: numbers and booleans bare, text quoted. */
function quoteSetting(value: SettingValue | string): string {
  if (typeof value === 'number' || typeof value === 'boolean') return String(value);
  return `'${value.replace(/\\/g, '\\\\').replace(/'/g, "''")}'`;
}

function lookupUser(name: string): { uid: number; gid: number } {
  const id = (flag: string) => {
    const result = spawnSync('id', [flag, name], { encoding: 'utf8' });
    if (result.status !== 0)
      throw new Error(`pg-lease-testing: unix user "${name}" not found to run PostgreSQL as`);
    return Number(result.stdout.trim());
  };
  return { uid: id('-u'), gid: id('-g') };
}

/** Children of a process, from /proc (Linux); empty where /proc is unavailable. */
function childPids(parent: number): number[] {
  const children: number[] = [];
  for (const entry of safeReaddir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${entry}/stat`, 'utf8');
      // Field 4 is the parent pid; the command name (field 2) may contain spaces, so parse after ')'.
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid === parent) children.push(Number(entry));
    } catch {
      // the process ended while we looked
    }
  }
  return children;
}

/** Processes whose working directory is the data dir: every server process chdirs there. */
function processesUsingDataDir(dataDir: string): number[] {
  const pids: number[] = [];
  for (const entry of safeReaddir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (fs.readlinkSync(`/proc/${entry}/cwd`) === dataDir) pids.push(Number(entry));
    } catch {
      // gone, or not ours to read
    }
  }
  return pids;
}

function safeReaddir(dir: string): string[] {
  try {
    return fs.readdirSync(dir);
  } catch {
    return [];
  }
}

function tryKill(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(pid, signal);
  } catch {
    // already gone
  }
}

/** On a normal exit with clusters still up (a test forgot destroy()), stop them synchronously. */
function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.once('exit', (code) => {
    for (const cluster of live) {
      const pid = cluster.pid;
      if (pid !== undefined) tryKill(pid, 'SIGQUIT');
      // Left running by a failed run: keep it too; otherwise its watchdog removes it.
      if (code !== 0) cluster.settleFiles(code);
    }
    for (const cluster of pendingRemoval) cluster.settleFiles(code);
  });
}
