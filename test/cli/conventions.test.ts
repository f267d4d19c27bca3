/**
 * What every command shares, as a user meets it: where it connects (libpq's rules: PG*
 * variables and service files), what a bad --url says, --json for every outcome, one message
 * style for every error.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { LeaseClient } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { uniqueKey } from '../support/helpers.js';
import { parseJson, runCli, type CliResult } from './helpers.js';

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

  test("without any host, libpq's default socket directory /tmp when it has the socket", async (t) => {
    const key = await heldKey();
    const { user, dbname } = parts();
    const { rows } = await db.pool.query<{ dir: string }>(
      'SELECT split_part(current_setting($1), $2, 1) AS dir',
      ['unix_socket_directories', ','],
    );
    const { port } = parts();
    // A port nothing listens on over TCP: only the socket, linked into /tmp, reaches the server.
    const socketPort = String(40_000 + Math.floor(Math.random() * 20_000));
    const link = `/tmp/.s.PGSQL.${socketPort}`;
    if (fs.existsSync(`/var/run/postgresql/.s.PGSQL.${socketPort}`)) {
      t.skip('a server has that socket in /var/run/postgresql, which comes first');
      return;
    }
    fs.symlinkSync(path.join(rows[0]!.dir.trim(), `.s.PGSQL.${port}`), link);
    try {
      const result = await runCli(
        ['inspect', '--key', key],
        pgEnv({ PGPORT: socketPort, PGUSER: user, PGDATABASE: dbname }),
      );
      assertReached(result, key);
    } finally {
      fs.rmSync(link, { force: true });
    }
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

describe('--json: one JSON object for every outcome, with the exit code of the text run', () => {
  /** Runs the command with and without --json and checks both tell the same failure. */
  async function bothWays(args: string[], exit: number, env: NodeJS.ProcessEnv = {}) {
    const text = await runCli(args, env);
    assert.equal(text.code, exit, `${args.join(' ')}: ${text.stderr}`);
    assert.match(text.stderr, /^pg-lease: .+/, args.join(' '));
    const separator = args.indexOf('--');
    const json = await runCli(
      separator === -1
        ? [...args, '--json']
        : [...args.slice(0, separator), '--json', ...args.slice(separator)],
      env,
    );
    assert.equal(json.code, exit, `${args.join(' ')} --json: ${json.stdout}${json.stderr}`);
    assert.equal(json.stderr, '', `${args.join(' ')} --json printed on stderr`);
    const error = parseJson(json).error as Record<string, unknown>;
    assert.equal(typeof error.code, 'string', json.stdout);
    assert.equal(typeof error.message, 'string', json.stdout);
    assert.equal(text.stderr.split('\n')[0], `pg-lease: ${error.message as string}`);
    return error;
  }

  const unreachable = 'postgresql://postgres@127.0.0.1:1/x';

  test('errors of every command', async () => {
    const bare = await createTestDatabase({ extension: false });
    try {
      assert.equal(
        (await bothWays(['acquire', '--url', unreachable, '--key', 'k', '--ttl', '1s'], 1)).code,
        'ECONNREFUSED',
      );
      await bothWays(
        ['renew', '--url', db.url, '--key', 'k', '--owner', 'o', '--epoch', 'x', '--ttl', '1s'],
        64,
      );
      await bothWays(['release', '--url', db.url, '--key', 'k', '--epoch', '1'], 64);
      await bothWays(['inspect', '--url', 'not a url', '--key', 'k'], 64);
      const noPgLease = await bothWays(['list', '--url', bare.url], 1);
      assert.match(String(noPgLease.hint), /run: pg-lease install/);
      await bothWays(['watch', '--url', db.url, '--count', '0'], 64);
      await bothWays(['watch', '--url', bare.url, '--count', '1'], 1);
      await bothWays(['purge', '--url', db.url, '--older-than', 'soon'], 64);
      await bothWays(
        [
          'exec',
          '--url',
          db.url,
          '--key',
          uniqueKey(),
          '--ttl',
          '10s',
          '--',
          'pg-lease-no-such-command',
        ],
        127,
      );
      await bothWays(['exec', '--url', db.url, '--key', 'k', '--ttl', '10s'], 64);
      // install: a schema lease it did not make is refused.
      await bare.pool.query('CREATE SCHEMA lease');
      assert.equal(
        (await bothWays(['install', '--url', bare.url, '--from-bundle'], 1)).code,
        '42P06',
      );
      await bothWays(['demo', '--url', 'not a url'], 64);
      await bothWays(['inspect', '--url', db.url, '--key', 'k', '--frobnicate'], 64);
      await bothWays(['frobnicate'], 64);
    } finally {
      await bare.close();
    }
  });

  test('exec: not acquired, and the report after the command, are JSON', async () => {
    const key = await heldKey();
    const held = await runCli([
      'exec',
      '--url',
      db.url,
      '--key',
      key,
      '--ttl',
      '10s',
      '--json',
      '--',
      'true',
    ]);
    assert.equal(held.code, 75, held.stderr);
    assert.equal(held.stderr, '');
    assert.deepEqual(parseJson(held), { acquired: false, key, reason: 'held' });
    const text = await runCli([
      'exec',
      '--url',
      db.url,
      '--key',
      key,
      '--ttl',
      '10s',
      '--',
      'true',
    ]);
    assert.equal(text.code, 75);

    const free = uniqueKey();
    const ran = await runCli([
      'exec',
      '--url',
      db.url,
      '--key',
      free,
      '--ttl',
      '10s',
      '--json',
      '--',
      process.execPath,
      '-e',
      'console.log("from the command"); process.exit(3)',
    ]);
    assert.equal(ran.code, 3, ran.stderr);
    const [own, report, ...rest] = ran.stdout.trimEnd().split('\n');
    assert.equal(own, 'from the command');
    assert.deepEqual(rest, []);
    const parsed = JSON.parse(report!) as Record<string, unknown>;
    assert.equal(parsed.key, free);
    assert.equal(parsed.epoch, '1');
    assert.equal(parsed.exitCode, 3);
    assert.equal(parsed.released, 'ok');
  });
});

describe('one message style: the option as typed, its value, a hint for that option', () => {
  test('--wait, --grace, --interval, --batch, --count each get their own name and hint', async () => {
    const cases: [string[], RegExp, RegExp][] = [
      [
        ['acquire', '--url', db.url, '--key', 'k', '--ttl', '10s', '--wait', '5'],
        /^pg-lease: invalid input: --wait "5" has no unit: write 5s, 5ms or 5min$/m,
        /^hint: --wait is a duration with a unit, 0 or more/m,
      ],
      [
        ['exec', '--url', db.url, '--key', 'k', '--ttl', '10s', '--grace', '-1s', '--', 'true'],
        /^pg-lease: invalid input: --grace "-1s" must be a non-negative finite interval$/m,
        /^hint: --grace is a duration/m,
      ],
      [
        ['watch', '--url', db.url, '--interval', '0'],
        /^pg-lease: invalid input: --interval "0" must be a positive finite interval$/m,
        /^hint: --interval is a duration/m,
      ],
      [
        ['purge', '--url', db.url, '--older-than', '7d', '--batch', '0'],
        /^pg-lease: invalid input: --batch must be a positive whole number, got "0"$/m,
        /^hint: --batch is a whole number/m,
      ],
      [
        ['purge', '--url', db.url, '--older-than', '5'],
        /^pg-lease: invalid input: --older-than "5" has no unit/m,
        /^hint: --older-than is a duration with a unit: 7d, 12h; 0 takes every dead key/m,
      ],
      [
        ['inspect', '--url', db.url, '--key', 'k', 'extra'],
        /^pg-lease: unexpected argument "extra"$/m,
        /^hint: every value follows its option/m,
      ],
      [
        ['acquire', '--url', db.url, '--ttl'],
        /^pg-lease: --ttl needs a value$/m,
        /^hint: --ttl is a duration/m,
      ],
    ];
    for (const [args, message, hint] of cases) {
      const result = await runCli(args);
      assert.equal(result.code, 64, `${args.join(' ')}: ${result.stderr}`);
      assert.match(result.stderr, message);
      assert.match(result.stderr, hint);
      // No client parameter names, and no hint about another option.
      assert.doesNotMatch(
        result.stderr,
        /older_than|keepAlive|key and owner are|Unknown option|Unexpected argument/,
      );
    }
  });
});
