/**
 * Exit codes of the `pg-lease` command, sysexits style (see docs/cli.md). `exec` otherwise exits
 * with its command's own code, or 128 + N when the command was ended by signal N.
 */
export const EXIT = {
  /** Done; for `renew`/`release`, the status was ok. */
  OK: 0,
  /** Anything unexpected: the database was unreachable, an SQL error, a bug. */
  FAILURE: 1,
  /** Bad command line or invalid input (EX_USAGE). */
  USAGE: 64,
  /** The lease was not acquired: held by another owner, or `--wait` ran out (EX_TEMPFAIL). */
  NOT_ACQUIRED: 75,
  /** The lease was lost while `exec` ran its command, or `renew`/`release` reported it gone. */
  LOST: 76,
  /** `exec`: the command was found but could not be run. */
  CANNOT_EXECUTE: 126,
  /** `exec`: the command was not found. */
  NOT_FOUND: 127,
} as const;

/** Thrown for a bad command line; main prints it with its hint (else a pointer to --help), exit 64. */
export class UsageError extends Error {
  override name = 'UsageError';
  /** What to do instead, when there is more to say than "run pg-lease <command> --help". */
  readonly hint: string | undefined;
  constructor(message: string, options: { hint?: string } = {}) {
    super(message);
    this.hint = options.hint;
  }
}
