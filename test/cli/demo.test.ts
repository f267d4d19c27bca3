import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { PACKAGE_ROOT } from 'pg-lease-testing';
import { after, before, describe, test } from 'node:test';
import { createTestDatabase, type TestDatabase } from '../support/database.js';

import { CLI, runCli, type CliResult } from './helpers.js';

let db: TestDatabase;

before(async () => {
  db = await createTestDatabase({ extension: false });
});
after(() => db.close());

/** The story the demo must tell, in this order. */
function assertStory(result: CliResult, job: RegExp): void {
  assert.equal(result.code, 0, result.stdout + result.stderr);
  // The race: three attempts, one winner, in whatever order the workers are listed.
  const race = result.stdout.match(/worker-\w\s+acquire job-42\S* \(ttl 2s\): .*/g) ?? [];
  assert.equal(race.filter((line) => line.endsWith('granted, epoch 1')).length, 1, race.join('\n'));
  assert.equal(race.filter((line) => line.endsWith('denied, held by another worker')).length, 2);
  const steps = [
    /fenced write "step 1" with epoch 1: accepted/,
    /heartbeat: renew ok, epoch still 1/,
    /hangs: stops renewing/,
    /lease\.signal aborted, status "expired"/,
    /granted after \d+\.\ds, epoch 2 \(greater than 1\)/,
    /fenced write "step 1 \(redone\)" with epoch 2: accepted/,
    /renew\(epoch 1\): not_owner/,
    /fenced write "step 2" with epoch 1: REJECTED by the database: pg_lease: stale epoch \(key "job-42\S*": epoch 1 presented, but the key is held under epoch 2\)/,
    /acquire \S+ \(ttl 2s\): granted, epoch 1; other keys are independent/,
    /held by worker-\w, epoch 2/,
    /release \S+: ok/,
    /free, epoch 3/,
  ];
  let rest = result.stdout;
  for (const step of steps) {
    const match = step.exec(rest);
    assert.ok(match, `missing, or out of order: ${step}\n--- output ---\n${result.stdout}`);
    rest = rest.slice(match.index + match[0].length);
  }
  assert.match(result.stdout, job);
}

async function refusesConnections(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    socket.once('connect', () => {
      socket.destroy();
      resolve(false);
    });
    socket.once('error', () => resolve(true));
  });
}

describe('pg-lease demo', () => {
  test('tells the whole story on a throwaway server, then removes it', async () => {
    const started = Date.now();
    const result = await runCli(['demo'], {}, 60_000);
    assertStory(result, /Final output of job-42: "step 1 \(redone\)" written under epoch 2/);
    assert.ok(Date.now() - started < 60_000);
    const port = Number(/up on 127\.0\.0\.1:(\d+)/.exec(result.stdout)?.[1]);
    assert.ok(port > 0, result.stdout);
    assert.ok(await refusesConnections(port), 'the demo server is still running');
    assert.match(result.stdout, /the throwaway server is stopped and removed/);
  });

  test('without pg-lease-testing installed, the demo says what to install and exits 1', () => {
    // The built CLI beside every package of the repository but pg-lease-testing, as in a
    // project that installed only pg-lease.
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-lease-no-harness-'));
    try {
      fs.cpSync(path.dirname(path.dirname(CLI)), path.join(dir, 'dist', 'src'), {
        recursive: true,
      });
      fs.writeFileSync(path.join(dir, 'package.json'), '{"type":"module"}\n');
      fs.mkdirSync(path.join(dir, 'node_modules'));
      const modules = path.join(PACKAGE_ROOT, 'node_modules');
      for (const name of fs.readdirSync(modules))
        if (name !== 'pg-lease-testing' && !name.startsWith('.'))
          fs.symlinkSync(path.join(modules, name), path.join(dir, 'node_modules', name));
      const result = spawnSync(
        process.execPath,
        [path.join(dir, 'dist', 'src', 'cli', 'main.js'), 'demo'],
        {
          encoding: 'utf8',
        },
      );
      assert.equal(result.status, 1, result.stdout + result.stderr);
      assert.match(
        result.stderr,
        /^pg-lease: the demo starts its throwaway server with pg-lease-testing, which is not installed/m,
      );
      assert.match(result.stderr, /npm install --save-dev pg-lease-testing/);
      assert.match(result.stderr, /pg-lease demo --url/);
      assert.doesNotMatch(result.stderr, /pg-lease: pg-lease:/);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  test('--url runs the same story on an existing database and drops its table', async () => {
    const result = await runCli(['demo', '--url', db.url], {}, 60_000);
    assertStory(result, /Final output of job-42-[0-9a-f]{6}: "step 1 \(redone\)"/);
    const { rows } = await db.pool.query(
      "SELECT 1 FROM pg_tables WHERE tablename LIKE 'jobs_output%'",
    );
    assert.equal(rows.length, 0);
    const installed = await db.pool.query(
      "SELECT extversion FROM pg_extension WHERE extname = 'pg_lease'",
    );
    assert.equal(installed.rows.length, 1);
  });
});
