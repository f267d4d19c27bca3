/**
 * What a user gets from npm: packs `pg-lease` and `pg-lease-testing` as `npm publish` would,
 * checks what the tarballs carry, installs them into a fresh project whose every other
 * dependency comes from the registry, and uses them there as the README says:
 *
 * - a strict TypeScript file compiles against the published declarations of both packages;
 * - compiled, it runs the client against a harness server;
 * - `npx pg-lease --help` works with pg-lease alone, and `npx pg-lease demo` names what to
 *   install until pg-lease-testing is installed, and then runs.
 *
 * Usage: node dist/scripts/pack-check.js [--keep]   (--keep leaves the temp project in place)
 * Exits non-zero on the first thing that is wrong.
 */
import { spawnSync, type SpawnSyncOptions } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { strictConsumerTsconfig } from './consumer-tsconfig.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const keep = process.argv.includes('--keep');

/** A consumer written as a user would: both packages, strict mode, `await using`. */
const CONSUMER = `
import assert from 'node:assert/strict';
import pg from 'pg';
import { LeaseClient, LeaseInvalidInputError, type Lease } from 'pg-lease';
import { PgCluster } from 'pg-lease-testing';
import { spawn } from 'node:child_process';
import { once } from 'node:events';

await using cluster = await PgCluster.start();
const url = await cluster.createDatabase();
const pool = new pg.Pool({ connectionString: url });
try {
  const leases = new LeaseClient(pool, { owner: 'pack-check' });
  const lease: Lease | null = await leases.acquire('job', { ttl: '30s' });
  assert.ok(lease, 'a free key is granted');
  const epoch: bigint = lease.epoch;
  assert.equal(epoch, 1n);
  assert.ok((await lease.renew('1 min')).getTime() > Date.now());
  await lease.release();
  assert.equal((await leases.inspect('job'))?.epoch, 2n);
  await assert.rejects(leases.acquire('', { ttl: '30s' }), LeaseInvalidInputError);

  // The installed binary started directly, as docs/cli.md tells supervisors to: SIGTERM to
  // pg-lease reaches the command, pg-lease exits 143, and the lease is released.
  const exec = spawn(
    './node_modules/.bin/pg-lease',
    ['exec', '--url', url, '--key', 'signalled', '--ttl', '30s', '--', process.execPath, '-e',
     'console.log(process.pid); setInterval(() => {}, 1000)'],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const [firstLine] = (await once(exec.stdout, 'data')) as [Buffer];
  const commandPid = Number(firstLine.toString());
  exec.kill('SIGTERM');
  const [code] = (await once(exec, 'exit')) as [number | null];
  assert.equal(code, 143, 'pg-lease exec exits 128 + SIGTERM');
  assert.throws(() => process.kill(commandPid, 0), { code: 'ESRCH' }, 'the command is gone');
  assert.ok(await leases.acquire('signalled', { ttl: '30s' }), 'the lease was released');
  console.log('pack-check consumer: acquire, renew, release, inspect, exec and SIGTERM ok on PostgreSQL', cluster.installation.version);
} finally {
  await pool.end();
}
`;

function run(command: string, args: string[], options: SpawnSyncOptions = {}): string {
  const result = spawnSync(command, args, { encoding: 'utf8', ...options });
  if (result.status !== 0) {
    throw new Error(
      `${command} ${args.join(' ')} exited ${result.status ?? result.signal}\n` +
        `${String(result.stdout ?? '')}${String(result.stderr ?? '')}`,
    );
  }
  return String(result.stdout ?? '');
}

function step(what: string): void {
  console.log(`pack-check: ${what}`);
}

/** `npm pack` runs the package's prepack (the build), so this packs what publish would. */
function pack(into: string, workspace?: string): string {
  const args = ['pack', '--json', '--pack-destination', into];
  if (workspace) args.push('--workspace', workspace);
  const [result] = JSON.parse(run('npm', args, { cwd: ROOT })) as { filename: string }[];
  if (!result) throw new Error('npm pack reported no tarball');
  return path.join(into, result.filename);
}

function tarballFiles(tarball: string): Set<string> {
  return new Set(
    run('tar', ['-tzf', tarball])
      .split('\n')
      .filter(Boolean)
      .map((entry) => entry.replace(/^package\//, '')),
  );
}

/** Problems with a tarball's contents: missing essentials, dead relative links, dangling maps. */
function contentProblems(tarball: string, essentials: string[]): string[] {
  const files = tarballFiles(tarball);
  const problems = essentials
    .filter((file) => !files.has(file))
    .map((file) => `${file} is missing`);
  const unpacked = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-lease-unpacked-'));
  try {
    run('tar', ['-xzf', tarball, '-C', unpacked]);
    const root = path.join(unpacked, 'package');
    for (const file of files) {
      const full = path.join(root, file);
      if (file.endsWith('.md')) {
        const text = fs.readFileSync(full, 'utf8');
        for (const [, target] of text.matchAll(/\]\(([^)\s]+)\)/g)) {
          if (!target || /^[a-z]+:/i.test(target) || target.startsWith('#')) continue;
          const linked = path.normalize(path.join(path.dirname(file), target.split('#')[0]!));
          if (!files.has(linked) && ![...files].some((f) => f.startsWith(`${linked}/`)))
            problems.push(`${file} links to ${target}, which is not in the package`);
        }
      }
      if (file.endsWith('.js.map')) {
        const map = JSON.parse(fs.readFileSync(full, 'utf8')) as { sources: string[] };
        for (const source of map.sources) {
          const resolved = path.normalize(path.join(path.dirname(file), source));
          if (!files.has(resolved))
            problems.push(`${file} points at ${source}, which is not in the package`);
        }
      }
      if (/^dist\/src\/.*\.js$/.test(file) && /pg-lease-testing['"]/.test(readStatic(full)))
        problems.push(`${file} imports pg-lease-testing statically`);
    }
  } finally {
    fs.rmSync(unpacked, { recursive: true, force: true });
  }
  return problems;
}

/** The static import lines of a module (a dynamic import of the harness is allowed). */
function readStatic(file: string): string {
  return fs
    .readFileSync(file, 'utf8')
    .split('\n')
    .filter((line) => /^\s*(import|export)\b.*\bfrom\b/.test(line))
    .join('\n');
}

const work = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-lease-pack-check-'));
fs.chmodSync(work, 0o755);
try {
  step('packing pg-lease and pg-lease-testing (prepack builds them)');
  const client = pack(work);
  const harness = pack(work, 'packages/testing');
  // extension/sql is not in git: prepack has just built it, and the tarball must carry all of it.
  const sqlScripts = fs
    .readdirSync(path.join(ROOT, 'extension', 'sql'))
    .filter((name) => /^pg_lease--.*\.sql$/.test(name))
    .map((name) => `extension/sql/${name}`);
  // ... and the source they are built from, which the shipped Makefile needs for make install.
  const sqlSource = (
    fs.readdirSync(path.join(ROOT, 'extension', 'src'), { recursive: true }) as string[]
  )
    .filter((name) => name.endsWith('.sql'))
    .map((name) => `extension/src/${name.split(path.sep).join('/')}`);
  const problems = [
    ...contentProblems(client, [
      'package.json',
      'LICENSE',
      'README.md',
      'dist/src/index.js',
      'dist/src/index.d.ts',
      'dist/src/cli/main.js',
      'dist/src/generated/sql.js',
      'extension/pg_lease.control',
      ...sqlScripts,
      ...sqlSource,
    ]).map((problem) => `pg-lease: ${problem}`),
    ...contentProblems(harness, [
      'package.json',
      'LICENSE',
      'README.md',
      'dist/index.js',
      'dist/index.d.ts',
    ]).map((problem) => `pg-lease-testing: ${problem}`),
  ];
  for (const file of tarballFiles(client))
    if (file.startsWith('extension/sql/') && !sqlScripts.includes(file))
      problems.push(`pg-lease: ships ${file}, which the build does not make`);
  if ([...tarballFiles(client)].some((file) => /^dist\/(test|scripts|bench)\//.test(file)))
    problems.push('pg-lease: ships compiled tests, scripts or benchmarks');
  for (const [name, tarball] of [
    ['pg-lease', client],
    ['pg-lease-testing', harness],
  ] as const)
    for (const file of tarballFiles(tarball))
      if (file.endsWith('.tsbuildinfo')) problems.push(`${name}: ships build state ${file}`);
  if (problems.length > 0)
    throw new Error(`the tarballs are not right:\n- ${problems.join('\n- ')}`);

  step('installing the tarballs into a fresh project (everything else from the registry)');
  const project = path.join(work, 'project');
  fs.mkdirSync(project);
  fs.writeFileSync(
    path.join(project, 'package.json'),
    JSON.stringify({ name: 'pack-check-consumer', private: true, type: 'module' }, null, 2),
  );
  const typescript = JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8'))
    .devDependencies.typescript as string;
  const install = (...specs: string[]) =>
    run('npm', ['install', '--no-audit', '--no-fund', '--no-package-lock', ...specs], {
      cwd: project,
    });
  install(client, `typescript@${typescript}`, '@types/node@20');

  step('pg-lease alone: npx pg-lease --help and --version work, the demo names what to install');
  const help = run('npx', ['--no-install', 'pg-lease', '--help'], { cwd: project });
  if (!/Usage: pg-lease/.test(help)) throw new Error(`unexpected help text:\n${help}`);
  const version = run('npx', ['--no-install', 'pg-lease', '--version'], { cwd: project });
  const manifest = JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as {
    version: string;
  };
  if (!version.startsWith(`pg-lease ${manifest.version} (`))
    throw new Error(`pg-lease --version said: ${version}`);
  const bare = spawnSync('npx', ['--no-install', 'pg-lease', 'demo'], {
    cwd: project,
    encoding: 'utf8',
  });
  if (bare.status !== 1 || !bare.stderr.includes('npm install --save-dev pg-lease-testing'))
    throw new Error(`the demo without pg-lease-testing said:\n${bare.stdout}${bare.stderr}`);
  if (/pg-lease: pg-lease:/.test(bare.stderr)) throw new Error(`doubled prefix:\n${bare.stderr}`);

  step('installing pg-lease-testing beside it');
  install(harness);

  step('compiling a strict TypeScript consumer against the published declarations');
  fs.writeFileSync(path.join(project, 'consumer.ts'), CONSUMER);
  fs.writeFileSync(
    path.join(project, 'tsconfig.json'),
    strictConsumerTsconfig('consumer.ts', { emit: true }),
  );
  run('npx', ['--no-install', 'tsc', '-p', '.'], { cwd: project });

  step('running the consumer: the client against a harness server');
  process.stdout.write(run(process.execPath, ['consumer.js'], { cwd: project }));

  step('npx pg-lease demo');
  const demo = run('npx', ['--no-install', 'pg-lease', 'demo'], { cwd: project });
  if (!/epoch 2/.test(demo)) throw new Error(`the demo did not tell its story:\n${demo}`);

  step('ok');
} finally {
  if (keep) console.log(`pack-check: kept ${work}`);
  else fs.rmSync(work, { recursive: true, force: true });
}
