/**
 * Installing pg_lease into a database: `CREATE EXTENSION` where the extension's files are on
 * the server, or the same objects from the install script bundled in this package, for managed
 * PostgreSQL services that take no extension files.
 */
import pg from 'pg';
import { BUNDLED_INSTALL_SCRIPT, BUNDLED_VERSION } from './generated/sql.js';

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
  /** False when pg_lease was already installed and nothing was done. */
  created: boolean;
}

/** Marks a schema installed from the bundle, since no pg_extension row records it. */
const BUNDLE_COMMENT_PREFIX = 'pg_lease ';
const BUNDLE_COMMENT_SUFFIX = ' (installed from the pg-lease npm bundle)';

/**
 * Installs pg_lease in the database `database` connects to, unless it is there already.
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
  const existing = await installedPgLease(database);
  if (existing) return { ...existing, created: false };
  if (!options.fromBundle) {
    await database.query('CREATE EXTENSION pg_lease');
  } else {
    await database.query('BEGIN');
    try {
      // As CREATE EXTENSION would: the script expects its schema first on the search_path.
      await database.query('CREATE SCHEMA lease');
      await database.query('SET LOCAL search_path = lease, pg_catalog');
      await database.query(bundledScriptBody());
      await database.query(
        `COMMENT ON SCHEMA lease IS ${pg.escapeLiteral(BUNDLE_COMMENT_PREFIX + BUNDLED_VERSION + BUNDLE_COMMENT_SUFFIX)}`,
      );
      await database.query('COMMIT');
    } catch (error) {
      await database.query('ROLLBACK').catch(() => undefined);
      throw error;
    }
  }
  const installed = await installedPgLease(database);
  if (!installed) throw new Error('pg_lease: installation finished but pg_lease is not there');
  return { ...installed, created: true };
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
  const { rows } = await database.query<{ extversion: string | null; comment: string | null }>(
    `SELECT (SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'pg_lease') AS extversion,
            (SELECT pg_catalog.obj_description(oid, 'pg_namespace')
               FROM pg_catalog.pg_namespace WHERE nspname = 'lease') AS comment`,
  );
  const { extversion, comment } = rows[0]!;
  if (extversion) return { version: extversion, method: 'extension' };
  if (comment?.startsWith(BUNDLE_COMMENT_PREFIX) && comment.endsWith(BUNDLE_COMMENT_SUFFIX))
    return {
      version: comment.slice(BUNDLE_COMMENT_PREFIX.length, -BUNDLE_COMMENT_SUFFIX.length),
      method: 'bundle',
    };
  return null;
}

/**
 * The bundled install script as plain SQL: without the psql guard line (`\echo ... \quit`),
 * and without `pg_extension_config_dump` calls, which only work inside CREATE EXTENSION and
 * are not needed outside one: pg_dump dumps a plain schema's table data anyway.
 */
export function bundledScriptBody(): string {
  return BUNDLED_INSTALL_SCRIPT.replace(/^\\echo .*\\quit[^\n]*$/m, '').replace(
    /^\s*SELECT\s+(?:pg_catalog\.)?pg_extension_config_dump\s*\([^;]*\);[^\n]*$/gim,
    '',
  );
}
