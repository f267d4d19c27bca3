/**
 * What every `pg-lease` command shares: option parsing with node:util parseArgs, the
 * connection string, and output as text or JSON.
 */
import { parseArgs, type ParseArgsConfig } from 'node:util';
import { LeaseInvalidInputError } from '../errors.js';
import { UsageError } from './exit-codes.js';

type Options = NonNullable<ParseArgsConfig['options']>;

/** Options every command takes. */
export const COMMON_OPTIONS = {
  url: { type: 'string' },
  json: { type: 'boolean', default: false },
  help: { type: 'boolean', short: 'h', default: false },
} as const satisfies Options;

type Parsed<T extends Options> = ReturnType<
  typeof parseArgs<{
    args: string[];
    options: typeof COMMON_OPTIONS & T;
    strict: true;
    allowPositionals: false;
  }>
>;

/** parseArgs, strict, with usage errors raised as {@link UsageError}. */
export function parseCommand<T extends Options>(args: string[], options: T): Parsed<T> {
  try {
    return parseArgs({
      args,
      options: { ...COMMON_OPTIONS, ...options },
      strict: true,
      allowPositionals: false,
    });
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
}

/** The value of a required string option. */
export function required(values: Record<string, unknown>, name: string): string {
  const value = values[name];
  if (typeof value !== 'string') throw new UsageError(`--${name} is required`);
  return value;
}

/** The connection string: `--url`, else `DATABASE_URL`. */
export function connectionString(values: { url?: string | undefined }): string {
  const url = values.url ?? process.env.DATABASE_URL;
  if (!url) throw new UsageError('no database: pass --url or set DATABASE_URL');
  return url;
}

/** An epoch from the command line: a whole number, kept exact as a bigint. */
export function parseEpoch(text: string): bigint {
  if (!/^[+-]?\d+$/.test(text.trim()))
    throw new LeaseInvalidInputError('epoch must be a whole number', {
      hint: 'epoch is the one acquire returned.',
    });
  return BigInt(text.trim());
}

/** Prints one result: the JSON value with `--json`, else the text lines. */
export function print(json: boolean, text: string, value: Record<string, unknown>): void {
  process.stdout.write(json ? `${toJson(value)}\n` : `${text}\n`);
}

/** JSON with bigints as strings (exact) and dates as ISO strings. */
export function toJson(value: unknown): string {
  return JSON.stringify(value, (_key, item: unknown) =>
    typeof item === 'bigint' ? item.toString() : item,
  );
}

/** Writes a diagnostic line to stderr, prefixed like every message of the command. */
export function warn(message: string): void {
  process.stderr.write(`pg-lease: ${message}\n`);
}
