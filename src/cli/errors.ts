/**
 * Every failure of a `pg-lease` command, told one way: a message that names the option as the
 * user typed it and the value given, a hint that fits that option, and an exit code. As text
 * it is `pg-lease: <message>` and `hint: <hint>` on stderr; with --json it is one object on
 * stdout, `{"error": {"code", "message", "hint"?, "detail"?, "violations"?}}`, and nothing on
 * stderr.
 *
 * The client names its parameters as the library does (ttl, older_than, keepAlive.interval);
 * {@link OPTIONS} is the one place that maps them to the CLI's flags.
 */
import { LeaseError, LeaseInvalidInputError } from '../errors.js';
import { MAX_BYTES, MAX_YEARS } from '../generated/sql.js';
import { toJson } from './json.js';
import { EXIT, UsageError } from './exit-codes.js';

/** One CLI option as the client's error names it: the flag typed for it, and what it takes. */
interface OptionText {
  readonly flag: string;
  readonly hint: string;
}

const TEXT = `non-empty text of at most ${MAX_BYTES} bytes`;
const LIMIT = `at most ${MAX_YEARS} years, in steps of 1ms`;

/** Client parameter names (and the CLI's own option names) to the flags and their hints. */
export const OPTIONS: Readonly<Record<string, OptionText>> = {
  key: { flag: '--key', hint: `--key is ${TEXT}` },
  owner: {
    flag: '--owner',
    hint: `--owner is ${TEXT}; renew and release take the one acquire printed`,
  },
  prefix: { flag: '--prefix', hint: `--prefix is text of at most ${MAX_BYTES} bytes` },
  epoch: { flag: '--epoch', hint: '--epoch is the whole number acquire printed' },
  ttl: {
    flag: '--ttl',
    hint: `--ttl is a duration with a unit, above zero: 30s, 500ms, 1min (${LIMIT})`,
  },
  wait: {
    flag: '--wait',
    hint: `--wait is a duration with a unit, 0 or more: 10s, 2min (${LIMIT})`,
  },
  grace: {
    flag: '--grace',
    hint: `--grace is a duration with a unit, 0 or more: 10s, 500ms (${LIMIT})`,
  },
  interval: {
    flag: '--interval',
    hint: `--interval is a duration with a unit, above zero: 1s, 500ms (${LIMIT})`,
  },
  older_than: {
    flag: '--older-than',
    hint: `--older-than is a duration with a unit: 7d, 12h; 0 takes every dead key (${LIMIT})`,
  },
  'older-than': {
    flag: '--older-than',
    hint: `--older-than is a duration with a unit: 7d, 12h; 0 takes every dead key (${LIMIT})`,
  },
  batch: { flag: '--batch', hint: '--batch is a whole number of keys, 1 or more' },
  count: { flag: '--count', hint: '--count is a whole number of refreshes, 1 or more' },
  // exec renews every ttl/3: a ttl too short for that is the ttl's fault.
  'keepAlive.interval': {
    flag: '--ttl',
    hint: 'exec renews every ttl/3: --ttl must be at least 3ms',
  },
};

/** A failure that is not the user's input: its code, exit code and hint. */
export class CliError extends Error {
  override name = 'CliError';
  readonly code: string;
  readonly exit: number;
  readonly hint: string | undefined;
  constructor(code: string, message: string, options: { exit?: number; hint?: string } = {}) {
    super(message);
    this.code = code;
    this.exit = options.exit ?? EXIT.FAILURE;
    this.hint = options.hint;
  }
}

/** What is printed for a failure, as text or as JSON. */
export interface Failure {
  code: string;
  message: string;
  hint?: string;
  detail?: string;
  violations?: string[];
}

/** SQLSTATE of a query naming schema lease where pg_lease is not installed. */
const INVALID_SCHEMA_NAME = '3F000';

/**
 * Any error of a command as a {@link Failure} and its exit code. `args` are the command's
 * arguments (to quote the values given), `command` its name (for the pointer to --help).
 */
export function describeFailure(
  error: unknown,
  args: string[],
  command: string | undefined,
): { failure: Failure; exit: number } {
  const help = command ? `run pg-lease ${command} --help` : 'run pg-lease --help';
  if (error instanceof UsageError)
    return {
      failure: { code: 'usage', message: error.message, hint: error.hint ?? help },
      exit: EXIT.USAGE,
    };
  if (error instanceof LeaseInvalidInputError) {
    const named = error.violations.map((violation) => namedViolation(violation, args));
    const hints = [...new Set(named.map((entry) => entry.hint).filter((h) => h !== undefined))];
    const violations = named.map((entry) => entry.text);
    return {
      failure: {
        code: 'invalid_input',
        message: `invalid input: ${violations.join('; ')}`,
        hint: hints.length > 0 ? hints.join('; ') : (error.hint ?? help),
        violations,
      },
      exit: EXIT.USAGE,
    };
  }
  if (error instanceof CliError) {
    const failure: Failure = { code: error.code, message: error.message };
    if (error.hint !== undefined) failure.hint = error.hint;
    return { failure, exit: error.exit };
  }
  const failure: Failure = {
    code: errorCode(error),
    message: oneLine(error).replace(/^pg_lease: /, ''),
  };
  const detail = (error as { detail?: unknown }).detail;
  if (typeof detail === 'string') failure.detail = detail;
  const hint = (error as { hint?: unknown }).hint;
  if (typeof hint === 'string') failure.hint = hint;
  if (failure.code === INVALID_SCHEMA_NAME && /"lease"/.test(failure.message))
    failure.hint = 'pg_lease is not installed in this database; run: pg-lease install';
  return { failure, exit: EXIT.FAILURE };
}

/** Prints a failure: JSON on stdout with --json, else `pg-lease: ...` and `hint: ...` on stderr. */
export function printFailure(json: boolean, failure: Failure): void {
  if (json) {
    process.stdout.write(`${toJson({ error: failure })}\n`);
    return;
  }
  process.stderr.write(
    `pg-lease: ${failure.message}${failure.detail ? `\ndetail: ${failure.detail}` : ''}${failure.hint ? `\nhint: ${failure.hint}` : ''}\n`,
  );
}

/** The hint for a flag (`--key`), for a required option that is missing. */
export function flagHint(flag: string): string | undefined {
  return Object.values(OPTIONS).find((option) => option.flag === flag)?.hint;
}

/**
 * A violation names its parameter first (`ttl must be ...`, `older_than "x" is not a
 * duration`); on the command line the value came from an option, so name the option and the
 * value given: `--ttl "-5s" must be ...`.
 */
function namedViolation(violation: string, args: string[]): { text: string; hint?: string } {
  const parameter = /^[A-Za-z_.-]+/.exec(violation)?.[0];
  const option = parameter === undefined ? undefined : OPTIONS[parameter];
  if (parameter === undefined || option === undefined) return { text: violation };
  const rest = violation.slice(parameter.length);
  const value = optionValue(args, option.flag);
  const text =
    value === undefined || rest.includes(JSON.stringify(value)) || rest.includes(`got ${value}`)
      ? `${option.flag}${rest}`
      : `${option.flag} ${JSON.stringify(value)}${rest}`;
  return { text, hint: option.hint };
}

/** The value given for `option` before any `--`, as `--option value` or `--option=value`. */
function optionValue(args: string[], option: string): string | undefined {
  for (let i = 0; i < args.length; i++) {
    const arg = args[i]!;
    if (arg === '--') break;
    if (arg === option) return args[i + 1];
    if (arg.startsWith(`${option}=`)) return arg.slice(option.length + 1);
  }
  return undefined;
}

/** A short code: the library's, the SQLSTATE or node's error code, else "error". */
function errorCode(error: unknown): string {
  if (error instanceof LeaseError) return error.code;
  const code = (error as { code?: unknown } | undefined)?.code;
  if (typeof code === 'string') return code;
  if (error instanceof AggregateError) {
    const inner = (error.errors[0] as { code?: unknown } | undefined)?.code;
    if (typeof inner === 'string') return inner;
  }
  return 'error';
}

/** One line for any error, also for node's AggregateError of a refused connection (empty message). */
function oneLine(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  if (error.message) return error.message;
  if (error instanceof AggregateError && error.errors.length > 0)
    return error.errors.map((inner: unknown) => oneLine(inner)).join('; ');
  const code = (error as { code?: unknown }).code;
  return typeof code === 'string' ? code : error.name;
}
