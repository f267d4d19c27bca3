/**
 * The statements that install or update pg_lease (see install.ts for the choices between
 * them): CREATE EXTENSION or ALTER EXTENSION ... UPDATE, or the bundled scripts in one
 * transaction with the schema comment that marks a bundle install; and the catalog query that
 * tells which pg_lease a database has.
 */
import pg from 'pg';

/**
 * What the catalogs say about pg_lease in the database: the extension's version, the comment
 * and owner of schema lease, whether the connection's role owns it, and whether every object
 * in it belongs to that owner (NULLs where there is no such extension or schema). @internal
 */
export interface PgLeaseCatalog {
  extversion: string | null;
  comment: string | null;
  owner: string | null;
  mine: boolean | null;
  consistent: boolean | null;
}

/** Reads {@link PgLeaseCatalog}. @internal */
export async function readPgLeaseCatalog(database: pg.ClientBase): Promise<PgLeaseCatalog> {
  const { rows } = await database.query<PgLeaseCatalog>(
    `SELECT (SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'pg_lease') AS extversion,
            pg_catalog.obj_description(n.oid, 'pg_namespace') AS comment,
            n.nspowner::pg_catalog.regrole::text AS owner,
            n.nspowner = current_user::pg_catalog.regrole AS mine,
            NOT EXISTS (SELECT FROM pg_catalog.pg_proc AS p
                         WHERE p.pronamespace = n.oid AND p.proowner <> n.nspowner)
            AND NOT EXISTS (SELECT FROM pg_catalog.pg_class AS c
                             WHERE c.relnamespace = n.oid AND c.relowner <> n.nspowner) AS consistent
       FROM (SELECT 1) AS one
       LEFT JOIN pg_catalog.pg_namespace AS n ON n.nspname = 'lease'`,
  );
  return rows[0]!;
}

/** The version `CREATE EXTENSION pg_lease` would install on the server, if it has the files. @internal */
export async function availableExtensionVersion(database: pg.ClientBase): Promise<string | null> {
  const { rows } = await database.query<{ default_version: string | null }>(
    `SELECT default_version FROM pg_catalog.pg_available_extensions WHERE name = 'pg_lease'`,
  );
  return rows[0]?.default_version ?? null;
}

/** CREATE EXTENSION pg_lease. @internal */
export async function createExtension(database: pg.ClientBase): Promise<void> {
  await database.query('CREATE EXTENSION pg_lease');
}

/** ALTER EXTENSION pg_lease UPDATE TO `version`. @internal */
export async function updateExtension(database: pg.ClientBase, version: string): Promise<void> {
  await database.query(`ALTER EXTENSION pg_lease UPDATE TO ${pg.escapeLiteral(version)}`);
}

/**
 * Runs `scripts` (plain SQL) in one transaction, after `CREATE SCHEMA lease` when
 * `createSchema` (as CREATE EXTENSION would: an install script expects its schema to exist),
 * then sets schema lease's comment to `comment`, which marks a bundle install. @internal
 */
export async function runBundleScripts(
  database: pg.ClientBase,
  scripts: readonly string[],
  options: { createSchema: boolean; comment: string },
): Promise<void> {
  await database.query('BEGIN');
  try {
    if (options.createSchema) await database.query('CREATE SCHEMA lease');
    for (const script of scripts) await database.query(script);
    await database.query(`COMMENT ON SCHEMA lease IS ${pg.escapeLiteral(options.comment)}`);
    await database.query('COMMIT');
  } catch (error) {
    await database.query('ROLLBACK').catch(() => undefined);
    throw error;
  }
}
