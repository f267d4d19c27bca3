/**
 * Throwaway Citus clusters: a coordinator and workers, each a {@link PgCluster} of a server
 * build that has the Citus extension installed (Citus is not on npm, so this needs a system
 * build: by default the one `pg_config` on PATH names, or `PG_LEASE_CITUS_PG_CONFIG`).
 *
 * Every node starts with `shared_preload_libraries = citus` on its own free port and private
 * directories (root handling, watchdogs and clean-up are PgCluster's); the cluster's database
 * gets `CREATE EXTENSION citus` on every node, the coordinator registers itself
 * (`citus_set_coordinator_host`) and each worker (`citus_add_node`), and pg_lease is installed
 * on the coordinator. Distributing it is left to the test: `SELECT lease.distribute()`.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import pg from 'pg';
import { PgCluster, type SettingValue } from './cluster.js';
import { findInstallation, type InstallationRequest, type PgInstallation } from './installation.js';

/** Options for {@link startCitusCluster}. */
export interface CitusClusterOptions {
  /** Number of workers (default 2). */
  workers?: number;
  /**
   * The server build of every node; it must have Citus installed. Default: the system build of
   * `PG_LEASE_CITUS_PG_CONFIG`, else of `pg_config` on PATH.
   */
  installation?: PgInstallation | InstallationRequest;
  /** The database that holds the distributed tables (default `citus_test`). */
  database?: string;
  /** Install pg_lease on the coordinator (default true). */
  extension?: boolean;
  /** More server settings of every node. */
  settings?: Record<string, SettingValue>;
  /** As in `ClusterOptions.runAs`. */
  runAs?: string;
}

/** A running Citus cluster; disposing of it destroys every node. */
export interface CitusCluster extends AsyncDisposable {
  readonly coordinator: PgCluster;
  readonly workers: readonly PgCluster[];
  /** The database of the distributed tables, on every node. */
  readonly database: string;
  /** Connection string of that database on the coordinator (or on `node`). */
  url(node?: PgCluster): string;
  /** Runs one statement as the superuser in the cluster's database on the coordinator (or `node`). */
  query<R extends pg.QueryResultRow = pg.QueryResultRow>(
    text: string,
    values?: unknown[],
    node?: PgCluster,
  ): Promise<pg.QueryResult<R>>;
  /** The node (coordinator or worker) holding the shard of `key` in the distributed `table`. */
  nodeOf(table: string, key: string): Promise<PgCluster>;
  destroy(): Promise<void>;
}

/** Settings every node of a harness Citus cluster starts with. */
const CITUS_SETTINGS: Record<string, string> = {
  shared_preload_libraries: 'citus',
  // Citus commits a transaction that wrote on several nodes with two-phase commit.
  max_prepared_transactions: '100',
  // Small clusters on shared machines: fewer background workers and connections.
  'citus.max_background_task_executors': '1',
  'citus.shard_count': '8',
  // The nodes talk over loopback as the superuser, without TLS (the default requires it, and
  // libpq of a server running as nobody would look for certificates in root's home).
  'citus.node_conninfo': 'sslmode=disable',
};

/**
 * The system build named by `PG_LEASE_CITUS_PG_CONFIG` or `pg_config` on PATH, or undefined
 * when there is none.
 */
export function findCitusInstallation(
  request?: PgInstallation | InstallationRequest,
): PgInstallation | undefined {
  if (request) return 'versionString' in request ? request : findInstallation(request);
  try {
    return findInstallation({ pgConfig: process.env.PG_LEASE_CITUS_PG_CONFIG ?? 'pg_config' });
  } catch {
    return undefined;
  }
}

/**
 * Why Citus clusters cannot be started here (no system build, or Citus not installed in it),
 * or undefined when they can. For a test's `skip` reason.
 */
export function citusMissingReason(
  request?: PgInstallation | InstallationRequest,
): string | undefined {
  const installation = findCitusInstallation(request);
  if (!installation)
    return 'no system PostgreSQL build (pg_config not on PATH, PG_LEASE_CITUS_PG_CONFIG unset)';
  const control = path.join(installation.sharedir, 'extension', 'citus.control');
  const library = path.join(installation.pkglibdir, 'citus.so');
  if (!fs.existsSync(control) || !fs.existsSync(library))
    return (
      `Citus is not installed in PostgreSQL ${installation.version} (${installation.pkglibdir}): ` +
      `no ${fs.existsSync(control) ? library : control}; install it (in this repository's CI: ` +
      `../shared/citus/install.sh as root)`
    );
  return undefined;
}

/**
 * Starts a coordinator and `workers` workers, joins them into one Citus cluster in `database`
 * and installs pg_lease on the coordinator.
 *
 * @example
 * await using citus = await startCitusCluster();
 * await citus.query('SELECT lease.distribute()');
 * const client = new pg.Client(citus.url());
 */
export async function startCitusCluster(options: CitusClusterOptions = {}): Promise<CitusCluster> {
  const missing = citusMissingReason(options.installation);
  if (missing) throw new Error(`pg-lease-testing: cannot start a Citus cluster: ${missing}`);
  const installation = findCitusInstallation(options.installation)!;
  const database = options.database ?? 'citus_test';
  const settings = { ...CITUS_SETTINGS, ...options.settings };
  const count = options.workers ?? 2;

  const nodes: PgCluster[] = [];
  const destroy = async () => {
    await Promise.all(nodes.map((node) => node.destroy()));
  };
  try {
    // One at a time: each start stages the build (the first) and runs initdb.
    for (let i = 0; i <= count; i++)
      nodes.push(await PgCluster.start({ installation, settings, runAs: options.runAs }));
    const [coordinator, ...workers] = nodes as [PgCluster, ...PgCluster[]];

    await Promise.all(
      nodes.map(async (node) => {
        await node.createDatabase(database, { extension: false });
        await node.query('CREATE EXTENSION citus', [], database);
      }),
    );
    await coordinator.query(
      'SELECT pg_catalog.citus_set_coordinator_host($1, $2)',
      [coordinator.host, coordinator.port],
      database,
    );
    for (const worker of workers)
      await coordinator.query(
        'SELECT pg_catalog.citus_add_node($1, $2)',
        [worker.host, worker.port],
        database,
      );
    if (options.extension ?? true)
      await coordinator.query('CREATE EXTENSION pg_lease', [], database);

    const byPort = new Map(nodes.map((node) => [node.port, node]));
    const cluster: CitusCluster = {
      coordinator,
      workers,
      database,
      url: (node = coordinator) => node.url(database),
      query: (text, values = [], node = coordinator) => node.query(text, values, database),
      async nodeOf(table, key) {
        const { rows } = await coordinator.query<{ port: number }>(
          `SELECT p.nodeport AS port
             FROM pg_catalog.pg_dist_shard_placement AS p
            WHERE p.shardid = pg_catalog.get_shard_id_for_distribution_column($1::regclass, $2::text)`,
          [table, key],
          database,
        );
        const node = rows[0] && byPort.get(Number(rows[0].port));
        if (!node)
          throw new Error(`pg-lease-testing: no node holds the shard of ${key} in ${table}`);
        return node;
      },
      destroy,
      [Symbol.asyncDispose]: destroy,
    };
    return cluster;
  } catch (error) {
    await destroy();
    throw error;
  }
}
