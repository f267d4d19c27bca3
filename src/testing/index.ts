/**
 * Test harness: throwaway PostgreSQL clusters with pg_lease installed.
 *
 * @example
 * import { PgCluster } from 'pg-lease/testing';
 * await using cluster = await PgCluster.start();
 * const url = await cluster.createDatabase();
 */
export { PgCluster, type ClusterOptions, type StopMode } from './cluster.js';
export {
  DEFAULT_MAJOR,
  SUPPORTED_MAJORS,
  findInstallation,
  findSystemPgConfig,
  stageInstallation,
  type InstallationRequest,
  type PgInstallation,
} from './installation.js';
