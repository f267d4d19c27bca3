/**
 * PgBouncer in front of a harness cluster, for tests of pg_lease behind a pooler. The
 * harness does not ship PgBouncer: it runs the system's (`pgbouncer` on PATH, `/usr/sbin`, or
 * `PG_LEASE_PGBOUNCER`), on a reserved loopback port (the port locks of `ports.ts`), with its configuration, auth file, log and
 * pid file in a private directory. As root it runs as the cluster's server account, like the
 * server. A watchdog stops it and removes the directory if the test process dies.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import type { PgCluster } from './cluster.js';
import { reservePort, type PortReservation } from './ports.js';

/** Options for {@link startPgBouncer}. */
export interface PgBouncerOptions {
  /** `pool_mode`. Default `transaction`. */
  poolMode?: 'session' | 'transaction' | 'statement';
  /** `default_pool_size`: server connections per database and user. Default 4. */
  poolSize?: number;
  /** `max_client_conn`. Default 1000. */
  maxClientConnections?: number;
  /** Roles that may connect (the auth file; auth is `trust`, like the harness's server). Default: the superuser. */
  users?: string[];
  /** More `[pgbouncer]` settings, e.g. `{ query_wait_timeout: 30 }`. */
  settings?: Record<string, string | number>;
}

const HOST = '127.0.0.1';
const START_TIMEOUT_MS = 30_000;

/**
 * The PgBouncer program to run, or undefined when none is installed: `PG_LEASE_PGBOUNCER`,
 * else `pgbouncer` on PATH or in `/usr/sbin` and `/usr/local/sbin` (Debian installs it there).
 *
 * @example
 * if (!findPgBouncer()) console.log('pgbouncer is not installed: apt-get install pgbouncer');
 */
export function findPgBouncer(): string | undefined {
  const explicit = process.env.PG_LEASE_PGBOUNCER;
  if (explicit) return fs.existsSync(explicit) ? explicit : undefined;
  const dirs = [...(process.env.PATH ?? '').split(path.delimiter), '/usr/sbin', '/usr/local/sbin'];
  for (const dir of dirs) {
    if (!dir) continue;
    const candidate = path.join(dir, 'pgbouncer');
    try {
      fs.accessSync(candidate, fs.constants.X_OK);
      return candidate;
    } catch {
      // not here
    }
  }
  return undefined;
}

/** A running PgBouncer owned by this process. */
export class PgBouncer implements AsyncDisposable {
  readonly host = HOST;
  /** Private folder holding `pgbouncer.ini`, `userlist.txt`, `pgbouncer.log`. */
  readonly dir: string;
  readonly logFile: string;
  readonly port: number;
  readonly #cluster: PgCluster;
  readonly #process: ChildProcess;
  readonly #exited: Promise<void>;
  readonly #watchdog: ChildProcess;
  readonly #reservation: PortReservation;

  private constructor(
    cluster: PgCluster,
    dir: string,
    reservation: PortReservation,
    child: ChildProcess,
    watchdog: ChildProcess,
  ) {
    this.#cluster = cluster;
    this.dir = dir;
    this.logFile = path.join(dir, 'pgbouncer.log');
    this.#reservation = reservation;
    this.port = reservation.port;
    this.#process = child;
    this.#exited = new Promise((resolve) => {
      if (child.exitCode !== null || child.signalCode !== null) resolve();
      else child.once('exit', () => resolve());
    });
    this.#watchdog = watchdog;
  }

  /** @internal use {@link startPgBouncer} */
  static async launch(cluster: PgCluster, options: PgBouncerOptions): Promise<PgBouncer> {
    const program = findPgBouncer();
    if (!program)
      throw new Error('pg-lease: pgbouncer not found (install it, or set PG_LEASE_PGBOUNCER)');
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-lease-pgbouncer-'));
    const owner = cluster.serverAccount;
    const reservation = await reservePort(HOST);
    const port = reservation.port;
    const users = options.users ?? [cluster.superuser];
    const settings: Record<string, string | number> = {
      listen_addr: HOST,
      listen_port: port,
      unix_socket_dir: '',
      auth_type: 'trust',
      auth_file: path.join(dir, 'userlist.txt'),
      admin_users: cluster.superuser,
      pool_mode: options.poolMode ?? 'transaction',
      default_pool_size: options.poolSize ?? 4,
      min_pool_size: 0,
      reserve_pool_size: 0,
      max_client_conn: options.maxClientConnections ?? 1000,
      logfile: path.join(dir, 'pgbouncer.log'),
      pidfile: path.join(dir, 'pgbouncer.pid'),
      ignore_startup_parameters: 'extra_float_digits',
      ...options.settings,
    };
    const ini = [
      '[databases]',
      `* = host=${cluster.host} port=${cluster.port}`,
      '',
      '[pgbouncer]',
      ...Object.entries(settings).map(([name, value]) => `${name} = ${value}`),
      '',
    ].join('\n');
    fs.writeFileSync(path.join(dir, 'pgbouncer.ini'), ini, { mode: 0o600 });
    fs.writeFileSync(
      path.join(dir, 'userlist.txt'),
      users.map((user) => `"${user.replaceAll('"', '""')}" ""\n`).join(''),
      { mode: 0o600 },
    );
    if (owner)
      for (const file of ['', 'pgbouncer.ini', 'userlist.txt'])
        fs.chownSync(path.join(dir, file), owner.uid, owner.gid);

    const child = spawn(program, [path.join(dir, 'pgbouncer.ini')], {
      stdio: ['ignore', 'ignore', 'pipe'],
      ...owner,
    });
    let stderr = '';
    child.stderr?.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    child.once('error', () => undefined);
    const watchdog = startWatchdog(child.pid!, dir);
    const bouncer = new PgBouncer(cluster, dir, reservation, child, watchdog);

    const deadline = Date.now() + START_TIMEOUT_MS;
    for (;;) {
      if (child.exitCode !== null || child.signalCode !== null) {
        const log = bouncer.logTail();
        await bouncer.stop();
        throw new Error(`pg-lease: pgbouncer exited at start\n${stderr}\n${log}`);
      }
      if (await bouncer.#accepting()) return bouncer;
      if (Date.now() > deadline) {
        await bouncer.stop();
        throw new Error(`pg-lease: pgbouncer not ready after ${START_TIMEOUT_MS} ms\n${stderr}`);
      }
      await sleep(50);
    }
  }

  /** Connection string through PgBouncer to a database of the cluster. */
  url(database = 'postgres', user = this.#cluster.superuser): string {
    return `postgresql://${encodeURIComponent(user)}@${HOST}:${this.port}/${encodeURIComponent(database)}`;
  }

  /**
   * Runs a command of PgBouncer's admin console (`SHOW POOLS`, `SHOW SERVERS`, ...) and returns
   * its rows.
   *
   * @example
   * const [pool] = await bouncer.admin('SHOW POOLS');
   * console.log(pool.cl_waiting, pool.sv_active);
   */
  async admin(command: string): Promise<Record<string, unknown>[]> {
    const client = new pg.Client({ connectionString: this.url('pgbouncer') });
    client.on('error', () => undefined);
    await client.connect();
    try {
      return (await client.query(command)).rows as Record<string, unknown>[];
    } finally {
      await client.end().catch(() => undefined);
    }
  }

  /** The `SHOW POOLS` row of one database (and the superuser unless another user is named). */
  async pool(database: string, user = this.#cluster.superuser): Promise<Record<string, unknown>> {
    const rows = await this.admin('SHOW POOLS');
    const row = rows.find((r) => r.database === database && r.user === user);
    if (!row) throw new Error(`pg-lease: pgbouncer has no pool for ${user}@${database}`);
    return row;
  }

  /** Stops PgBouncer at once (closing every connection) and removes its directory. */
  async stop(): Promise<void> {
    if (this.#process.exitCode === null && this.#process.signalCode === null) {
      this.#process.kill('SIGTERM');
      const timer = setTimeout(() => this.#process.kill('SIGKILL'), 10_000);
      await this.#exited;
      clearTimeout(timer);
    }
    this.#watchdog.kill('SIGKILL');
    this.#reservation.release();
    fs.rmSync(this.dir, { recursive: true, force: true });
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.stop();
  }

  /** The last lines of PgBouncer's log. */
  logTail(lines = 30): string {
    try {
      return fs.readFileSync(this.logFile, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
    } catch {
      return '(no pgbouncer log)';
    }
  }

  async #accepting(): Promise<boolean> {
    const client = new pg.Client({
      connectionString: this.url(),
      connectionTimeoutMillis: 2_000,
    });
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
}

/**
 * Starts PgBouncer in front of `cluster` (which must be running): every database of the
 * cluster is reachable through it under its own name, by the roles in `users`.
 *
 * @example
 * await using cluster = await PgCluster.start();
 * const url = await cluster.createDatabase('app');
 * await using bouncer = await startPgBouncer(cluster, { poolMode: 'transaction', poolSize: 4 });
 * const pool = new pg.Pool({ connectionString: bouncer.url('app'), max: 50 });
 */
export async function startPgBouncer(
  cluster: PgCluster,
  options: PgBouncerOptions = {},
): Promise<PgBouncer> {
  return PgBouncer.launch(cluster, options);
}

function startWatchdog(pid: number, dir: string): ChildProcess {
  const script = `
    while kill -0 "$1" 2>/dev/null; do sleep 1; done
    kill -TERM "$2" 2>/dev/null
    sleep 1
    kill -KILL "$2" 2>/dev/null
    rm -rf "$3"
  `;
  const watchdog = spawn(
    'sh',
    ['-c', script, 'pg-lease-pgbouncer-watchdog', String(process.pid), String(pid), dir],
    { detached: true, stdio: 'ignore' },
  );
  watchdog.unref();
  return watchdog;
}
