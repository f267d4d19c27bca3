/**
 * Installing pg_lease into a database: `CREATE EXTENSION` where the extension's files are on
 * the server, or the same objects from the install script bundled in this package, for managed
 * PostgreSQL services that take no extension files.
 */
import type pg from 'pg';
import {
  BUNDLED_INSTALL_SCRIPT,
  BUNDLED_UPDATE_SCRIPTS,
  BUNDLED_VERSION,
} from './generated/sql.js';
import {
  availableExtensionVersion,
  createExtension,
  readPgLeaseCatalog,
  runBundleScripts,
  updateExtension,
} from './sql/install.js';

/**
 * How pg_lease got into a database: `extension` (CREATE EXTENSION) or `bundle` (the package's
 * bundled script, see {@link installPgLease}).
 *
 * @example
 * import type { InstallMethod } from 'pg-lease';
 * const method: InstallMethod = 'bundle';
 */
export type InstallMethod = 'extension' | 'bundle';

/**
 * The outcome of {@link installPgLease}.
 *
 * @example
 * import type { InstallResult } from 'pg-lease';
 * const say = (r: InstallResult) => `pg_lease ${r.version} (${r.method})${r.created ? '' : ', already there'}`;
 */
export interface InstallResult {
  /** The installed version. */
  version: string;
  method: InstallMethod;
  /** False when pg_lease was already installed (and at most updated). */
  created: boolean;
  /** The version found before an update; absent when nothing was updated. */
  updatedFrom?: string;
}

/**
 * Thrown by {@link installPgLease} when the database has a newer pg_lease than this package can
 * install: downgrades are not supported.
 *
 * @example
 * import { installPgLease, PgLeaseDowngradeError } from 'pg-lease';
 * try { await installPgLease(client); } catch (e) { if (e instanceof PgLeaseDowngradeError) console.error(e.installed); }
 */
export class PgLeaseDowngradeError extends Error {
  override readonly name = 'PgLeaseDowngradeError';
  constructor(
    readonly installed: string,
    readonly available: string,
  ) {
    super(
      `pg_lease ${installed} is installed, newer than the ${available} this package installs; ` +
        'downgrades are not supported',
    );
  }
}

/** Compares dotted versions numerically: negative when a < b. */
function compareVersions(a: string, b: string): number {
  const x = a.split('.').map(Number);
  const y = b.split('.').map(Number);
  for (let i = 0; i < Math.max(x.length, y.length); i++) {
    const d = (x[i] ?? 0) - (y[i] ?? 0);
    if (d !== 0) return d;
  }
  return 0;
}

/** The bundled update scripts that lead from `from` to the bundled version, in order. */
function updatePath(from: string): string[] {
  const scripts: string[] = [];
  for (let at = from; at !== BUNDLED_VERSION;) {
    const step = BUNDLED_UPDATE_SCRIPTS.find((update) => update.from === at);
    if (!step) throw new Error(`pg_lease: no bundled update from ${at} to ${BUNDLED_VERSION}`);
    scripts.push(step.script);
    at = step.to;
  }
  return scripts;
}

/** Marks a schema installed from the bundle, since no pg_extension row records it. */
const BUNDLE_COMMENT_PREFIX = 'pg_lease ';
const BUNDLE_COMMENT_SUFFIX = ' (installed from the pg-lease npm bundle)';

/**
 * Installs pg_lease in the database `database` connects to, or brings the pg_lease it has up to
 * date: an extension with `ALTER EXTENSION pg_lease UPDATE` (to the server's default version),
 * a bundle install with the bundled update scripts, in one transaction, keeping every lease.
 * A database with a newer pg_lease than the one available gets {@link PgLeaseDowngradeError}.
 *
 * Default: `CREATE EXTENSION pg_lease` (needs the extension files on the server; a trusted
 * extension, so CREATE on the database is enough). With `fromBundle`, runs the install script
 * bundled in this package instead, in one transaction: `CREATE SCHEMA lease`, then the script
 * without its `\echo ... \quit` guard. The objects are the same, but they belong to the
 * installing role rather than to an extension, so `DROP SCHEMA lease CASCADE` removes them and
 * `ALTER EXTENSION ... UPDATE` does not apply.
 *
 * @example
 * import pg from 'pg';
 * import { installPgLease } from 'pg-lease';
 * const client = new pg.Client({ connectionString: process.env.DATABASE_URL });
 * await client.connect();
 * const { version } = await installPgLease(client, { fromBundle: true });
 * await client.end();
 */
export async function installPgLease(
  database: pg.ClientBase,
  options: { fromBundle?: boolean } = {},
): Promise<InstallResult> {
  const existing = await findPgLease(database);
  if (existing?.method === 'bundle' && !existing.mine)
    throw new Error(
      `pg_lease: schema lease holds a bundle install owned by role ${existing.owner}; ` +
        `connect as that role to install or update it`,
    );
  if (existing) return updatePgLease(database, existing);
  if (!options.fromBundle) await createExtension(database);
  else
    await runBundleScripts(database, [scriptBody(BUNDLED_INSTALL_SCRIPT)], {
      createSchema: true,
      comment: bundleComment(BUNDLED_VERSION),
    });
  const installed = await installedPgLease(database);
  if (!installed) throw new Error('pg_lease: installation finished but pg_lease is not there');
  return { ...installed, created: true };
}

/**
 * Brings an installed pg_lease to the newest version available: `ALTER EXTENSION pg_lease
 * UPDATE` for the extension (to the server's default version), the bundled update scripts in
 * one transaction for a bundle install. A newer installed version is refused.
 */
async function updatePgLease(
  database: pg.ClientBase,
  existing: { version: string; method: InstallMethod },
): Promise<InstallResult> {
  let target = BUNDLED_VERSION;
  if (existing.method === 'extension')
    target = (await availableExtensionVersion(database)) ?? existing.version;
  const order = compareVersions(existing.version, target);
  if (order > 0) throw new PgLeaseDowngradeError(existing.version, target);
  if (order === 0) return { version: existing.version, method: existing.method, created: false };
  if (existing.method === 'extension') await updateExtension(database, target);
  else
    await runBundleScripts(database, updatePath(existing.version).map(scriptBody), {
      createSchema: false,
      comment: bundleComment(BUNDLED_VERSION),
    });
  const installed = await installedPgLease(database);
  if (!installed || installed.version !== target)
    throw new Error(`pg_lease: the update to ${target} finished but pg_lease is not at ${target}`);
  return { ...installed, created: false, updatedFrom: existing.version };
}

/** The comment that marks schema lease as a bundle install of `version`. */
function bundleComment(version: string): string {
  return BUNDLE_COMMENT_PREFIX + version + BUNDLE_COMMENT_SUFFIX;
}

/**
 * Which pg_lease the database has: the extension's version, or the version recorded by a
 * bundle install; `null` when it has none.
 *
 * @example
 * import { installedPgLease } from 'pg-lease';
 * const installed = await installedPgLease(client); // { version: '0.1.0', method: 'extension' }
 */
export async function installedPgLease(
  database: pg.ClientBase,
): Promise<{ version: string; method: InstallMethod } | null> {
  const found = await findPgLease(database);
  return found && { version: found.version, method: found.method };
}

/**
 * What {@link installedPgLease} reports, plus for a bundle install the owner of schema lease
 * and whether the connection's role is that owner. A bundle install is marked only by the
 * schema's comment, which any role that could make schema lease could also write: so a bundle
 * counts as pg_lease's only when its schema and every function in it belong to one role.
 */
async function findPgLease(
  database: pg.ClientBase,
): Promise<{ version: string; method: InstallMethod; owner?: string; mine?: boolean } | null> {
  const { extversion, comment, owner, mine, consistent } = await readPgLeaseCatalog(database);
  if (extversion) return { version: extversion, method: 'extension' };
  if (comment?.startsWith(BUNDLE_COMMENT_PREFIX) && comment.endsWith(BUNDLE_COMMENT_SUFFIX)) {
    if (!consistent)
      throw new Error(
        `pg_lease: schema lease says it holds a bundle install, but not all of its objects belong ` +
          `to its owner ${owner}; it is not pg_lease's, and nothing was done`,
      );
    return {
      version: comment.slice(BUNDLE_COMMENT_PREFIX.length, -BUNDLE_COMMENT_SUFFIX.length),
      method: 'bundle',
      owner: owner!,
      mine: mine!,
    };
  }
  return null;
}

/**
 * A bundled script as plain SQL: without the psql guard line (`\echo ... \quit`), and without
 * `pg_extension_config_dump` calls, which only work inside CREATE EXTENSION and are not needed
 * outside one: pg_dump dumps a plain schema's table data anyway.
 */
function scriptBody(script: string): string {
  return script
    .replace(/^\\echo .*\\quit[^\n]*$/m, '')
    .replace(/^\s*SELECT\s+(?:pg_catalog\.)?pg_extension_config_dump\s*\([^;]*\);[^\n]*$/gim, '');
}
