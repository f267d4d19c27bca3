/**
 * Errors raised by the client, shaped like node-postgres': one base class with `name` set, a
 * `code` string union, and the driver error kept as `cause`. Errors the client does not
 * recognise are rethrown untouched, never wrapped.
 */

/**
 * SQLSTATEs pg_lease raises, by their PostgreSQL condition names.
 *
 * @example
 * import { SQLSTATE } from 'pg-lease';
 * if ((error as { code?: string }).code === SQLSTATE.QUERY_CANCELED) console.log('cancelled');
 */
export const SQLSTATE = {
  /** `22023`: invalid input to any pg_lease function. */
  INVALID_PARAMETER_VALUE: '22023',
  /** `57014`: a blocking acquire ran out of wait, and also statement_timeout or a user cancel. */
  QUERY_CANCELED: '57014',
  /** `PLF01`: `lease.fence` (or a `lease.fence_row` trigger) refused an epoch that is not live. */
  STALE_EPOCH: 'PLF01',
  /** `25006`: a writing call on a hot standby or in a read-only transaction. */
  READ_ONLY_SQL_TRANSACTION: '25006',
} as const;

/**
 * Message prefix of the server's invalid-input error (the DETAIL lists the violations).
 *
 * @example
 * import { INVALID_INPUT_MESSAGE } from 'pg-lease';
 * error.message.startsWith(INVALID_INPUT_MESSAGE);
 */
export const INVALID_INPUT_MESSAGE = 'pg_lease: invalid input';

/**
 * Message prefix of the server's acquire timeout. A statement_timeout or a cancel request
 * shares its SQLSTATE (57014) but not this message, which is how the two are told apart.
 *
 * @example
 * import { ACQUIRE_TIMEOUT_MESSAGE } from 'pg-lease';
 * error.message.startsWith(ACQUIRE_TIMEOUT_MESSAGE);
 */
export const ACQUIRE_TIMEOUT_MESSAGE = 'pg_lease: acquire timed out';

/**
 * Message of the server's fence refusal (SQLSTATE `PLF01`; the DETAIL says what stands now).
 *
 * @example
 * import { STALE_EPOCH_MESSAGE } from 'pg-lease';
 * error.message === STALE_EPOCH_MESSAGE;
 */
export const STALE_EPOCH_MESSAGE = 'pg_lease: stale epoch';

/**
 * What went wrong, one value per situation:
 * - `invalid_input`: an argument breaks the server's input rules ({@link LeaseInvalidInputError}).
 * - `acquire_timeout`: a blocking acquire ran out of wait ({@link LeaseTimeoutError}).
 * - `not_acquired`: `withLease` found the key held by another owner ({@link LeaseNotAcquiredError}).
 * - `lease_lost`: the lease is gone or can no longer be confirmed ({@link LeaseLostError}).
 * - `lease_released`: the handle was released; the reason its `signal` carries afterwards.
 * - `in_transaction`: the connection is inside a transaction block, so the call was refused.
 * - `stale_epoch`: a fenced transaction was refused: its epoch is not the key's live grant
 *   ({@link LeaseFencedError}).
 * - `read_only`: a writing call reached a hot standby or a read-only session ({@link LeaseReadOnlyError}).
 * - `unconfirmed_commit`: the call's commit waited for a synchronous standby and the wait was
 *   cancelled: committed on the primary only, so a failover may lose it. Treat it as failed.
 * - `aborted`: the caller's `signal` ended a waiting acquire ({@link LeaseAbortedError}).
 *
 * @example
 * import type { LeaseErrorCode } from 'pg-lease';
 * const retryable: LeaseErrorCode[] = ['acquire_timeout', 'not_acquired'];
 */
export type LeaseErrorCode =
  | 'invalid_input'
  | 'acquire_timeout'
  | 'not_acquired'
  | 'lease_lost'
  | 'lease_released'
  | 'in_transaction'
  | 'stale_epoch'
  | 'read_only'
  | 'unconfirmed_commit'
  | 'aborted';

/**
 * Why a lease was lost: the server's status for a renew that did not succeed, or `expired` when
 * the client's conservative deadline (send time of the last confirmed renew + remaining ttl)
 * passed before a renewal could be confirmed. After `expired` the server may still list the
 * lease for a moment, but the holder must already have stopped acting on it.
 *
 * @example
 * import type { LostStatus } from 'pg-lease';
 * const takenOver = (status: LostStatus) => status === 'not_owner';
 */
export type LostStatus = 'not_owner' | 'lapsed' | 'epoch_mismatch' | 'expired';

/**
 * Base class of every error the client raises itself; test `code` rather than the class when
 * convenient.
 *
 * @example
 * import { LeaseError } from 'pg-lease';
 * try {
 *   await client.acquire('job-42', { ttl: '30s', wait: '5s' });
 * } catch (error) {
 *   if (error instanceof LeaseError && error.code === 'acquire_timeout') console.log('busy');
 *   else throw error;
 * }
 */
export class LeaseError extends Error {
  override name = 'LeaseError';
  /** Which situation this is; see {@link LeaseErrorCode}. */
  readonly code: LeaseErrorCode;

  constructor(code: LeaseErrorCode, message: string, options?: ErrorOptions) {
    super(message, options);
    this.code = code;
  }
}

/**
 * Invalid input (SQLSTATE 22023), raised with the same message and DETAIL whether the client
 * caught it before sending or the server raised it. `cause` is the driver error when the
 * server raised it.
 *
 * @example
 * import { LeaseInvalidInputError } from 'pg-lease';
 * try {
 *   await client.acquire('', { ttl: 0 });
 * } catch (error) {
 *   if (error instanceof LeaseInvalidInputError) console.log(error.violations);
 *   // ['key must be a non-empty string', 'ttl must be a positive finite interval']
 * }
 */
export class LeaseInvalidInputError extends LeaseError {
  override name = 'LeaseInvalidInputError';
  /** Always `22023`. */
  readonly sqlState = SQLSTATE.INVALID_PARAMETER_VALUE;
  /** Every violated constraint, joined by `; ` (the server's DETAIL). */
  readonly detail: string;
  /** A hint on how to fix the input, when there is one. */
  readonly hint: string | undefined;

  constructor(detail: string, options?: ErrorOptions & { message?: string; hint?: string }) {
    super('invalid_input', options?.message ?? INVALID_INPUT_MESSAGE, options);
    this.detail = detail;
    this.hint = options?.hint;
  }

  /** The violated constraints, one per entry. */
  get violations(): string[] {
    return this.detail.split('; ');
  }
}

/**
 * A blocking acquire (`wait` > 0) found the key held for the whole wait. `cause` is the
 * server's 57014 error. A statement_timeout or a cancel is not this error: those are rethrown
 * as the driver raised them.
 *
 * @example
 * import { LeaseTimeoutError } from 'pg-lease';
 * try {
 *   await client.acquire('job-42', { ttl: '30s', wait: '10s' });
 * } catch (error) {
 *   if (!(error instanceof LeaseTimeoutError)) throw error;
 *   console.log(`${error.key} stayed busy`);
 * }
 */
export class LeaseTimeoutError extends LeaseError {
  override name = 'LeaseTimeoutError';
  /** Always `57014`. */
  readonly sqlState = SQLSTATE.QUERY_CANCELED;
  /** The key that stayed held. */
  readonly key: string;
  /** The server's DETAIL (names the key and the wait). */
  readonly detail: string | undefined;

  constructor(key: string, options?: ErrorOptions & { message?: string; detail?: string }) {
    super('acquire_timeout', options?.message ?? ACQUIRE_TIMEOUT_MESSAGE, options);
    this.key = key;
    this.detail = options?.detail;
  }
}

/**
 * A writing call (acquire, renew, release) reached a server or session that cannot write: a
 * hot standby (a replica, or a connection string that names one), or a session with
 * `default_transaction_read_only` on. Leases are written on the primary only; `inspect` still
 * works on a standby. `cause` is the server's 25006 error.
 *
 * @example
 * import { LeaseReadOnlyError } from 'pg-lease';
 * try {
 *   await client.acquire('job-42', { ttl: '30s' });
 * } catch (error) {
 *   if (error instanceof LeaseReadOnlyError) console.error('DATABASE_URL names a replica');
 *   else throw error;
 * }
 */
export class LeaseReadOnlyError extends LeaseError {
  override name = 'LeaseReadOnlyError';
  /** Always `25006`. */
  readonly sqlState = SQLSTATE.READ_ONLY_SQL_TRANSACTION;
  /** The server's message, e.g. `pg_lease: acquire needs a read-write transaction`. */
  readonly serverMessage: string;

  constructor(serverMessage: string, options?: ErrorOptions) {
    super(
      'read_only',
      `pg_lease: cannot write leases here (${serverMessage}): the server is a hot standby or the ` +
        'session is read-only; leases are acquired, renewed and released on the primary only, so ' +
        'connect to the primary (inspect works on a standby)',
      options,
    );
    this.serverMessage = serverMessage;
  }
}

/**
 * The caller's `signal` aborted an acquire before it was granted. Nothing is held: a grant that
 * raced the abort was released again, and no statement of the wait is left running on the
 * server. `cause` is the signal's reason.
 *
 * @example
 * import { LeaseAbortedError } from 'pg-lease';
 * const stop = AbortSignal.timeout(1_000);
 * try {
 *   await client.acquire('job-42', { ttl: '30s', wait: '1 min', signal: stop });
 * } catch (error) {
 *   if (!(error instanceof LeaseAbortedError)) throw error;
 * }
 */
export class LeaseAbortedError extends LeaseError {
  override name = 'LeaseAbortedError';
  /** The key that was waited for. */
  readonly key: string;

  constructor(key: string, options?: ErrorOptions) {
    super('aborted', `pg_lease: the acquire of ${JSON.stringify(key)} was aborted`, options);
    this.key = key;
  }
}

/**
 * `withLease` could not start because another owner holds the key (and `wait` was 0 or absent).
 *
 * @example
 * import { LeaseNotAcquiredError } from 'pg-lease';
 * try {
 *   await client.withLease('nightly-report', { ttl: '1m' }, async () => build());
 * } catch (error) {
 *   if (error instanceof LeaseNotAcquiredError) console.log('another node runs it');
 *   else throw error;
 * }
 */
export class LeaseNotAcquiredError extends LeaseError {
  override name = 'LeaseNotAcquiredError';
  /** The key another owner holds. */
  readonly key: string;

  constructor(key: string) {
    super('not_acquired', `pg_lease: ${JSON.stringify(key)} is held by another owner`);
    this.key = key;
  }
}

/**
 * The lease is gone, or can no longer be confirmed in time: the reason a handle's `signal`
 * aborts with, and what `lease.renew()` throws afterwards. `cause` is the last driver error
 * when renewals kept failing until the deadline.
 *
 * @example
 * import { LeaseLostError } from 'pg-lease';
 * lease.signal.addEventListener('abort', () => {
 *   const reason = lease.signal.reason;
 *   if (reason instanceof LeaseLostError) console.log(`lost ${reason.key}: ${reason.status}`);
 * });
 */
export class LeaseLostError extends LeaseError {
  override name = 'LeaseLostError';
  /** Why; see {@link LostStatus}. */
  readonly status: LostStatus;
  readonly key: string;
  readonly owner: string;
  /** The epoch of the lost grant: stale from now on. */
  readonly epoch: bigint;

  constructor(
    status: LostStatus,
    lease: { key: string; owner: string; epoch: bigint },
    options?: ErrorOptions,
  ) {
    super('lease_lost', lostMessage(status, lease), options);
    this.status = status;
    this.key = lease.key;
    this.owner = lease.owner;
    this.epoch = lease.epoch;
  }
}

/**
 * The database refused a fenced write (SQLSTATE `PLF01`): the epoch it was fenced by is not the
 * key's live grant, so nothing of the transaction was committed. Raised by
 * {@link LeaseClient.fenced} for `lease.fence` and for `lease.fence_row` triggers fired by the
 * callback's writes. `cause` is the driver error; `detail` is the server's account of what
 * stands now (for a trigger, of the key the written row names).
 *
 * @example
 * import { LeaseFencedError } from 'pg-lease';
 * try {
 *   await client.fenced(lease, (tx) => tx.query('UPDATE jobs SET done = true WHERE id = 42'));
 * } catch (error) {
 *   if (!(error instanceof LeaseFencedError)) throw error;
 *   console.log(`epoch ${error.epoch} of ${error.key} is over: ${error.detail}`);
 * }
 */
export class LeaseFencedError extends LeaseError {
  override name = 'LeaseFencedError';
  /** Always `PLF01`. */
  readonly sqlState = SQLSTATE.STALE_EPOCH;
  /** The key the transaction was fenced by. */
  readonly key: string;
  /** The epoch the transaction was fenced by: stale. */
  readonly epoch: bigint;
  /** The server's DETAIL: the key, the epoch presented and what stands now. */
  readonly detail: string | undefined;

  constructor(
    grant: { key: string; epoch: bigint },
    options?: ErrorOptions & { message?: string; detail?: string },
  ) {
    super('stale_epoch', options?.message ?? STALE_EPOCH_MESSAGE, options);
    this.key = grant.key;
    this.epoch = grant.epoch;
    this.detail = options?.detail;
  }
}

function lostMessage(status: LostStatus, lease: { key: string; epoch: bigint }): string {
  const what = `pg_lease: lease on ${JSON.stringify(lease.key)} (epoch ${lease.epoch}) lost`;
  switch (status) {
    case 'not_owner':
      return `${what}: another owner holds the key, or it was released`;
    case 'lapsed':
      return `${what}: it lapsed before the renewal reached the server`;
    case 'epoch_mismatch':
      return `${what}: the key was granted again under a newer epoch`;
    case 'expired':
      return `${what}: no renewal was confirmed before its deadline`;
  }
}

/**
 * PostgreSQL's WARNING when a commit's wait for the synchronous standbys is cancelled: the
 * transaction has committed locally but may not be on any standby.
 */
const UNCONFIRMED_COMMIT = /^canceling (the )?wait for synchronous replication/;

/** Whether a notice is PostgreSQL's "canceling wait for synchronous replication" WARNING. */
export function isUnconfirmedCommit(notice: { message?: string }): boolean {
  return UNCONFIRMED_COMMIT.test(notice.message ?? '');
}

/** The message of the `unconfirmed_commit` error for a call on `key` (see {@link isUnconfirmedCommit}). */
export function unconfirmedMessage(notice: { message?: string }, key: string): string {
  return (
    `pg_lease: the call on ${JSON.stringify(key)} committed on the primary, but its wait for the ` +
    `synchronous standby was cancelled (${notice.message}): a failover may lose it, so it is ` +
    'not counted as done'
  );
}

/** The fields node-postgres puts on a server error. */
interface DatabaseErrorLike {
  code?: unknown;
  message?: unknown;
  detail?: unknown;
  hint?: unknown;
}

/**
 * Maps a driver error to the client's own error when it is one of pg_lease's, and returns it
 * unchanged otherwise (statement_timeout and cancels included).
 */
export function translateError(error: unknown, key: string): unknown {
  if (!(error instanceof Error)) return error;
  const { code, detail, hint } = error as DatabaseErrorLike;
  if (code === SQLSTATE.INVALID_PARAMETER_VALUE && error.message.startsWith(INVALID_INPUT_MESSAGE))
    return new LeaseInvalidInputError(typeof detail === 'string' ? detail : '', {
      cause: error,
      message: error.message,
      ...(typeof hint === 'string' ? { hint } : {}),
    });
  if (code === SQLSTATE.QUERY_CANCELED && error.message.startsWith(ACQUIRE_TIMEOUT_MESSAGE))
    return new LeaseTimeoutError(key, {
      cause: error,
      message: error.message,
      ...(typeof detail === 'string' ? { detail } : {}),
    });
  if (code === SQLSTATE.READ_ONLY_SQL_TRANSACTION)
    return new LeaseReadOnlyError(error.message, { cause: error });
  return error;
}
