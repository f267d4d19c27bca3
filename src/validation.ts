/**
 * The server's input rules (`lease._validate`, SEMANTICS §3), checked before a call is sent so
 * that a mistake costs no round trip and a duration the client cannot read never reaches the
 * server. Same rules, same order, and the server's own DETAIL and HINT wording (`lease._message`,
 * which the build copies into the generated module) as its 22023 error; the client tests compare
 * the two for the same inputs.
 *
 * On top of them, the client's own rules for what it alone reads (docs/client.md, "Durations"):
 * a duration is a whole number of milliseconds (a number) or interval text with a unit; text
 * that is a bare number other than 0 has no unit and is refused, because PostgreSQL would read
 * it as seconds where a number means milliseconds; text that is not an interval is reported as
 * unreadable; an epoch must fit PostgreSQL's bigint; a keepAlive interval must be shorter than
 * the ttl; text (a key, an owner, a prefix) is well-formed Unicode without U+0000
 * ({@link illFormedText}).
 * These DETAILs name the value, since the server never sees it.
 */
import { parseIntervalFields, toMicroseconds, type Duration } from './duration.js';
import { LeaseInvalidInputError } from './errors.js';
import { MAX_BYTES, MAX_PERMITS, MAX_YEARS, MESSAGES } from './generated/sql.js';

/** Which API function the input is for; it decides which parameters apply, as on the server. */
export type LeaseFunction = 'acquire' | 'renew' | 'release' | 'inspect';

/** Arguments as the caller gave them; absent ones are not checked unless the function takes them. */
export interface LeaseInput {
  key: unknown;
  owner?: unknown;
  epoch?: unknown;
  ttl?: Duration;
  wait?: Duration;
  /** `keepAlive.interval` of an acquire, checked against the ttl. */
  keepAliveInterval?: Duration | undefined;
}

/** Arguments after validation: durations in whole microseconds, epoch as a bigint. */
export interface ValidInput {
  key: string;
  owner: string;
  epoch: bigint;
  ttlMicroseconds: number;
  waitMicroseconds: number;
}

/** Keys and owners are 1 to MAX_BYTES bytes of UTF-8 (the server measures octet_length). */
export const MAX_KEY_BYTES = MAX_BYTES;
/** Intervals are at most MAX_YEARS years, compared as PostgreSQL compares them (a year: 360 days). */
const MAX_INTERVAL_MICROSECONDS = MAX_YEARS * 12 * 30 * 24 * 60 * 60 * 1_000_000;

/**
 * A wording of the server's (`lease._message`, generated from the SQL) filled in as
 * `pg_catalog.format` fills it: `%s` takes the next argument, `%n$s` the n-th.
 */
function message(id: keyof typeof MESSAGES, ...args: (string | number)[]): string {
  let next = 0;
  return MESSAGES[id].replace(/%(?:(\d+)\$)?s/g, (_, position: string | undefined) =>
    String(args[position === undefined ? next++ : Number(position) - 1]),
  );
}

const HINT: Record<LeaseFunction, string> = {
  inspect: message('hint_key', MAX_BYTES, MAX_YEARS),
  release: message('hint_release', MAX_BYTES, MAX_YEARS),
  acquire: message('hint_grant', MAX_BYTES, MAX_YEARS),
  renew: message('hint_grant', MAX_BYTES, MAX_YEARS),
};

/**
 * Checks the arguments of one API call and returns them normalised, or throws a
 * {@link LeaseInvalidInputError} listing every violation in the server's order
 * (key, owner, epoch, ttl, wait).
 */
export function validateInput(fn: LeaseFunction, input: LeaseInput): ValidInput {
  const violations: string[] = [];
  checkText('key', input.key, violations);
  if (fn !== 'inspect') checkText('owner', input.owner, violations);
  let epoch = 0n;
  if (fn === 'renew' || fn === 'release') {
    if (input.epoch === null || input.epoch === undefined)
      violations.push(message('null', 'epoch'));
    else epoch = toEpoch(input.epoch, violations);
  }

  let ttlMicroseconds = 0;
  if (fn === 'acquire' || fn === 'renew') {
    const ttl = checkDuration('ttl', input.ttl, 'positive');
    if (ttl.violation !== undefined) violations.push(ttl.violation);
    else ttlMicroseconds = ttl.microseconds;
  }

  let waitMicroseconds = 0;
  if (fn === 'acquire') {
    const wait = checkDuration('wait', input.wait ?? 0, 'non-negative');
    if (wait.violation !== undefined) violations.push(wait.violation);
    else waitMicroseconds = wait.microseconds;
  }

  if (fn === 'acquire' && input.keepAliveInterval !== undefined) {
    const interval = checkDuration('keepAlive.interval', input.keepAliveInterval, 'positive');
    if (interval.violation !== undefined) violations.push(interval.violation);
    else if (ttlMicroseconds > 0 && interval.microseconds >= ttlMicroseconds)
      violations.push(
        `keepAlive.interval must be shorter than the ttl, got ${show(input.keepAliveInterval)} for a ttl of ${show(input.ttl!)}`,
      );
  }

  if (violations.length > 0)
    throw new LeaseInvalidInputError(violations.join('; '), { hint: HINT[fn] });
  return {
    key: input.key as string,
    owner: (input.owner as string | undefined) ?? '',
    epoch,
    ttlMicroseconds,
    waitMicroseconds,
  };
}

/** The range of PostgreSQL's bigint, which epochs are. */
const BIGINT_MIN = -(2n ** 63n);
const BIGINT_MAX = 2n ** 63n - 1n;

/**
 * Epochs are bigints; a safe integer number is taken as one for callers without types. One
 * outside PostgreSQL's bigint range is a violation here (the server would fail the cast).
 */
function toEpoch(value: unknown, violations: string[]): bigint {
  let epoch: bigint;
  if (typeof value === 'bigint') epoch = value;
  else if (typeof value === 'number' && Number.isSafeInteger(value)) epoch = BigInt(value);
  else {
    violations.push(`epoch must be a bigint, got ${typeof value}`);
    return 0n;
  }
  if (epoch < BIGINT_MIN || epoch > BIGINT_MAX) {
    violations.push(`epoch must be a 64-bit integer, got ${epoch}`);
    return 0n;
  }
  return epoch;
}

/** A duration checked by {@link checkDuration}: its length, or the rule it breaks. */
export type CheckedDuration = Readonly<
  { violation: undefined; microseconds: number } | { violation: string; microseconds?: undefined }
>;

/** Text that is only a number, which PostgreSQL would read as seconds. */
const UNITLESS = /^\s*[+-]?(?:\d+\.?\d*|\.\d+)\s*$/;

/**
 * Checks one duration against the client's rules and the server's, in that order, and
 * returns its length in whole microseconds (always a multiple of 1000) or the violation,
 * worded as in the DETAIL of the server where the server has the same rule.
 *
 * @example
 * checkDuration('ttl', '30s', 'positive');     // { violation: undefined, microseconds: 30_000_000 }
 * checkDuration('ttl', '30', 'positive').violation;
 * // 'ttl "30" has no unit: write 30s, 30ms or 30min'
 */
export function checkDuration(
  name: string,
  value: Duration | undefined,
  rule: 'positive' | 'non-negative',
): CheckedDuration {
  // Most programs pass the same few texts ('30s') on every call: reading one once is enough.
  if (typeof value !== 'string') return checkDurationOnce(name, value, rule);
  const cacheKey = `${rule}\u0000${name}\u0000${value}`;
  let checked = CHECKED_TEXT.get(cacheKey);
  if (checked === undefined) {
    if (CHECKED_TEXT.size >= CHECKED_TEXT_LIMIT) CHECKED_TEXT.clear();
    checked = checkDurationOnce(name, value, rule);
    CHECKED_TEXT.set(cacheKey, checked);
  }
  return checked;
}

/** Duration texts already checked, by rule, name and text; cleared when it fills up. */
const CHECKED_TEXT = new Map<string, CheckedDuration>();
const CHECKED_TEXT_LIMIT = 256;

function checkDurationOnce(
  name: string,
  value: Duration | undefined,
  rule: 'positive' | 'non-negative',
): CheckedDuration {
  // The range violation's wording, made only when it is the answer (a regular expression
  // replace per call was the largest cost of validating an acquire's default wait of 0).
  const range = () => message(rule === 'positive' ? 'not_positive' : 'negative', name);
  let fields;
  if (typeof value === 'number') {
    if (!Number.isFinite(value)) return { violation: range() };
    if (!Number.isInteger(value))
      return { violation: `${name} must be a whole number of milliseconds, got ${value}` };
    fields = { months: 0, days: 0, microseconds: value * 1000 };
  } else if (typeof value === 'string') {
    if (UNITLESS.test(value) && Number(value) !== 0)
      return {
        violation: `${name} ${show(value)} has no unit: write ${value.trim()}s, ${value.trim()}ms or ${value.trim()}min`,
      };
    const parsed = parseIntervalFields(value);
    if (parsed === undefined) return { violation: `${name} ${show(value)} is not a duration` };
    if (typeof parsed === 'number') return { violation: range() };
    fields = parsed;
  } else {
    return { violation: range() };
  }
  const microseconds = toMicroseconds(fields);
  if (hasNegativeField(fields) || (rule === 'positive' ? microseconds <= 0 : microseconds < 0))
    return { violation: range() };
  if (microseconds > MAX_INTERVAL_MICROSECONDS)
    return { violation: message('too_far', name, MAX_YEARS) };
  if (microseconds % 1000 !== 0)
    return { violation: `${name} must be a whole number of milliseconds, got ${show(value)}` };
  return { violation: undefined, microseconds };
}

/**
 * A duration option of the client's own (a keep-alive interval, a poll interval, a margin) in
 * milliseconds, checked by the rules of {@link checkDuration}; bad input is the same
 * {@link LeaseInvalidInputError} as a bad ttl, naming the option.
 */
export function optionMs(
  name: string,
  value: Duration | undefined,
  rule: 'positive' | 'non-negative',
): number {
  const checked = checkDuration(name, value, rule);
  if (checked.violation !== undefined) throw new LeaseInvalidInputError(checked.violation);
  return checked.microseconds / 1000;
}

function show(value: Duration): string {
  return typeof value === 'number' ? String(value) : JSON.stringify(value);
}

function checkText(name: 'key' | 'owner', value: unknown, violations: string[]): void {
  if (typeof value !== 'string' || value.length === 0) violations.push(message('empty', name));
  else {
    const illFormed = illFormedText(name, value);
    if (illFormed !== undefined) violations.push(illFormed);
    else if (Buffer.byteLength(value, 'utf8') > MAX_KEY_BYTES)
      violations.push(message('too_long', name, MAX_KEY_BYTES));
  }
}

/** A lone UTF-16 surrogate: in a `u` regular expression a surrogate pair is one code point. */
const LONE_SURROGATE = /[\uD800-\uDFFF]/u;

/**
 * The client's one rule for the text it sends (keys, owners, a list prefix, a fenced key):
 * well-formed Unicode without U+0000. The server takes UTF-8, and a string holding a lone UTF-16
 * surrogate has none: node-postgres would send each lone surrogate as U+FFFD, so `'job-\uD800'`
 * and `'job-\uD801'` would be one key on the server. PostgreSQL's text holds no NUL character,
 * so a string with one would come back as the server's 22021 instead of invalid input. The
 * server never sees such a string, so the DETAIL is the client's own (as for its duration
 * rules), naming the argument and the index of the first offending character; `undefined` for
 * text that can be sent.
 *
 * @example
 * illFormedText('key', 'job-\uD800'); // 'key must be well-formed Unicode: lone surrogate U+D800 at index 4'
 * illFormedText('key', 'job\0'); // 'key must not contain U+0000 (PostgreSQL text holds none): at index 3'
 */
export function illFormedText(name: string, value: string): string | undefined {
  const nul = value.indexOf('\0');
  if (nul !== -1)
    return `${name} must not contain U+0000 (PostgreSQL text holds none): at index ${nul}`;
  // String.prototype.isWellFormed: Node.js 20 and later (ES2024, not in the compiled lib).
  if ((value as string & { isWellFormed(): boolean }).isWellFormed()) return undefined;
  const at = LONE_SURROGATE.exec(value)!.index;
  const unit = value.charCodeAt(at).toString(16).toUpperCase();
  return `${name} must be well-formed Unicode: lone surrogate U+${unit} at index ${at}`;
}

/** pg_lease reads "positive" as: no field negative (see `lease._has_negative_field`). */
function hasNegativeField(fields: { months: number; days: number; microseconds: number }): boolean {
  return fields.months < 0 || fields.days < 0 || fields.microseconds < 0;
}

/**
 * Why `limit` cannot be a counted key's limit (SEMANTICS §13: a whole number from 1 to the
 * server's `lease._max_permits()`), or undefined when it can; the client's and the CLI's one
 * check, naming the value as given.
 */
export function limitViolation(limit: unknown): string | undefined {
  if (limit === undefined) return undefined;
  if (typeof limit === 'number' && Number.isInteger(limit) && limit >= 1 && limit <= MAX_PERMITS)
    return undefined;
  return `limit must be a whole number from 1 to ${MAX_PERMITS}, got ${typeof limit === 'string' ? JSON.stringify(limit) : String(limit)}`;
}
