/**
 * What the npm package ships: type declarations a consumer compiles against, and the install
 * script bundled from extension/sql.
 */
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { describe, test } from 'node:test';
import {
  BUNDLED_INSTALL_SCRIPT,
  BUNDLED_SCRIPT_NAME,
  BUNDLED_VERSION,
} from '../../src/generated/sql.js';
import { PACKAGE_ROOT } from 'pg-lease-testing';
import { strictConsumerTsconfig } from '../../scripts/consumer-tsconfig.js';

/** A consumer of the published package, written as a user would, strict mode. */
const CONSUMER = `
import pg from 'pg';
import {
  installPgLease,
  LeaseClient,
  LeaseError,
  LeaseInvalidInputError,
  LeaseLostError,
  LeaseTimeoutError,
  SQLSTATE,
  type Lease,
  type LeaseState,
  type LeaseStatus,
  type LostStatus,
} from 'pg-lease';

export async function consume(pool: pg.Pool): Promise<bigint | null> {
  const { version }: { version: string } = await installPgLease(await pool.connect());
  const client = new LeaseClient(pool, { owner: 'me' });
  await using lease = await client.acquire('job', { ttl: '30s', wait: 1_000, keepAlive: true });
  if (!lease) return null;
  const epoch: bigint = lease.epoch;
  const expiresAt: Date = await lease.renew('1 min');
  const signal: AbortSignal = lease.signal;
  const status: LeaseStatus = await client.release('job', { owner: 'me', epoch });
  const state: LeaseState | null = await client.inspect('job');
  const lost: LostStatus | undefined = lease.lost?.status;
  const total = await client.withLease('job', { ttl: 5_000 }, async (held: Lease, s: AbortSignal) =>
    held.key.length + (s.aborted ? 1 : 0),
  );
  void [version, expiresAt, signal, status, state, lost, total, SQLSTATE.QUERY_CANCELED];
  try {
    await client.acquire('', { ttl: 0 });
  } catch (error) {
    if (error instanceof LeaseInvalidInputError) console.log(error.detail, error.violations);
    if (error instanceof LeaseTimeoutError) console.log(error.key);
    if (error instanceof LeaseLostError) console.log(error.status satisfies LostStatus);
    if (error instanceof LeaseError) console.log(error.code);
  }
  // @ts-expect-error epochs are bigints, never numbers
  const wrong: number = lease.epoch;
  void wrong;
  // @ts-expect-error ttl is required
  await client.acquire('job', {});
  return epoch;
}
`;

describe('published package', () => {
  test('its type declarations compile a strict consumer', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-lease-consumer-'));
    try {
      const modules = path.join(dir, 'node_modules');
      fs.mkdirSync(path.join(modules, '@types'), { recursive: true });
      fs.symlinkSync(PACKAGE_ROOT, path.join(modules, 'pg-lease'));
      fs.symlinkSync(path.join(PACKAGE_ROOT, 'node_modules', 'pg'), path.join(modules, 'pg'));
      for (const types of ['node', 'pg'])
        fs.symlinkSync(
          path.join(PACKAGE_ROOT, 'node_modules', '@types', types),
          path.join(modules, '@types', types),
        );
      fs.writeFileSync(path.join(dir, 'package.json'), '{"type":"module"}\n');
      fs.writeFileSync(path.join(dir, 'consumer.ts'), CONSUMER);
      fs.writeFileSync(
        path.join(dir, 'tsconfig.json'),
        strictConsumerTsconfig('consumer.ts', { emit: false }),
      );
      const tsc = path.join(PACKAGE_ROOT, 'node_modules', 'typescript', 'bin', 'tsc');
      const result = spawnSync(process.execPath, [tsc, '-p', dir], { encoding: 'utf8' });
      assert.equal(result.status, 0, result.stdout + result.stderr);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  test('bundles the install script from extension/sql byte for byte', () => {
    const file = path.join(PACKAGE_ROOT, 'extension', 'sql', BUNDLED_SCRIPT_NAME);
    // A plain comparison: a diff of two 25 kB scripts would drown the report.
    assert.ok(
      BUNDLED_INSTALL_SCRIPT === fs.readFileSync(file, 'utf8'),
      `the bundled script differs from ${file}; run npm run build`,
    );
    const control = fs.readFileSync(
      path.join(PACKAGE_ROOT, 'extension', 'pg_lease.control'),
      'utf8',
    );
    assert.match(control, new RegExp(`default_version\\s*=\\s*'${BUNDLED_VERSION}'`));
  });

  test('every TSDoc example imports only what the package exports', async () => {
    const exported = new Set(Object.keys(await import('../../src/index.js')));
    const declarations = fs.readFileSync(
      path.join(PACKAGE_ROOT, 'dist', 'src', 'index.d.ts'),
      'utf8',
    );
    const missing: string[] = [];
    const sourceDir = path.join(PACKAGE_ROOT, 'src');
    for (const file of fs.readdirSync(sourceDir, { recursive: true }) as string[]) {
      if (!file.endsWith('.ts')) continue;
      const text = fs.readFileSync(path.join(sourceDir, file), 'utf8');
      for (const [, names] of text.matchAll(
        /^\s*\* import (?:type )?\{([^}]*)\} from 'pg-lease';/gm,
      )) {
        for (const raw of names!.split(',')) {
          const isType = raw.trim().startsWith('type ');
          const name = raw.replace(/^\s*type\s+/, '').trim();
          if (!name) continue;
          const found = isType
            ? new RegExp(`\\b(type )?${name}\\b`).test(declarations)
            : exported.has(name) || new RegExp(`\\btype ${name}\\b`).test(declarations);
          if (!found) missing.push(`${file}: ${name}`);
        }
      }
    }
    assert.deepEqual(missing, [], 'TSDoc examples import symbols pg-lease does not export');
  });

  test('the generated source is up to date with extension/sql', () => {
    execFileSync(process.execPath, [
      path.join(PACKAGE_ROOT, 'scripts', 'generate-sql.mjs'),
      '--check',
    ]);
  });
});
