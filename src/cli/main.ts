#!/usr/bin/env node
/**
 * The `pg-lease` command: leases from the shell. See docs/cli.md; the help texts are in help.ts.
 */
import * as fs from 'node:fs';
import { BUNDLED_VERSION } from '../generated/sql.js';
import { wantsJson } from './common.js';
import { demoCommand } from './demo.js';
import { execCommand } from './exec.js';
import { describeFailure, printFailure } from './errors.js';
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
  if (name === undefined || name === '--help' || name === '-h' || name === 'help') {
    process.stdout.write(`${usage()}\n`);
    return name === undefined ? EXIT.USAGE : EXIT.OK;
  }
  if (name === '--version' || name === '-V') {
    process.stdout.write(`${versionLine()}\n`);
    return EXIT.OK;
  }
  const command = COMMANDS[name];
  if (!command)
    return report(new UsageError(`unknown command ${JSON.stringify(name)}`), args, undefined);
  try {
    return await command(args);
  } catch (error) {
    return report(error, args, name);
  }
}

/** The package's version (dist/src/cli/main.js sits three levels below package.json). */
function versionLine(): string {
  const manifest = JSON.parse(
    fs.readFileSync(new URL('../../../package.json', import.meta.url), 'utf8'),
  ) as { version: string };
  return `pg-lease ${manifest.version} (bundles the pg_lease extension ${BUNDLED_VERSION})`;
}

/** Prints an error as every command prints one (see errors.ts) and returns its exit code. */
function report(error: unknown, args: string[], command: string | undefined): number {
  const { failure, exit } = describeFailure(error, args, command);
  printFailure(wantsJson(args), failure);
  return exit;
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
