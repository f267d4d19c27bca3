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
import pg from 'pg';
import { connectionConfig } from '../../src/cli/connection.js';
import { UsageError } from '../../src/cli/exit-codes.js';
import { LeaseClient } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { uniqueKey } from '../support/helpers.js';
import { CURRENT_VERSION } from '../support/releases.js';
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

/** The test server's Unix socket directory (the first of unix_socket_directories). */
async function socketDir(pool: pg.Pool = db.pool): Promise<string> {
  const { rows } = await pool.query<{ dir: string }>(
    'SELECT split_part(current_setting($1), $2, 1) AS dir',
    ['unix_socket_directories', ','],
  );
  return rows[0]!.dir.trim();
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

describe("libpq's URL forms (its docs' Connection URIs), as psql takes them", () => {
  test('the user given and the socket directory in the query (no host): install, list, exec, also with --json', async () => {
    const bare = await createTestDatabase({ extension: false });
    try {
      // All of it from the bare database's own server: run alone, this file's database and the
      // bare one are in two throwaway clusters.
      const { username, port, pathname } = new URL(bare.url);
      const user = decodeURIComponent(username);
      const dbname = decodeURIComponent(pathname.slice(1));
      const url = `postgresql://${user}@/${dbname}?host=${await socketDir(bare.pool)}&port=${port}`;
      const env = pgEnv({});
      const installed = await runCli(['install', '--from-bundle', '--url', url, '--json'], env);
      assert.equal(installed.code, 0, installed.stdout + installed.stderr);
      assert.deepEqual(parseJson(installed), {
        version: CURRENT_VERSION,
        method: 'bundle',
        created: true,
      });
      const again = await runCli(['install', '--from-bundle', '--url', url], env);
      assert.equal(again.code, 0, again.stderr);
      assert.match(again.stdout, /already installed/);
      const listed = await runCli(['list', '--url', url, '--json'], env);
      assert.equal(listed.code, 0, listed.stdout + listed.stderr);
      assert.deepEqual(parseJson(listed), { leases: [] });
      const text = await runCli(['list', '--url', url], env);
      assert.equal(text.code, 0, text.stderr);
      assert.equal(text.stdout.trim(), '(no key is held)');
      for (const json of [[], ['--json']]) {
        const ran = await runCli(
          ['exec', '--url', url, '--key', uniqueKey('urls'), '--ttl', '10s', ...json, '--', 'true'],
          env,
        );
        assert.equal(ran.code, 0, ran.stdout + ran.stderr);
      }
    } finally {
      await bare.close();
    }
  });

  test('every form, pointed at the test server (TCP and its socket directory), reaches it', async () => {
    const key = await heldKey();
    const { host, port, user, dbname } = parts();
    const sock = await socketDir();
    // The docs' form, the form rewritten to reach the test server, what the environment adds.
    const forms: [string, string, NodeJS.ProcessEnv][] = [
      [
        'postgresql://',
        'postgresql://',
        { PGHOST: host, PGPORT: port, PGUSER: user, PGDATABASE: dbname },
      ],
      [
        'postgresql://localhost',
        `postgresql://${host}`,
        { PGPORT: port, PGUSER: user, PGDATABASE: dbname },
      ],
      [
        'postgresql://localhost:5433',
        `postgresql://${host}:${port}`,
        { PGUSER: user, PGDATABASE: dbname },
      ],
      [
        'postgresql://localhost/mydb',
        `postgresql://${host}/${dbname}`,
        { PGPORT: port, PGUSER: user },
      ],
      [
        'postgresql://user@localhost',
        `postgresql://${user}@${host}`,
        { PGPORT: port, PGDATABASE: dbname },
      ],
      [
        'postgresql://user:secret@localhost',
        `postgresql://${user}:secret@${host}:${port}/${dbname}`,
        {},
      ],
      [
        'postgresql://other@localhost/otherdb?connect_timeout=10&application_name=myapp',
        `postgresql://${user}@${host}:${port}/${dbname}?connect_timeout=10&application_name=myapp`,
        {},
      ],
      [
        'postgresql:///mydb?host=localhost&port=5433',
        `postgresql:///${dbname}?host=${host}&port=${port}`,
        { PGUSER: user },
      ],
      [
        'postgresql:///dbname?host=/var/lib/postgresql',
        `postgresql:///${dbname}?host=${sock}`,
        { PGPORT: port, PGUSER: user },
      ],
      [
        'postgresql://%2Fvar%2Flib%2Fpostgresql/dbname',
        `postgresql://${encodeURIComponent(sock)}/${dbname}`,
        { PGPORT: port, PGUSER: user },
      ],
    ];
    for (const [doc, url, env] of forms)
      for (const scheme of ['postgresql://', 'postgres://']) {
        const given = url.replace('postgresql://', scheme);
        const result = await runCli(['inspect', '--key', key, '--url', given], pgEnv(env));
        assert.equal(result.code, 0, `${doc} as ${given}: ${result.stderr}`);
        assertReached(result, key);
      }
  });

  test('[::1]: the IPv6 address and port are the ones tried (the server listens on 127.0.0.1)', async () => {
    const { port, user, dbname } = parts();
    const result = await runCli(
      ['list', '--url', `postgresql://${user}@[::1]:${port}/${dbname}`, '--json'],
      pgEnv({}),
    );
    assert.equal(result.code, 1, result.stdout + result.stderr);
    const error = parseJson(result).error as Record<string, unknown>;
    assert.match(String(error.message), new RegExp(`::1:${port}\\b`));
  });

  test('several hosts (libpq tries each in turn; node-postgres takes one) are a usage error that says so', async () => {
    const { host, port, dbname } = parts();
    const cases: [string[], NodeJS.ProcessEnv, RegExp][] = [
      [
        [
          '--url',
          `postgresql://${host}:${port},${host}:1/${dbname}?target_session_attrs=any&application_name=myapp`,
        ],
        {},
        /^--url "postgresql:\/\/.*" names more than one host: .*node-postgres connects to one/,
      ],
      [
        ['--url', `postgresql:///${dbname}?host=${host},${host}&port=${port}`],
        {},
        /^--url names more than one host \("127\.0\.0\.1,127\.0\.0\.1"\)/,
      ],
      [[], { PGHOST: `${host},${host}`, PGPORT: port }, /^PGHOST names more than one host/],
    ];
    for (const [args, env, message] of cases) {
      const result = await runCli(['list', ...args, '--json'], pgEnv(env));
      assert.equal(result.code, 64, result.stdout + result.stderr);
      assert.equal(result.stderr, '');
      const error = parseJson(result).error as Record<string, unknown>;
      assert.equal(error.code, 'usage');
      assert.match(String(error.message), message);
      assert.match(String(error.hint), /one host/);
    }
  });

  test('the settings each literal form gives are the ones libpq would use', () => {
    const saved = { ...process.env };
    for (const name of Object.keys(process.env))
      if (/^PG[A-Z]/.test(name)) delete process.env[name];
    try {
      const settings = (url: string) => {
        const config = connectionConfig({ url });
        // What node-postgres will use: the Client's parameters (with its defaults).
        const client = new pg.Client(config) as unknown as {
          connectionParameters: Record<string, unknown>;
        };
        const params = client.connectionParameters;
        return {
          host: params.host,
          port: params.port,
          user: params.user,
          database: params.database,
          password: params.password,
          application_name: params.application_name,
          connectionTimeoutMillis: config.connectionTimeoutMillis,
        };
      };
      const local = { host: 'localhost', port: 5432 };
      const forms: [string, Record<string, unknown>][] = [
        ['postgresql://localhost', local],
        ['postgresql://localhost:5433', { ...local, port: 5433 }],
        ['postgresql://localhost/mydb', { ...local, database: 'mydb' }],
        ['postgresql://user@localhost', { ...local, user: 'user', database: 'user' }],
        [
          'postgresql://user:secret@localhost',
          { ...local, user: 'user', database: 'user', password: 'secret' },
        ],
        [
          'postgresql://other@localhost/otherdb?connect_timeout=10&application_name=myapp',
          {
            ...local,
            user: 'other',
            database: 'otherdb',
            application_name: 'myapp',
            connectionTimeoutMillis: 10_000,
          },
        ],
        ['postgresql:///mydb?host=localhost&port=5433', { ...local, port: 5433, database: 'mydb' }],
        [
          'postgresql://[2001:db8::1234]/database',
          { host: '2001:db8::1234', port: 5432, database: 'database' },
        ],
        [
          'postgresql:///dbname?host=/var/lib/postgresql',
          { host: '/var/lib/postgresql', port: 5432, database: 'dbname' },
        ],
        [
          'postgresql://%2Fvar%2Flib%2Fpostgresql/dbname',
          { host: '/var/lib/postgresql', port: 5432, database: 'dbname' },
        ],
      ];
      for (const [form, expected] of forms)
        for (const scheme of ['postgresql://', 'postgres://']) {
          const url = form.replace('postgresql://', scheme);
          const got = settings(url);
          for (const [name, value] of Object.entries(expected))
            assert.equal(got[name as keyof typeof got], value, `${url}: ${name}`);
        }
      // No host at all: libpq's default socket directory when it has the server's socket.
      const bare = settings('postgresql://');
      assert.ok(['localhost', '/var/run/postgresql', '/tmp'].includes(String(bare.host)));
      assert.equal(bare.port, 5432);
      assert.throws(
        () =>
          connectionConfig({
            url: 'postgresql://host1:123,host2:456/somedb?target_session_attrs=any&application_name=myapp',
          }),
        (error: unknown) =>
          error instanceof UsageError && /names more than one host/.test(error.message),
      );
    } finally {
      for (const name of Object.keys(process.env)) if (!(name in saved)) delete process.env[name];
      Object.assign(process.env, saved);
    }
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
