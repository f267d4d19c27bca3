/**
 * The server's input rules (`lease._validate`, SEMANTICS §3), checked before a call is sent so
 * that a mistake costs no round trip and a duration the client cannot read never reaches the
 * server. Same rules, same order, same DETAIL and HINT text as the server's 22023 error; the
 * client tests compare the two for the same inputs.
 */
import { durationFields, toMicroseconds, type Duration } from './duration.js';
import { LeaseInvalidInputError } from './errors.js';

/** Which API function the input is for; it decides which parameters apply, as on the server. */
export type LeaseFunction = 'acquire' | 'renew' | 'release' | 'inspect';

/** Arguments as the caller gave them; absent ones are not checked unless the function takes them. */
export interface LeaseInput {
  key: unknown;
  owner?: unknown;
  epoch?: unknown;
  ttl?: Duration;
  wait?: Duration;
}

/** Arguments after validation: durations in whole microseconds, epoch as a bigint. */
export interface ValidInput {
  key: string;
  owner: string;
  epoch: bigint;
  ttlMicroseconds: number;
  waitMicroseconds: number;
}

/** Keys and owners are 1 to 1000 bytes of UTF-8 (the server measures octet_length). */
export const MAX_KEY_BYTES = 1000;
/** Intervals are at most 1000 years, compared as PostgreSQL compares intervals (360 000 days). */
const MAX_INTERVAL_MICROSECONDS = 1000 * 12 * 30 * 24 * 60 * 60 * 1_000_000;

const HINT: Record<LeaseFunction, string> = {
  inspect: 'key is a non-empty string of at most 1000 bytes.',
  release:
    'key and owner are non-empty strings of at most 1000 bytes; epoch is the one acquire returned.',
  acquire:
    'key and owner are non-empty strings of at most 1000 bytes; ' +
    'intervals are finite, at most 1000 years, without negative fields; ' +
    'ttl is greater than zero.',
  renew:
    'key and owner are non-empty strings of at most 1000 bytes; ' +
    'intervals are finite, at most 1000 years, without negative fields; ' +
    'ttl is greater than zero.',
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
      violations.push('epoch must not be null');
    else epoch = toEpoch(input.epoch);
  }

  let ttlMicroseconds = 0;
  if (fn === 'acquire' || fn === 'renew') {
    const ttl = input.ttl === undefined ? undefined : durationFields(input.ttl);
    const micros = ttl && toMicroseconds(ttl);
    if (!ttl || hasNegativeField(ttl) || micros! <= 0)
      violations.push('ttl must be a positive finite interval');
    else if (micros! > MAX_INTERVAL_MICROSECONDS) violations.push('ttl must be at most 1000 years');
    else ttlMicroseconds = micros!;
  }

  let waitMicroseconds = 0;
  if (fn === 'acquire') {
    const wait = durationFields(input.wait ?? 0);
    const micros = wait && toMicroseconds(wait);
    if (!wait || hasNegativeField(wait))
      violations.push('wait must be a non-negative finite interval');
    else if (micros! > MAX_INTERVAL_MICROSECONDS)
      violations.push('wait must be at most 1000 years');
    else waitMicroseconds = micros!;
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

/** Epochs are bigints; a safe integer number is taken as one for callers without types. */
function toEpoch(value: unknown): bigint {
  if (typeof value === 'bigint') return value;
  if (typeof value === 'number' && Number.isSafeInteger(value)) return BigInt(value);
  throw new TypeError(`pg_lease: epoch must be a bigint, got ${typeof value}`);
}

function checkText(name: 'key' | 'owner', value: unknown, violations: string[]): void {
  if (typeof value !== 'string' || value.length === 0)
    violations.push(`${name} must be a non-empty string`);
  else if (Buffer.byteLength(value, 'utf8') > MAX_KEY_BYTES)
    violations.push(`${name} must be at most ${MAX_KEY_BYTES} bytes`);
}

/** pg_lease reads "positive" as: no field negative (see `lease._has_negative_field`). */
function hasNegativeField(fields: { months: number; days: number; microseconds: number }): boolean {
  return fields.months < 0 || fields.days < 0 || fields.microseconds < 0;
}
