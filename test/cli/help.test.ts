/**
 * Help text has one home, src/cli/help.ts: `pg-lease --help`, every `pg-lease <command> --help`
 * and the reference section of docs/cli.md are rendered from it.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { LeaseClient } from '../../src/index.js';
import { COMMAND_HELP, commandHelp, synopsisLine, usage } from '../../src/cli/help.js';
import { CLI_DOC, renderedCliDoc } from '../../scripts/cli-doc.js';
import { BUNDLED_VERSION } from '../../src/generated/sql.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { uniqueKey } from '../support/helpers.js';
import { runCli } from './helpers.js';

describe('help text', () => {
  test('pg-lease --help is the table rendered, and lists every command', async () => {
    const result = await runCli(['--help']);
    assert.equal(result.code, 0);
    assert.equal(result.stdout, `${usage()}\n`);
    for (const { name } of COMMAND_HELP)
      assert.match(result.stdout, new RegExp(`^  ${name} `, 'm'));
  });

  test('every command answers --help with its row of the table', async () => {
    for (const { name } of COMMAND_HELP) {
      const result = await runCli([name, '--help']);
      assert.equal(result.code, 0, `${name}: ${result.stderr}`);
      assert.equal(result.stdout, `${commandHelp(name)}\n`, name);
    }
  });

  test('pg-lease --version names the package version and the extension version it bundles', async () => {
    const manifest = JSON.parse(
      fs.readFileSync(new URL('../../../package.json', import.meta.url), 'utf8'),
    ) as { version: string };
    for (const flag of ['--version', '-V']) {
      const result = await runCli([flag]);
      assert.equal(result.code, 0, result.stderr);
      assert.equal(
        result.stdout,
        `pg-lease ${manifest.version} (bundles the pg_lease extension ${BUNDLED_VERSION})\n`,
      );
    }
    assert.equal(
      manifest.version,
      BUNDLED_VERSION,
      'the package and its extension are released together',
    );
    const harness = JSON.parse(
      fs.readFileSync(new URL('../../../packages/testing/package.json', import.meta.url), 'utf8'),
    ) as { version: string; peerDependencies: Record<string, string> };
    assert.equal(harness.version, manifest.version, 'pg-lease-testing is released with pg-lease');
    assert.equal(harness.peerDependencies['pg-lease'], `^${manifest.version}`);
  });

  test('docs/cli.md carries the same text (node dist/scripts/cli-doc.js rewrites it)', () => {
    const current = fs.readFileSync(CLI_DOC, 'utf8');
    assert.ok(
      renderedCliDoc(current) === current,
      'docs/cli.md is out of date with src/cli/help.ts; run node dist/scripts/cli-doc.js',
    );
  });
});

describe('usage lines in docs/cli.md', () => {
  /** Every line of a code block that is a command's usage line (`pg-lease <command> ...`, no `$`). */
  function usageLines(): string[] {
    const doc = fs.readFileSync(CLI_DOC, 'utf8');
    const names = new Set(COMMAND_HELP.map((command) => command.name));
    const lines: string[] = [];
    for (const block of doc.split('```').filter((_, i) => i % 2 === 1))
      for (const line of block.split('\n'))
        if (line.startsWith('pg-lease ') && names.has(line.split(' ')[1]!)) lines.push(line);
    return lines;
  }

  test('each is the usage line of --help (help.ts), and every command has one', () => {
    const lines = usageLines();
    for (const line of lines) assert.equal(line, synopsisLine(line.split(' ')[1]!));
    for (const { name } of COMMAND_HELP) assert.ok(lines.includes(synopsisLine(name)), name);
  });

  let db: TestDatabase;
  let client: LeaseClient;
  before(async () => {
    db = await createTestDatabase();
    client = new LeaseClient(db.pool);
  });
  after(() => db.close());

  test('each runs as written, every optional part given, against a real server', async () => {
    const bare = await createTestDatabase({ extension: false });
    try {
      for (const line of new Set(usageLines())) {
        const name = line.split(' ')[1]!;
        const key = uniqueKey('usage');
        const owner = 'usage-owner';
        let epoch = '1';
        if (line.includes('--epoch')) {
          const lease = (await client.acquire(key, { ttl: '1 hour', owner }))!;
          epoch = lease.epoch.toString();
        }
        const values: Record<string, string> = {
          '--key': key,
          '--owner': owner,
          '--epoch': epoch,
          '--ttl': '30s',
          '--wait': '1s',
          '--grace': '1s',
          '--prefix': 'usage:',
          '--interval': '100ms',
          '--count': '2',
          '--older-than': '7d',
          '--batch': '100',
          '--limit': '2',
          '--url': name === 'install' ? bare.url : db.url,
        };
        const args: string[] = [];
        let previous = '';
        // Of alternatives (`[--limit N | --shared]`) the first is given.
        const given = line.replace(/\[([^\]|]*?) \|[^\]]*\]/g, '[$1]');
        for (const token of given.replace(/[[\]]/g, '').split(' ').slice(1)) {
          if (token === 'command') args.push(process.execPath);
          else if (token === 'args...') args.push('-e', 'process.exit(0)');
          else if (token.startsWith('--') || args.length === 0) args.push(token);
          else {
            assert.ok(previous in values, `no value for ${previous} ${token} in: ${line}`);
            args.push(values[previous]!);
          }
          previous = token;
        }
        const result = await runCli(args, {}, 60_000);
        assert.equal(
          result.code,
          0,
          `${line}\n${args.join(' ')}\n${result.stdout}${result.stderr}`,
        );
        if (args.includes('--json'))
          for (const output of result.stdout.trimEnd().split('\n'))
            assert.doesNotThrow(() => JSON.parse(output), `${line}: not JSON: ${output}`);
      }
    } finally {
      await bare.close();
    }
  });
});
