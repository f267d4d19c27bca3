/**
 * What every `pg-lease` command shares: option parsing with node:util parseArgs, the
 * connection string, and output as text or JSON.
 */
import * as fs from 'node:fs';
import { isUtf8 } from 'node:buffer';
import { parseArgs, type ParseArgsConfig } from 'node:util';
import type pg from 'pg';
import { LeaseClient } from '../client.js';
import { LeaseInvalidInputError } from '../errors.js';
import { openClient as openConnection, openPool as openServerPool } from '../sql/connection.js';
import { connectionConfig } from './connection.js';
import { flagHint } from './errors.js';
import { UsageError } from './exit-codes.js';
import { toJson } from './json.js';

export { toJson };

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

/**
 * parseArgs, strict, with usage errors raised as {@link UsageError}. A value that starts with
 * a dash (`--ttl -5s`, `--epoch -1`) is taken as the value of the string option before it, so
 * that it is judged as a value (and named in the error) rather than refused as an option.
 */
export function parseCommand<T extends Options>(args: string[], options: T): Parsed<T> {
  const all: Options = { ...COMMON_OPTIONS, ...options };
  const joined: string[] = [];
  for (let i = 0; i < args.length; i++) {
    const arg = args[i]!;
    const next = args[i + 1];
    const name = arg.startsWith('--') ? arg.slice(2) : undefined;
    if (
      name !== undefined &&
      all[name]?.type === 'string' &&
      next !== undefined &&
      next.startsWith('-') &&
      next !== '--' &&
      !(next.startsWith('--') && next.slice(2).split('=')[0]! in all)
    ) {
      joined.push(`${arg}=${next}`);
      i += 1;
    } else {
      joined.push(arg);
    }
  }
  refuseInvalidUtf8(args);
  try {
    return parseArgs({
      args: joined,
      options: { ...COMMON_OPTIONS, ...options },
      strict: true,
      allowPositionals: false,
    });
  } catch (error) {
    throw parseError(error as Error & { code?: string });
  }
}

/**
 * Arguments reach Node.js as bytes, which it reads as UTF-8 with U+FFFD for every byte that is
 * not: `--key $'caf\xe9'` and `--key $'caf\xff'` would be one key, `caf\uFFFD`, on the server.
 * So, as the client refuses text that is not well-formed Unicode (validation.ts, illFormedText),
 * the command refuses an argument given as bytes that are not UTF-8, naming its option. Where
 * the bytes cannot be read back (not Linux, or `args` not the process's own arguments), there
 * is nothing to compare and nothing is refused. The environment gives the command no lease
 * text (only connection settings), and a lone surrogate cannot come from the command line.
 */
function refuseInvalidUtf8(args: string[]): void {
  const raw = rawArguments(args);
  if (raw === undefined) return;
  const violations: string[] = [];
  raw.forEach((bytes, i) => {
    if (isUtf8(bytes)) return;
    const arg = args[i]!;
    const previous = args[i - 1];
    const name = arg.startsWith('--')
      ? arg.slice(2).split('=')[0]!
      : previous?.startsWith('--') && !previous.includes('=')
        ? previous.slice(2)
        : `argument ${JSON.stringify(arg)}`;
    violations.push(`${name} must be valid UTF-8 (the command line gave other bytes)`);
  });
  if (violations.length > 0) throw new LeaseInvalidInputError(violations.join('; '));
}

/**
 * The bytes of `args` as the kernel passed them (Linux's /proc/self/cmdline), when `args` is a
 * run of the process's own arguments and each entry reads back as Node.js read it.
 */
function rawArguments(args: string[]): Buffer[] | undefined {
  if (process.platform !== 'linux' || args.length === 0) return undefined;
  const start = process.argv.indexOf(args[0]!, 1);
  if (start === -1 || args.some((arg, i) => process.argv[start + i] !== arg)) return undefined;
  let cmdline: Buffer;
  try {
    cmdline = fs.readFileSync('/proc/self/cmdline');
  } catch {
    return undefined;
  }
  const entries: Buffer[] = [];
  for (let from = 0; from < cmdline.length;) {
    const end = cmdline.indexOf(0, from);
    entries.push(cmdline.subarray(from, end === -1 ? cmdline.length : end));
    from = end === -1 ? cmdline.length : end + 1;
  }
  // process.argv[k] (k >= 1) is the entry as far from the end as it is from argv's end.
  const offset = entries.length - process.argv.length;
  if (offset + start < 1) return undefined;
  const raw = args.map((_, i) => entries[offset + start + i]!);
  return raw.every((bytes, i) => bytes.toString('utf8') === args[i]) ? raw : undefined;
}

/** node:util's parseArgs errors, worded like the rest of the CLI's. */
function parseError(error: Error & { code?: string }): UsageError {
  const quoted = /'([^']*)'/.exec(error.message)?.[1] ?? '';
  const flag = quoted.split(' ')[0]!;
  switch (error.code) {
    case 'ERR_PARSE_ARGS_UNKNOWN_OPTION':
      return new UsageError(`unknown option ${flag}`);
    case 'ERR_PARSE_ARGS_UNEXPECTED_POSITIONAL':
      return new UsageError(`unexpected argument ${JSON.stringify(quoted)}`, {
        hint: 'every value follows its option (--key K); exec takes its command after --',
      });
    case 'ERR_PARSE_ARGS_INVALID_OPTION_VALUE':
      return / argument missing$/.test(error.message)
        ? new UsageError(`${flag} needs a value`, flagHint(flag) ? { hint: flagHint(flag)! } : {})
        : new UsageError(`${flag} takes no value`);
    default:
      return new UsageError(error.message);
  }
}

/** The value of a required string option. */
export function required(values: Record<string, unknown>, name: string): string {
  const value = values[name];
  if (typeof value !== 'string') {
    const hint = flagHint(`--${name}`);
    throw new UsageError(`--${name} is required`, hint ? { hint } : {});
  }
  return value;
}

/** Whether the command's arguments (before any `--`) ask for JSON. */
export function wantsJson(args: string[]): boolean {
  const separator = args.indexOf('--');
  return (separator === -1 ? args : args.slice(0, separator)).includes('--json');
}

/** A pool on the command's database (see connection.ts for where it connects). */
export function openPool(values: { url?: string | undefined }, max = 10): pg.Pool {
  // An idle connection that breaks (server restart) is dropped; the next call reconnects.
  return openServerPool(connectionConfig(values), max);
}

/** One client on the command's database, not yet connected. */
export function openClient(values: { url?: string | undefined }): pg.Client {
  return openConnection(connectionConfig(values));
}

/** A LeaseClient on its own pool; `close()` ends both. */
export function openLeaseClient(values: { url?: string | undefined }): {
  client: LeaseClient;
  close(): Promise<void>;
} {
  const pool = openPool(values);
  const client = new LeaseClient(pool);
  return {
    client,
    close: async () => {
      await client.end();
      await pool.end();
    },
  };
}

/**
 * An epoch from the command line: a whole number, kept exact as a bigint (the client refuses
 * one outside PostgreSQL's bigint range).
 */
export function parseEpoch(text: string): bigint {
  if (!/^[+-]?\d+$/.test(text.trim()))
    throw new LeaseInvalidInputError(`epoch must be a whole number, got ${JSON.stringify(text)}`);
  return BigInt(text.trim());
}

/** Prints one result: the JSON value with `--json`, else the text lines. */
export function print(json: boolean, text: string, value: Record<string, unknown>): void {
  process.stdout.write(json ? `${toJson(value)}\n` : `${text}\n`);
}

/** Writes a diagnostic line to stderr, prefixed like every message of the command. */
export function warn(message: string): void {
  process.stderr.write(`pg-lease: ${message}\n`);
}
