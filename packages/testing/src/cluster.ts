/**
 * Throwaway PostgreSQL clusters for tests: `initdb` into a private temp dir, start on a free
 * loopback port with a private socket dir, crash or restart on demand, and always clean up.
 *
 * Clean-up does not depend on the test process behaving: every cluster gets a small watchdog
 * process that outlives a killed parent, stops the server and removes the files.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
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
}

/** Stop modes, as in `pg_ctl stop -m`: `fast` rolls back sessions and checkpoints, `immediate` does neither. */
export type StopMode = 'fast' | 'immediate';

const SUPERUSER = 'postgres';
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

  /** Creates and starts a new cluster. */
  static async start(options: ClusterOptions = {}): Promise<PgCluster> {
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
      cluster.#initdb();
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
    if (this.#port === 0) this.#port = await freePort();
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
    for (const [name, value] of Object.entries(this.#settings)) args.push('-c', `${name}=${value}`);

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

  /** Stops (fast) and starts again on the same data dir and port. */
  async restart(): Promise<void> {
    await this.stop('fast');
    await this.start();
  }

  /** Stops the server if running and removes every file of the cluster. Safe to call twice. */
  async destroy(): Promise<void> {
    if (this.#destroyed) return;
    await this.stop('immediate').catch(() => undefined);
    this.#destroyed = true;
    live.delete(this);
    this.#watchdog?.kill('SIGKILL');
    fs.rmSync(this.baseDir, { recursive: true, force: true });
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

  #initdb(): void {
    fs.chmodSync(this.baseDir, 0o700);
    fs.mkdirSync(this.socketDir, { mode: 0o700 });
    if (this.#owner) {
      for (const dir of [this.baseDir, this.socketDir])
        fs.chownSync(dir, this.#owner.uid, this.#owner.gid);
    }
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
      rm -rf "$2"
    `;
    const watchdog = spawn(
      'sh',
      ['-c', script, 'pg-lease-watchdog', String(process.pid), this.baseDir],
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

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.unref();
    server.once('error', reject);
    server.listen(0, HOST, () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
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
  process.once('exit', () => {
    for (const cluster of live) {
      const pid = cluster.pid;
      if (pid !== undefined) tryKill(pid, 'SIGQUIT');
    }
  });
}
