/**
 * The SQL scripts have one recipe, two implementations: extension/Makefile (PGXS, for
 * `make install`) and scripts/generate-sql.mjs (for `npm run build` on machines without make).
 * These tests run make on copies of the extension's source and compare its scripts, byte for
 * byte, with what generate-sql.mjs writes: for the source as it is, and for made-up later
 * versions, so that both derive the same chains from the file names in src/upgrade.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, test } from 'node:test';
import { pathToFileURL } from 'node:url';
import { PACKAGE_ROOT } from 'pg-lease-testing';
import { builtScripts, copyExtensionSource, make, skipWithoutMake } from '../support/releases.js';

interface Generator {
  extensionScripts(dir: string): Map<string, Buffer>;
}
const generator = (await import(
  pathToFileURL(path.join(PACKAGE_ROOT, 'scripts', 'generate-sql.mjs')).href
)) as Generator;

const skip = skipWithoutMake();

/** Asserts two sets of scripts are the same files with the same bytes. */
function assertSameScripts(actual: Map<string, Buffer>, expected: Map<string, Buffer>, what: string) {
  assert.deepEqual([...actual.keys()].sort(), [...expected.keys()].sort(), `${what}: file names`);
  for (const [name, bytes] of expected)
    // A plain comparison: a diff of two 125 kB scripts would drown the report.
    assert.ok(actual.get(name)!.equals(bytes), `${what}: ${name} differs`);
}

describe('make and scripts/generate-sql.mjs build the same scripts', () => {
  test('make builds what npm run build wrote to extension/sql, and make clean removes it', { skip }, () => {
    const source = copyExtensionSource();
    try {
      const built = make(source.dir);
      assert.equal(built.status, 0, built.stdout + built.stderr);
      const fromMake = builtScripts(source.dir);
      assert.ok(fromMake.size >= 2, 'make built the install script and an update script');
      assertSameScripts(fromMake, builtScripts(path.join(PACKAGE_ROOT, 'extension')), 'extension/sql');
      assertSameScripts(fromMake, generator.extensionScripts(source.dir), 'generate-sql.mjs');
      const cleaned = make(source.dir, 'clean');
      assert.equal(cleaned.status, 0, cleaned.stdout + cleaned.stderr);
      assert.deepEqual(builtScripts(source.dir), new Map());
    } finally {
      source.rm();
    }
  });

  test('both chain later steps the same way: one direct script from every earlier version', { skip }, () => {
    const source = copyExtensionSource();
    try {
      const upgrade = path.join(source.dir, 'src', 'upgrade');
      const released = fs.readdirSync(upgrade).map((name) => name.split('--')[0]!);
      const current = /^default_version = '([^']+)'/m.exec(
        fs.readFileSync(path.join(source.dir, 'pg_lease.control'), 'utf8'),
      )![1]!;
      // 0.10.0 after 0.9.0: an order by file name alone would put it first.
      fs.writeFileSync(path.join(upgrade, `${current}--0.9.0.sql`), '-- step to 0.9.0\n');
      fs.writeFileSync(path.join(upgrade, '0.9.0--0.10.0.sql'), '-- step to 0.10.0 (no final newline)');
      const control = path.join(source.dir, 'pg_lease.control');
      fs.writeFileSync(
        control,
        fs.readFileSync(control, 'utf8').replace(/^default_version = .*$/m, "default_version = '0.10.0'"),
      );
      const built = make(source.dir);
      assert.equal(built.status, 0, built.stdout + built.stderr);
      const fromMake = builtScripts(source.dir);
      assertSameScripts(fromMake, generator.extensionScripts(source.dir), 'generate-sql.mjs');
      const sources = [...released, current, '0.9.0'];
      assert.deepEqual(
        [...fromMake.keys()].sort(),
        ['pg_lease--0.10.0.sql', ...sources.map((from) => `pg_lease--${from}--0.10.0.sql`)].sort(),
      );
      for (const from of sources) {
        const script = fromMake.get(`pg_lease--${from}--0.10.0.sql`)!.toString('utf8');
        const steps = [...script.matchAll(/^-- step to (\S+)/gm)].map((match) => match[1]);
        assert.deepEqual(steps, from === '0.9.0' ? ['0.10.0'] : ['0.9.0', '0.10.0'], from);
        assert.match(script, /\\echo Use "ALTER EXTENSION pg_lease UPDATE TO '0\.10\.0'" to load/);
      }
      assert.ok(
        fromMake.get('pg_lease--0.1.0--0.10.0.sql')!.toString('utf8').includes(' * Update from 0.1.0.'),
        'the update from 0.1.0 starts with its own step',
      );
    } finally {
      source.rm();
    }
  });

  test('both refuse a step that leads nowhere', { skip }, () => {
    const source = copyExtensionSource();
    try {
      fs.writeFileSync(path.join(source.dir, 'src', 'upgrade', '0.0.1--0.0.2.sql'), '-- orphan\n');
      const built = make(source.dir);
      assert.notEqual(built.status, 0, 'make refused');
      assert.match(built.stderr, /no step from 0\.0\.2 in src\/upgrade/);
      assert.throws(() => generator.extensionScripts(source.dir), /no step from 0\.0\.2 in src\/upgrade/);
    } finally {
      source.rm();
    }
  });
});
