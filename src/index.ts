/**
 * pg-lease: time-bounded, fenced leases stored in PostgreSQL (the pg_lease extension), for
 * node-postgres.
 *
 * @example
 * import pg from 'pg';
 * import { LeaseClient } from 'pg-lease';
 *
 * const client = new LeaseClient(new pg.Pool({ connectionString: process.env.DATABASE_URL }));
 * await client.withLease('job-42', { ttl: '30s' }, async (lease, signal) => {
 *   await work({ epoch: lease.epoch, signal });
 * });
 */
export {
  LeaseClient,
  type AcquireManyOptions,
  type AcquireOptions,
  type LeaseClientOptions,
  type LeaseDatabase,
  type LeaseHolder,
  type LeaseState,
  type RenewResult,
} from './client.js';
export { Lease, type LeaseStatus } from './lease.js';
export { type KeepAliveOptions } from './keeper.js';
export { NOTIFY_CHANNEL, type WaitingOptions } from './wait.js';
export {
  Election,
  type ElectionEvents,
  type ElectionOptions,
  type Leader,
  type Leadership,
} from './election.js';
export {
  ACQUIRE_TIMEOUT_MESSAGE,
  INVALID_INPUT_MESSAGE,
  LeaseAbortedError,
  LeaseError,
  LeaseFencedError,
  LeaseInvalidInputError,
  LeaseLostError,
  LeaseNotAcquiredError,
  LeaseReadOnlyError,
  LeaseTimeoutError,
  SQLSTATE,
  STALE_EPOCH_MESSAGE,
  type LeaseErrorCode,
  type LostStatus,
} from './errors.js';
export {
  fencedTransaction,
  type FencedGrant,
  type FencedIsolation,
  type FencedOptions,
} from './fence.js';
export { parseInterval, type Duration } from './duration.js';
export {
  installedPgLease,
  installPgLease,
  PgLeaseDowngradeError,
  type InstallMethod,
  type InstallResult,
} from './install.js';
export { defaultOwner } from './owner.js';
export {
  LEASE_CHANNELS,
  subscribeLeaseEvents,
  type AcquiredEvent,
  type AcquireLateEvent,
  type ConnectionErrorEvent,
  type LeaseEventBase,
  type LeaseEventHandlers,
  type LeaseEvents,
  type LostEvent,
  type NotAcquiredEvent,
  type ReleasedEvent,
  type RenewalFailedEvent,
  type RenewedEvent,
} from './events.js';
export {
  listLeases,
  purgeLeases,
  type ListedLease,
  type ListOptions,
  type PurgeOptions,
} from './operations.js';
