/**
 * Help text has one home, src/cli/help.ts: `pg-lease --help`, every `pg-lease <command> --help`
 * and the reference section of docs/cli.md are rendered from it.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import { describe, test } from 'node:test';
import { COMMAND_HELP, commandHelp, usage } from '../../src/cli/help.js';
import { CLI_DOC, renderedCliDoc } from '../../scripts/cli-doc.js';
import { BUNDLED_VERSION } from '../../src/generated/sql.js';
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
