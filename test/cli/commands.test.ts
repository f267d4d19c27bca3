import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { after, before, describe, test } from 'node:test';
import { LeaseClient } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { uniqueKey } from '../support/helpers.js';
import { CLI, parseJson, runCli, type CliResult } from './helpers.js';

let db: TestDatabase;
let client: LeaseClient;

before(async () => {
  db = await createTestDatabase();
  client = new LeaseClient(db.pool);
});
after(() => db.close());

describe('pg-lease acquire, renew, release, inspect', () => {
  test('acquire prints the owner and epoch it got and exits 0', async () => {
    const key = uniqueKey();
    const result = await runCli(['acquire', '--url', db.url, '--key', key, '--ttl', '30s']);
    assert.equal(result.code, 0, result.stderr);
    assert.match(result.stdout, new RegExp(`^acquired ${key}$`, 'm'));
    assert.match(result.stdout, /^ {2}epoch {7}1$/m);
    const state = await client.inspect(key);
    assert.equal(state?.held, true);
    assert.match(result.stdout, new RegExp(`owner {7}${state!.owner!.replace(/[.]/g, '\\.')}`));
  });

  test('a lease taken with --json can be renewed and released with what it printed', async () => {
    const key = uniqueKey();
    const acquired = parseJson(
      await runCli(['acquire', '--url', db.url, '--key', key, '--ttl', '30s', '--json']),
    );
    assert.equal(acquired.acquired, true);
    assert.equal(acquired.key, key);
    assert.equal(acquired.epoch, '1');
    assert.equal(typeof acquired.owner, 'string');
    assert.ok(!Number.isNaN(Date.parse(acquired.expiresAt as string)));
    const grant = ['--key', key, '--owner', acquired.owner as string, '--epoch', '1'];

    const renewed = await runCli(['renew', '--url', db.url, ...grant, '--ttl', '1 min', '--json']);
    assert.equal(renewed.code, 0, renewed.stderr);
    assert.equal(parseJson(renewed).status, 'ok');
    assert.ok(
      Date.parse(parseJson(renewed).expiresAt as string) > Date.parse(acquired.expiresAt as string),
    );

    const released = await runCli(['release', '--url', db.url, ...grant]);
    assert.equal(released.code, 0, released.stderr);
    assert.equal(released.stdout.trim(), `ok: ${key} released`);

    const inspected = parseJson(await runCli(['inspect', '--url', db.url, '--key', key, '--json']));
    assert.deepEqual(inspected, {
      key,
      state: 'free',
      held: false,
      owner: null,
      epoch: '2',
      expiresAt: null,
    });
  });

  test('acquire exits 75 when another owner holds the key, and when --wait runs out', async () => {
    const key = uniqueKey();
    const holder = (await client.acquire(key, { ttl: '30s' }))!;
    const held = await runCli(['acquire', '--url', db.url, '--key', key, '--ttl', '30s']);
    assert.equal(held.code, 75);
    assert.match(held.stdout, /not acquired: .* is held by another owner/);
    const timedOut = await runCli([
      'acquire',
      '--url',
      db.url,
      '--key',
      key,
      '--ttl',
      '30s',
      '--wait',
      '200ms',
      '--json',
    ]);
    assert.equal(timedOut.code, 75);
    assert.deepEqual(parseJson(timedOut), { acquired: false, key, reason: 'timeout' });
    await holder.release();
  });

  test('renew and release exit 76 with the status when the lease is not theirs', async () => {
    const key = uniqueKey();
    const lease = (await client.acquire(key, { ttl: '30s', owner: 'holder' }))!;
    const stale = await runCli([
      'renew',
      '--url',
      db.url,
      '--key',
      key,
      '--owner',
      'holder',
      '--epoch',
      String(lease.epoch + 1n),
      '--ttl',
      '30s',
    ]);
    assert.equal(stale.code, 76);
    assert.equal(stale.stdout.trim(), `epoch_mismatch: ${key} was not renewed`);
    const stranger = await runCli([
      'release',
      '--url',
      db.url,
      '--key',
      key,
      '--owner',
      'stranger',
      '--epoch',
      String(lease.epoch),
      '--json',
    ]);
    assert.equal(stranger.code, 76);
    assert.deepEqual(parseJson(stranger), { key, status: 'not_owner' });
    await lease.release();
  });

  test('inspect tells a held key, a free key and a key never leased apart', async () => {
    const key = uniqueKey();
    const never = await runCli(['inspect', '--url', db.url, '--key', key]);
    assert.equal(never.code, 0);
    assert.equal(never.stdout.trim(), `${key}: never leased`);
    const lease = (await client.acquire(key, { ttl: '30s', owner: 'holder' }))!;
    const held = await runCli(['inspect', '--url', db.url, '--key', key]);
    assert.match(held.stdout, new RegExp(`^${key}: held by holder, epoch 1, expires at `));
    await lease.release();
    const free = await runCli(['inspect', '--url', db.url, '--key', key]);
    assert.equal(
      free.stdout.trim(),
      `${key}: free (released or lapsed); epoch 2 and older are stale`,
    );
  });

  test('epochs beyond 2^53 pass through the command line exactly', async () => {
    const key = uniqueKey();
    await (await client.acquire(key, { ttl: '30s' }))!.release();
    await db.pool.query('UPDATE lease.leases SET epoch = $2 WHERE key = $1', [
      key,
      '9007199254740993',
    ]);
    const acquired = parseJson(
      await runCli(['acquire', '--url', db.url, '--key', key, '--ttl', '30s', '--json']),
    );
    assert.equal(acquired.epoch, '9007199254740994');
    const released = await runCli([
      'release',
      '--url',
      db.url,
      '--key',
      key,
      '--owner',
      acquired.owner as string,
      '--epoch',
      '9007199254740994',
    ]);
    assert.equal(released.code, 0, released.stdout + released.stderr);
  });

  test('uses DATABASE_URL when --url is not given', async () => {
    const key = uniqueKey();
    const result = await runCli(['inspect', '--key', key], { DATABASE_URL: db.url });
    assert.equal(result.code, 0, result.stderr);
    assert.equal(result.stdout.trim(), `${key}: never leased`);
  });
});

describe('pg-lease errors and usage', () => {
  test('invalid input exits 64 naming each option and the value given for it', async () => {
    const result = await runCli(['acquire', '--url', db.url, '--key', '', '--ttl', '0']);
    assert.equal(result.code, 64);
    assert.match(
      result.stderr,
      /^pg-lease: invalid input: --key "" must be a non-empty string; --ttl "0" must be a positive finite interval$/m,
    );
    assert.match(result.stderr, /^hint: --key is non-empty text .*; --ttl is a duration/m);
    const json = await runCli(['acquire', '--url', db.url, '--key', 'k', '--ttl=-1s', '--json']);
    assert.equal(json.code, 64);
    assert.equal(json.stderr, '');
    assert.deepEqual(parseJson(json), {
      error: {
        code: 'invalid_input',
        message: 'invalid input: --ttl "-1s" must be a positive finite interval',
        hint: '--ttl is a duration with a unit, above zero: 30s, 500ms, 1min (at most 1000 years, in steps of 1ms)',
        violations: ['--ttl "-1s" must be a positive finite interval'],
      },
    });
  });

  test('a value that starts with a dash is judged as a value, not as an option', async () => {
    const result = await runCli(['acquire', '--url', db.url, '--key', 'k', '--ttl', '-5s']);
    assert.equal(result.code, 64);
    assert.match(result.stderr, /--ttl "-5s" must be a positive finite interval/);
    assert.doesNotMatch(result.stderr, /ambiguous/);
  });

  test('text that is not a duration is reported as unreadable, not as out of range', async () => {
    const result = await runCli(['acquire', '--url', db.url, '--key', 'k', '--ttl', '5 parsecs']);
    assert.equal(result.code, 64);
    assert.match(result.stderr, /--ttl "5 parsecs" is not a duration/);
    assert.doesNotMatch(result.stderr, /positive/);
  });

  test('a bare number has no unit and is refused, as in the library', async () => {
    const result = await runCli(['acquire', '--url', db.url, '--key', 'k', '--ttl', '30']);
    assert.equal(result.code, 64);
    assert.match(result.stderr, /--ttl "30" has no unit: write 30s, 30ms or 30min/);
    assert.equal(
      await db.pool.query("SELECT 1 FROM lease.inspect('k')").then((r) => r.rowCount),
      0,
    );
  });

  test('an epoch beyond bigint exits 64 naming it, before anything is sent', async () => {
    const huge = '99999999999999999999999';
    const result = await runCli([
      'renew',
      '--url',
      'postgresql://postgres@127.0.0.1:1/x',
      ...['--key', 'k', '--owner', 'o', '--epoch', huge, '--ttl', '30s'],
    ]);
    assert.equal(result.code, 64, result.stderr);
    assert.match(result.stderr, new RegExp(`--epoch must be a 64-bit integer, got ${huge}`));
  });

  test('usage errors under --json are printed as JSON too', async () => {
    const missing = await runCli(['acquire', '--url', db.url, '--ttl', '30s', '--json']);
    assert.equal(missing.code, 64);
    assert.deepEqual(parseJson(missing), {
      error: {
        code: 'usage',
        message: '--key is required',
        hint: '--key is non-empty text of at most 1000 bytes',
      },
    });
    const unknown = await runCli(['frobnicate', '--json']);
    assert.equal(unknown.code, 64);
    assert.deepEqual(parseJson(unknown), {
      error: {
        code: 'usage',
        message: 'unknown command "frobnicate"',
        hint: 'run pg-lease --help',
      },
    });
  });

  test('a database without pg_lease gets a hint to run pg-lease install', async () => {
    const bare = await createTestDatabase({ extension: false });
    try {
      const result = await runCli(['inspect', '--url', bare.url, '--key', 'k']);
      assert.equal(result.code, 1);
      assert.match(result.stderr, /schema "lease" does not exist/);
      assert.match(
        result.stderr,
        /^hint: pg_lease is not installed in this database; run: pg-lease install$/m,
      );
      const json = await runCli(['inspect', '--url', bare.url, '--key', 'k', '--json']);
      assert.match(
        String((parseJson(json).error as { hint?: unknown }).hint),
        /run: pg-lease install/,
      );
    } finally {
      await bare.close();
    }
  });

  test('a bad command line exits 64 with a pointer to --help', async () => {
    const missing = await runCli(['acquire', '--url', db.url, '--ttl', '30s']);
    assert.equal(missing.code, 64);
    assert.match(missing.stderr, /^pg-lease: --key is required\nhint: --key is non-empty text/m);
    const unknown = await runCli(['inspect', '--url', db.url, '--key', 'k', '--bogus']);
    assert.equal(unknown.code, 64);
    assert.equal(
      unknown.stderr,
      'pg-lease: unknown option --bogus\nhint: run pg-lease inspect --help\n',
    );
    const noCommand = await runCli(['frobnicate']);
    assert.equal(noCommand.code, 64);
    assert.match(
      noCommand.stderr,
      /^pg-lease: unknown command "frobnicate"\nhint: run pg-lease --help$/m,
    );
    const badEpoch = await runCli([
      'release',
      '--url',
      db.url,
      '--key',
      'k',
      '--owner',
      'o',
      '--epoch',
      'one',
    ]);
    assert.equal(badEpoch.code, 64);
  });

  test('--help prints the usage and exits 0', async () => {
    const main = await runCli(['--help']);
    assert.equal(main.code, 0);
    assert.match(main.stdout, /^Usage: pg-lease <command>/);
    const exec = await runCli(['exec', '--help']);
    assert.equal(exec.code, 0);
    assert.match(exec.stdout, /PG_LEASE_EPOCH/);
  });

  test('an unreachable database exits 1 with the reason', async () => {
    const result = await runCli([
      'inspect',
      '--url',
      'postgresql://postgres@127.0.0.1:1/x',
      '--key',
      'k',
    ]);
    assert.equal(result.code, 1);
    assert.match(result.stderr, /^pg-lease: .*ECONNREFUSED/);
  });
});

/**
 * Issue 32, item 4, on the command line: arguments arrive as bytes, and Node.js reads bytes that
 * are not UTF-8 as U+FFFD, so `--key $'caf\xe9'` and `--key $'caf\xff'` would be one key.
 */
describe('pg-lease: text that is not UTF-8', () => {
  /** `pg-lease args...` from a shell, where `$(printf ...)` can put any bytes in an argument. */
  function runShell(args: string): Promise<CliResult> {
    const child = spawn('/bin/sh', ['-c', `exec "$0" "$1" ${args}`, process.execPath, CLI], {
      env: { ...process.env, DATABASE_URL: db.url },
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    return new Promise((resolve, reject) => {
      child.once('error', reject);
      child.once('close', (code, signal) => resolve({ code, signal, stdout, stderr }));
    });
  }

  test('a key, owner or prefix given as bytes that are not UTF-8 is invalid input; nothing is acquired', async () => {
    const key = uniqueKey('cli-bytes');
    const acquired = await runShell(
      `acquire --key "${key}-$(printf 'caf\\351')" --owner "$(printf 'w\\377')" --ttl 30s --json`,
    );
    assert.equal(acquired.code, 64, acquired.stderr);
    const { error } = parseJson(acquired) as { error: { code: string; violations: string[] } };
    assert.equal(error.code, 'invalid_input');
    assert.deepEqual(error.violations, [
      `--key "${key}-caf\uFFFD" must be valid UTF-8 (the command line gave other bytes)`,
      '--owner "w\uFFFD" must be valid UTF-8 (the command line gave other bytes)',
    ]);
    assert.equal(await client.inspect(`${key}-caf\uFFFD`), null);

    const listed = await runShell(`list --prefix="$(printf '\\351')"`);
    assert.equal(listed.code, 64, listed.stderr);
    assert.match(
      listed.stderr,
      /^pg-lease: invalid input: --prefix "\uFFFD" must be valid UTF-8 \(the command line gave other bytes\)$/m,
    );

    // Text that is UTF-8, including U+FFFD itself, is taken as it is.
    const fine = await runShell(
      `acquire --key "${key}-$(printf 'caf\\303\\251 \\357\\277\\275')" --ttl 30s`,
    );
    assert.equal(fine.code, 0, fine.stderr);
    assert.equal((await client.inspect(`${key}-café \uFFFD`))?.held, true);
  });
});
