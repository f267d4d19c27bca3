/**
 * `pg-lease list`, `watch` and `purge`, run as a user would: a separate process with real
 * arguments; `watch` both with a refresh limit and in a pseudo-terminal (util-linux `script`),
 * where Ctrl-C is a real ^C typed into the terminal.
 */
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { after, before, describe, test } from 'node:test';
import { LeaseClient } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { uniqueKey, waitFor } from '../support/helpers.js';
import { CLI, parseJson, runCli } from './helpers.js';

let db: TestDatabase;
let client: LeaseClient;

before(async () => {
  db = await createTestDatabase();
  client = new LeaseClient(db.pool);
});
after(() => db.close());

/** Keys under one fresh prefix: `a` held by `owner-a`, `b` released, `c` held by `owner-c`. */
async function threeKeys(): Promise<{ prefix: string; epochs: Record<string, bigint> }> {
  const prefix = `${uniqueKey('cli-list')}/`;
  const a = (await client.acquire(`${prefix}a`, { ttl: '1 hour', owner: 'owner-a' }))!;
  const b = (await client.acquire(`${prefix}b`, { ttl: '1 hour', owner: 'owner-b' }))!;
  await b.release();
  const c = (await client.acquire(`${prefix}c`, { ttl: '10 minutes', owner: 'owner-c' }))!;
  return { prefix, epochs: { a: a.epoch, b: b.epoch + 1n, c: c.epoch } };
}

describe('pg-lease list', () => {
  test('prints the held keys of a prefix as a table with owner, epoch and time left', async () => {
    const { prefix } = await threeKeys();
    const result = await runCli(['list', '--url', db.url, '--prefix', prefix]);
    assert.equal(result.code, 0, result.stderr);
    const lines = result.stdout.trimEnd().split('\n');
    assert.match(lines[0]!, /^KEY +STATE +OWNER +EPOCH +TIME LEFT$/);
    assert.equal(lines.length, 3, result.stdout);
    assert.match(lines[1]!, new RegExp(`^${prefix}a +held +owner-a +1 +(59m\\d\\ds|1h00m)$`));
    assert.match(lines[2]!, new RegExp(`^${prefix}c +held +owner-c +1 +\\d+m\\d\\ds$`));
  });

  test('--all adds free keys; --json prints one object with exact epochs', async () => {
    const { prefix, epochs } = await threeKeys();
    const result = await runCli(['list', '--url', db.url, '--prefix', prefix, '--all', '--json']);
    assert.equal(result.code, 0, result.stderr);
    const { leases } = parseJson(result) as { leases: Record<string, unknown>[] };
    assert.deepEqual(
      leases.map((lease) => [lease.key, lease.held, lease.owner, lease.epoch]),
      [
        [`${prefix}a`, true, 'owner-a', String(epochs.a)],
        [`${prefix}b`, false, null, String(epochs.b)],
        [`${prefix}c`, true, 'owner-c', String(epochs.c)],
      ],
    );
    assert.equal(leases[1]!.expiresAt, null);
    assert.ok(Number(leases[0]!.remainingMs) > 59 * 60_000);
  });

  test('says so when no key is held', async () => {
    const result = await runCli(['list', '--url', db.url, '--prefix', uniqueKey('none')]);
    assert.equal(result.code, 0, result.stderr);
    assert.equal(result.stdout.trim(), '(no key is held)');
  });
});

describe('pg-lease purge', () => {
  test('deletes dead keys, keeps held ones, and prints the count', async () => {
    const { prefix } = await threeKeys();
    const result = await runCli(['purge', '--url', db.url, '--older-than', '0', '--json']);
    assert.equal(result.code, 0, result.stderr);
    const { purged, olderThan } = parseJson(result);
    assert.ok(Number(purged) >= 1);
    assert.equal(olderThan, '0');
    const left = await client.list({ prefix, all: true });
    assert.deepEqual(
      left.map((lease) => lease.key),
      [`${prefix}a`, `${prefix}c`],
    );
    const text = await runCli(['purge', '--url', db.url, '--older-than', '7d', '--batch', '100']);
    assert.equal(text.code, 0, text.stderr);
    assert.match(text.stdout, /^purged \d+ keys? free or lapsed for at least 7d$/m);
  });

  test('rejects a bad --older-than with exit 64 and the server DETAIL', async () => {
    const result = await runCli(['purge', '--url', db.url, '--older-than=-1 day']);
    assert.equal(result.code, 64);
    assert.match(
      result.stderr,
      /^pg-lease: invalid input: --older-than "-1 day" must be a non-negative finite interval$/m,
    );
    assert.match(result.stderr, /^hint: --older-than is a duration with a unit: 7d, 12h; 0 takes/m);
    assert.doesNotMatch(result.stderr, /older_than|or milliseconds/);
    const missing = await runCli(['purge', '--url', db.url]);
    assert.equal(missing.code, 64);
    assert.match(missing.stderr, /--older-than is required/);
  });
});

describe('pg-lease watch', () => {
  test('--count N prints N refreshed frames and exits 0; a change shows up in the next frame', async () => {
    const prefix = `${uniqueKey('cli-watch')}/`;
    await client.acquire(`${prefix}first`, { ttl: '1 hour', owner: 'watcher-1' });
    const child = spawn(
      process.execPath,
      [CLI, 'watch', '--url', db.url, '--prefix', prefix, '--interval', '300ms', '--count', '40'],
      { env: { ...process.env } },
    );
    let stdout = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    const exited = new Promise<number | null>((resolve) => child.once('close', resolve));
    await waitFor('the first frame', () => stdout.includes('watcher-1'));
    await client.acquire(`${prefix}second`, { ttl: '1 hour', owner: 'watcher-2' });
    await waitFor('a frame with the second key', () => stdout.includes('watcher-2'));
    child.kill('SIGINT');
    assert.equal(await exited, 0);
    const frames = stdout.trimEnd().split('\n\n');
    assert.ok(frames.length >= 2 && frames.length <= 40, `${frames.length} frames`);
    for (const frame of frames) assert.match(frame, /^pg-lease watch ".*": \d{4}-/);

    const counted = await runCli([
      'watch',
      '--url',
      db.url,
      '--prefix',
      prefix,
      '--interval',
      '50ms',
      '--count',
      '3',
    ]);
    assert.equal(counted.code, 0, counted.stderr);
    assert.equal(counted.stdout.trimEnd().split('\n\n').length, 3);
  });

  test('--json prints one JSON object per refresh', async () => {
    const prefix = `${uniqueKey('cli-watch-json')}/`;
    await client.acquire(`${prefix}k`, { ttl: '1 hour', owner: 'json-owner' });
    const result = await runCli([
      'watch',
      '--url',
      db.url,
      '--prefix',
      prefix,
      '--interval',
      '50ms',
      '--count',
      '2',
      '--json',
    ]);
    assert.equal(result.code, 0, result.stderr);
    const lines = result.stdout.trimEnd().split('\n');
    assert.equal(lines.length, 2);
    for (const line of lines) {
      const frame = JSON.parse(line) as { leases: { owner: string }[] };
      assert.deepEqual(
        frame.leases.map((lease) => lease.owner),
        ['json-owner'],
      );
    }
  });

  const hasScript = spawnSync('script', ['--version']).status === 0;
  test(
    'in a terminal it redraws in place, and a typed Ctrl-C ends it cleanly with the cursor restored',
    { skip: hasScript ? false : 'util-linux script(1) is not installed' },
    async () => {
      const prefix = `${uniqueKey('cli-watch-tty')}/`;
      await client.acquire(`${prefix}k`, { ttl: '1 hour', owner: 'tty-owner' });
      const command = [CLI, 'watch', '--url', db.url, '--prefix', prefix, '--interval', '100ms']
        .map((arg) => `'${arg.replace(/'/g, `'\\''`)}'`)
        .join(' ');
      // script(1) runs the command through $SHELL in a new pseudo-terminal and copies its own
      // stdin there. The Ctrl-C signals every process of the terminal's foreground group, so
      // node must be the only one: SHELL is pinned to /bin/sh (whatever the caller's $SHELL is,
      // a wrapper that stays as node's parent dies of the signal and script reports its 130),
      // and `exec` puts node in that shell's place.
      const child = spawn(
        'script',
        ['-qfec', `exec '${process.execPath}' ${command}`, '/dev/null'],
        {
          env: { ...process.env, SHELL: '/bin/sh', TERM: 'xterm' },
        },
      );
      let output = '';
      child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
      const exited = new Promise<number | null>((resolve) => child.once('close', resolve));
      await waitFor('two frames on the terminal', () => output.split('\x1b[H\x1b[2J').length > 2);
      assert.ok(output.includes('\x1b[?25l'), 'the cursor is hidden while watching');
      assert.match(output, /tty-owner/);
      child.stdin.write('\x03'); // Ctrl-C, as typed: the terminal sends SIGINT
      assert.equal(await exited, 0, output);
      assert.ok(output.trimEnd().endsWith('\x1b[?25h'), 'the cursor is shown again at the end');
      assert.doesNotMatch(output, /Error|at .*\.js:\d+/);
    },
  );
});
