/**
 * Waiting behind PgBouncer in transaction mode, where LISTEN does not work: the client finds
 * out (its probe notification never comes back), polls with expiry-exact sleeps instead, marks
 * no key (so releases do not notify for nobody), and pins no server connection while it waits.
 * Skipped when no pgbouncer binary is installed.
 */
import assert from 'node:assert/strict';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { LeaseClient } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { uniqueKey } from '../support/helpers.js';

function findPgbouncer(): string | undefined {
  for (const dir of [...(process.env.PATH ?? '').split(':'), '/usr/sbin', '/usr/local/sbin']) {
    const file = path.join(dir, 'pgbouncer');
    if (fs.existsSync(file)) return file;
  }
  return undefined;
}

const PGBOUNCER = findPgbouncer();

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

let db: TestDatabase;
let bouncer: ChildProcess | undefined;
let bouncerUrl: string;
let dir: string;
const pools: pg.Pool[] = [];

before(async () => {
  db = await createTestDatabase();
  if (!PGBOUNCER) return;
  const target = new URL(db.url);
  const port = await freePort();
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-lease-pgbouncer-'));
  const user = decodeURIComponent(target.username);
  const database = target.pathname.slice(1);
  fs.writeFileSync(path.join(dir, 'users.txt'), `"${user}" ""\n`);
  fs.writeFileSync(
    path.join(dir, 'pgbouncer.ini'),
    [
      '[databases]',
      `${database} = host=${target.hostname} port=${target.port} dbname=${database} user=${user}`,
      '[pgbouncer]',
      'listen_addr = 127.0.0.1',
      `listen_port = ${port}`,
      'auth_type = trust',
      `auth_file = ${path.join(dir, 'users.txt')}`,
      'pool_mode = transaction',
      // One server connection: a waiter that pinned it would stop everyone else.
      'default_pool_size = 1',
      'max_client_conn = 50',
      'unix_socket_dir =',
      `logfile = ${path.join(dir, 'pgbouncer.log')}`,
      '',
    ].join('\n'),
  );
  const args = [path.join(dir, 'pgbouncer.ini')];
  if (process.getuid?.() === 0) {
    // pgbouncer refuses to run as root: drop to nobody, who must be able to write its log.
    const uid = Number(execFileSync('id', ['-u', 'nobody']).toString().trim());
    fs.chownSync(dir, uid, -1);
    for (const file of fs.readdirSync(dir)) fs.chownSync(path.join(dir, file), uid, -1);
    args.unshift('-u', 'nobody');
  }
  bouncer = spawn(PGBOUNCER, args, { stdio: 'ignore' });
  bouncerUrl = `postgresql://${encodeURIComponent(user)}@127.0.0.1:${port}/${database}`;
  for (let i = 0; ; i++) {
    try {
      const probe = new pg.Client({ connectionString: bouncerUrl });
      await probe.connect();
      await probe.end();
      break;
    } catch (error) {
      if (i > 100) throw error;
      await sleep(50);
    }
  }
});

after(async () => {
  await Promise.all(pools.map((pool) => pool.end()));
  bouncer?.kill('SIGTERM');
  await db.close();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

function bouncedClient(): LeaseClient {
  const pool = new pg.Pool({ connectionString: bouncerUrl, max: 4 });
  pool.on('error', () => undefined);
  pools.push(pool);
  return new LeaseClient(pool, { pollInterval: 20 });
}

describe(
  'waiting behind PgBouncer in transaction mode',
  { skip: !PGBOUNCER && 'no pgbouncer' },
  () => {
    test('a waiter falls back to polling, marks nothing and pins no server connection', async () => {
      const key = uniqueKey('pgbouncer-wait');
      const holderClient = bouncedClient();
      const waiterClient = bouncedClient();
      const holder = (await holderClient.acquire(key, { ttl: '1 min' }))!;
      const waiting = waiterClient.acquire(key, { ttl: '1 min', wait: '30s' });
      waiting.catch(() => undefined);
      // Past the probe (2 s): the waiter polls now.
      await sleep(2_500);
      // With one server connection, the holder's calls still go through at once.
      for (let i = 0; i < 5; i++) {
        const started = performance.now();
        await holder.renew();
        assert.ok(performance.now() - started < 2_000, 'the holder waited for the waiter');
      }
      const { rows } = await db.pool.query<{ watched_until: Date | null }>(
        'SELECT watched_until FROM lease.leases WHERE key = $1',
        [key],
      );
      assert.equal(rows[0]?.watched_until, null, 'a polling waiter marked the key');
      await holder.release();
      const lease = await waiting;
      assert.ok(lease, 'the polling waiter got the released key');
      assert.equal(lease.epoch, holder.epoch + 2n);
      await lease.release();
    });

    test('a polling waiter takes a lapsed lease over at its expiry', async () => {
      const key = uniqueKey('pgbouncer-lapse');
      const holder = (await bouncedClient().acquire(key, { ttl: '3s' }))!;
      const lease = await bouncedClient().acquire(key, { ttl: '1 min', wait: '30s' });
      assert.ok(lease);
      assert.ok(lease.expiresAt.getTime() - 60_000 >= holder.expiresAt.getTime());
      await lease.release();
    });
  },
);
