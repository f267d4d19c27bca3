import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { PgCluster, findInstallation } from 'pg-lease-testing';
import { waitFor } from '../support/helpers.js';

const fixture = path.join(
  path.dirname(fileURLToPath(import.meta.url)),
  'fixtures',
  'hold-cluster.js',
);

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
    assert.equal(rows[0]!.available, '0.2.0');
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

  test('destroy stops the server and removes its files', async () => {
    const other = await PgCluster.start();
    const pid = other.pid!;
    await other.destroy();
    assert.equal(processAlive(pid), false);
    assert.equal(fs.existsSync(other.baseDir), false);
    await other.destroy();
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
