/**
 * pg-lease-testing: throwaway PostgreSQL clusters with pg_lease installed.
 *
 * @example
 * import { PgCluster } from 'pg-lease-testing';
 * await using cluster = await PgCluster.start();
 * const url = await cluster.createDatabase();
 */
export {
  PgCluster,
  type ClusterOptions,
  type KeepPolicy,
  type PollOptions,
  type SettingValue,
  type StopMode,
} from './cluster.js';
export { portLockDir, reservePort, type PortReservation } from './ports.js';
export {
  DEFAULT_MAJOR,
  EMBEDDED_VERSIONS,
  PACKAGE_ROOT,
  extensionFiles,
  SUPPORTED_MAJORS,
  findInstallation,
  findSystemPgConfig,
  missingBinariesMessage,
  stageInstallation,
  type InstallationRequest,
  type PgInstallation,
} from './installation.js';
export {
  promote,
  setSynchronousStandbys,
  startStandby,
  waitForReplay,
  waitForStreaming,
  type Standby,
  type StandbyOptions,
} from './standby.js';
export { PgBouncer, findPgBouncer, startPgBouncer, type PgBouncerOptions } from './pgbouncer.js';
export {
  citusMissingReason,
  findCitusInstallation,
  startCitusCluster,
  type CitusCluster,
  type CitusClusterOptions,
} from './citus.js';
