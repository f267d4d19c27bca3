#!/usr/bin/env node
/**
 * The `pg-lease` command: leases from the shell. See docs/cli.md; the help texts are in help.ts.
 */
import * as fs from 'node:fs';
import { LeaseError, LeaseInvalidInputError } from '../errors.js';
import { BUNDLED_VERSION } from '../generated/sql.js';
import { toJson, warn } from './common.js';
import { demoCommand } from './demo.js';
import { execCommand } from './exec.js';
import { EXIT, UsageError } from './exit-codes.js';
import { usage } from './help.js';
import { installCommand } from './install.js';
import { acquireCommand, inspectCommand, releaseCommand, renewCommand } from './lease-commands.js';
import { listCommand } from './list.js';
import { purgeCommand } from './purge.js';
import { watchCommand } from './watch.js';

const COMMANDS: Record<string, (args: string[]) => Promise<number>> = {
  acquire: acquireCommand,
  renew: renewCommand,
  release: releaseCommand,
  inspect: inspectCommand,
  list: listCommand,
  watch: watchCommand,
  purge: purgeCommand,
  exec: execCommand,
  install: installCommand,
  demo: demoCommand,
};

export async function main(argv: string[]): Promise<number> {
  const [name, ...args] = argv;
  const json = args.includes('--json');
  if (name === undefined || name === '--help' || name === '-h' || name === 'help') {
    process.stdout.write(`${usage()}\n`);
    return name === undefined ? EXIT.USAGE : EXIT.OK;
  }
  if (name === '--version' || name === '-V') {
    process.stdout.write(`${versionLine()}\n`);
    return EXIT.OK;
  }
  const command = COMMANDS[name];
  if (!command) return report(new UsageError(`unknown command "${name}"`), json, args, undefined);
  try {
    return await command(args);
  } catch (error) {
    return report(error, json, args, name);
  }
}

/** The package's version (dist/src/cli/main.js sits three levels below package.json). */
function versionLine(): string {
  const manifest = JSON.parse(
    fs.readFileSync(new URL('../../../package.json', import.meta.url), 'utf8'),
  ) as { version: string };
  return `pg-lease ${manifest.version} (bundles the pg_lease extension ${BUNDLED_VERSION})`;
}

/** SQLSTATE of a query naming schema lease where pg_lease is not installed. */
const INVALID_SCHEMA_NAME = '3F000';

/**
 * Prints an error (as `{"error": ...}` on stdout with --json, as a line on stderr always) and
 * returns the exit code: 64 for usage errors and invalid input, naming the option and the value
 * given for it; 1 for anything else.
 */
function report(
  error: unknown,
  json: boolean,
  args: string[],
  command: string | undefined,
): number {
  const help = command ? `run pg-lease ${command} --help` : 'run pg-lease --help';
  if (error instanceof UsageError) {
    if (json)
      printJsonError({
        message: error.message,
        code: 'usage',
        ...(error.hint ? { hint: error.hint } : {}),
      });
    warn(`${error.message}${error.hint ? `\nhint: ${error.hint}` : `; ${help}`}`);
    return EXIT.USAGE;
  }
  if (error instanceof LeaseInvalidInputError) {
    const violations = error.violations.map((violation) => withOptionValue(violation, args));
    if (json) printJsonError({ ...describeForJson(error), violations });
    warn(`invalid input: ${violations.join('; ')}${error.hint ? `\nhint: ${error.hint}` : ''}`);
    return EXIT.USAGE;
  }
  const described = describeForJson(error);
  if (described.code === INVALID_SCHEMA_NAME && /"lease"/.test(String(described.message)))
    described.hint = 'pg_lease is not installed in this database; run: pg-lease install';
  if (json) printJsonError(described);
  // The command prefixes its own name; the library's "pg_lease: " would say it twice.
  warn(
    `${String(described.message).replace(/^pg_lease: /, '')}${described.hint ? `\nhint: ${String(described.hint)}` : ''}`,
  );
  return EXIT.FAILURE;
}

function printJsonError(error: Record<string, unknown>): void {
  process.stdout.write(`${toJson({ error })}\n`);
}

/**
 * A violation names its parameter first (`ttl must be ...`); on the command line the value
 * came from an option, so name the option and the value given: `--ttl "-5s" must be ...`.
 */
function withOptionValue(violation: string, args: string[]): string {
  const parameter = /^[a-z]+/.exec(violation)?.[0];
  if (!parameter) return violation;
  const value = optionValue(args, `--${parameter}`);
  if (value === undefined) return violation;
  const rest = violation.slice(parameter.length);
  return rest.includes(JSON.stringify(value)) || rest.includes(`got ${value}`)
    ? `--${parameter}${rest}`
    : `--${parameter} ${JSON.stringify(value)}${rest}`;
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

/** One line for any error, also for node's AggregateError of a refused connection (empty message). */
function describe(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  if (error.message) return error.message;
  if (error instanceof AggregateError && error.errors.length > 0)
    return error.errors.map((inner: unknown) => describe(inner)).join('; ');
  const code = (error as { code?: unknown }).code;
  return typeof code === 'string' ? code : error.name;
}

function describeForJson(error: unknown): Record<string, unknown> {
  const described: Record<string, unknown> = { message: describe(error) };
  if (error instanceof LeaseError) described.code = error.code;
  else if (typeof (error as { code?: unknown }).code === 'string')
    described.code = (error as { code: string }).code;
  const detail = (error as { detail?: unknown }).detail;
  if (typeof detail === 'string') described.detail = detail;
  const hint = (error as { hint?: unknown }).hint;
  if (typeof hint === 'string') described.hint = hint;
  return described;
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (error: unknown) => {
    console.error(error);
    process.exitCode = EXIT.FAILURE;
  },
);
