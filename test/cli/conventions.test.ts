/**
 * What every command shares, as a user meets it: where it connects (libpq's rules: PG*
 * variables and service files), and what a bad --url says.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { LeaseClient } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { uniqueKey } from '../support/helpers.js';
import { runCli, type CliResult } from './helpers.js';

let db: TestDatabase;
let client: LeaseClient;
let dir: string;

before(async () => {
  db = await createTestDatabase();
  client = new LeaseClient(db.pool);
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-lease-cli-conventions-'));
});
after(async () => {
  fs.rmSync(dir, { recursive: true, force: true });
  await db.close();
});

/** The parts of the test database's URL, as libpq's variables and keywords name them. */
function parts(): { host: string; port: string; user: string; dbname: string } {
  const url = new URL(db.url);
  return {
    host: url.hostname,
    port: url.port,
    user: decodeURIComponent(url.username),
    dbname: decodeURIComponent(url.pathname.slice(1)),
  };
}

/** No PG* variable of the test's own environment leaks into a run. */
function pgEnv(extra: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const name of Object.keys(process.env)) if (/^PG[A-Z]/.test(name)) env[name] = '';
  return { ...env, ...extra };
}

/** A key held in the test database, so that inspect shows which database a command reached. */
async function heldKey(): Promise<string> {
  const key = uniqueKey('conventions');
  await client.acquire(key, { ttl: '1 hour', owner: 'conventions-holder' });
  return key;
}

function assertReached(result: CliResult, key: string): void {
  assert.equal(result.code, 0, result.stderr);
  assert.ok(result.stdout.startsWith(`${key}: held by conventions-holder`), result.stdout);
}

describe('where the CLI connects without --url or DATABASE_URL, as psql would', () => {
  test('PGHOST, PGPORT, PGUSER and PGDATABASE', async () => {
    const key = await heldKey();
    const { host, port, user, dbname } = parts();
    const result = await runCli(
      ['inspect', '--key', key],
      pgEnv({ PGHOST: host, PGPORT: port, PGUSER: user, PGDATABASE: dbname, PGPASSWORD: 'unused' }),
    );
    assertReached(result, key);
  });

  test('PGSERVICE with PGSERVICEFILE; the service wins over PG* variables', async () => {
    const key = await heldKey();
    const { host, port, user, dbname } = parts();
    const file = path.join(dir, 'services.conf');
    fs.writeFileSync(
      file,
      `# services\n[other]\nhost=127.0.0.1\nport=1\n\n[leases]\nhost=${host}\nport=${port}\nuser=${user}\ndbname=${dbname}\n`,
    );
    const result = await runCli(
      ['inspect', '--key', key],
      pgEnv({ PGSERVICEFILE: file, PGSERVICE: 'leases', PGHOST: '127.0.0.1', PGPORT: '1' }),
    );
    assertReached(result, key);
    // service= in the connection string, also as a URL parameter.
    const inUrl = await runCli(
      ['inspect', '--key', key, '--url', 'postgresql:///?service=leases'],
      pgEnv({ PGSERVICEFILE: file }),
    );
    assertReached(inUrl, key);
    const missing = await runCli(
      ['inspect', '--key', key],
      pgEnv({ PGSERVICEFILE: file, PGSERVICE: 'nope' }),
    );
    assert.equal(missing.code, 64);
    assert.match(missing.stderr, /^pg-lease: definition of service "nope" not found$/m);
  });

  test('~/.pg_service.conf, then PGSYSCONFDIR/pg_service.conf', async () => {
    const key = await heldKey();
    const { host, port, user, dbname } = parts();
    const home = path.join(dir, 'home');
    const sysconf = path.join(dir, 'etc');
    fs.mkdirSync(home, { recursive: true });
    fs.mkdirSync(sysconf, { recursive: true });
    const entry = `host=${host}\nport=${port}\nuser=${user}\ndbname=${dbname}\n`;
    fs.writeFileSync(path.join(home, '.pg_service.conf'), `[mine]\n${entry}`);
    fs.writeFileSync(path.join(sysconf, 'pg_service.conf'), `[site]\n${entry}`);
    for (const service of ['mine', 'site'])
      assertReached(
        await runCli(
          ['inspect', '--key', key],
          pgEnv({ HOME: home, PGSYSCONFDIR: sysconf, PGSERVICE: service }),
        ),
        key,
      );
  });

  test('a keyword=value connection string, as psql takes it', async () => {
    const key = await heldKey();
    const { host, port, user, dbname } = parts();
    const result = await runCli(
      [
        'inspect',
        '--key',
        key,
        '--url',
        `host=${host} port=${port} user='${user}' dbname=${dbname}`,
      ],
      pgEnv({}),
    );
    assertReached(result, key);
  });
});

describe('a connection string that is not one', () => {
  test('--url "not a url" is a usage error that says so', async () => {
    const result = await runCli(['inspect', '--key', 'k', '--url', 'not a url']);
    assert.equal(result.code, 64);
    assert.match(
      result.stderr,
      /^pg-lease: --url "not a url" is not a valid postgres:\/\/ URL or connection string$/m,
    );
    assert.doesNotMatch(result.stderr, /ENOTFOUND|getaddrinfo/);
  });

  test('DATABASE_URL is named when it is the bad one; a password is not shown', async () => {
    const result = await runCli(['list'], { DATABASE_URL: 'localhost:5432/app' });
    assert.equal(result.code, 64);
    assert.match(result.stderr, /^pg-lease: DATABASE_URL "localhost:5432\/app" is not a valid/m);
    const unknown = await runCli(['list', '--url', 'host=db password=secret colour=blue']);
    assert.equal(unknown.code, 64);
    assert.match(unknown.stderr, /^pg-lease: --url has an unknown connection option "colour"$/m);
    assert.doesNotMatch(unknown.stderr, /secret/);
  });
});
