#!/usr/bin/env node
/**
 * The `pg-lease` command: leases from the shell. See docs/cli.md.
 */
import { LeaseError, LeaseInvalidInputError } from '../errors.js';
import { toJson, warn } from './common.js';
import { demoCommand } from './demo.js';
import { execCommand } from './exec.js';
import { EXIT, UsageError } from './exit-codes.js';
import { installCommand } from './install.js';
import { acquireCommand, inspectCommand, releaseCommand, renewCommand } from './lease-commands.js';

const USAGE = `Usage: pg-lease <command> [options]

Commands:
  acquire  --key K --ttl D [--wait D] [--owner O]      take a lease once, print its epoch
  renew    --key K --owner O --epoch E --ttl D         extend a lease
  release  --key K --owner O --epoch E                 end a lease
  inspect  --key K                                     show a key's holder and epoch
  exec     --key K --ttl D [--wait D] [--owner O] [--grace D] -- command [args...]
                                                       run a command while holding a lease
  install  [--from-bundle]                             install pg_lease into the database
  demo     [--url URL]                                 watch leases at work on a throwaway server

Options for every command:
  --url URL    connection string (default: $DATABASE_URL)
  --json       print one JSON object instead of text
  -h, --help   help for the command

Durations (D) are PostgreSQL intervals: 30s, 1min, 1h30m, 00:01:30, PT30S; a bare
number counts seconds. Exit codes: 0 ok, 1 failure, 64 usage or invalid input,
75 not acquired, 76 lease lost or gone; exec returns its command's own status.`;

const COMMANDS: Record<string, (args: string[]) => Promise<number>> = {
  acquire: acquireCommand,
  renew: renewCommand,
  release: releaseCommand,
  inspect: inspectCommand,
  exec: execCommand,
  install: installCommand,
  demo: demoCommand,
};

export async function main(argv: string[]): Promise<number> {
  const [name, ...args] = argv;
  if (name === undefined || name === '--help' || name === '-h' || name === 'help') {
    process.stdout.write(`${USAGE}\n`);
    return name === undefined ? EXIT.USAGE : EXIT.OK;
  }
  const command = COMMANDS[name];
  if (!command) {
    warn(`unknown command "${name}"; run pg-lease --help`);
    return EXIT.USAGE;
  }
  const json = args.includes('--json');
  try {
    return await command(args);
  } catch (error) {
    return report(error, json, name);
  }
}

function report(error: unknown, json: boolean, command: string): number {
  if (error instanceof UsageError) {
    warn(`${error.message}; run pg-lease ${command} --help`);
    return EXIT.USAGE;
  }
  if (json) process.stdout.write(`${toJson({ error: describeForJson(error) })}\n`);
  if (error instanceof LeaseInvalidInputError) {
    warn(`${error.message}: ${error.detail}${error.hint ? `\nhint: ${error.hint}` : ''}`);
    return EXIT.USAGE;
  }
  warn(describe(error));
  return EXIT.FAILURE;
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
  if (error instanceof LeaseInvalidInputError) described.detail = error.detail;
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
