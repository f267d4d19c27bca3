/**
 * `pg-lease install`: put pg_lease into a database.
 */
import { PgLeaseDowngradeError, installPgLease } from '../install.js';
import { openClient, parseCommand, print } from './common.js';
import { CliError } from './errors.js';
import { commandHelp } from './help.js';
import { EXIT } from './exit-codes.js';

/** SQLSTATE of CREATE EXTENSION for an extension whose files the server lacks. */
const FEATURE_NOT_SUPPORTED = '0A000';
/** SQLSTATE of a missing control file on older servers. */
const UNDEFINED_FILE = '58P01';

export async function installCommand(args: string[]): Promise<number> {
  const { values } = parseCommand(args, { 'from-bundle': { type: 'boolean', default: false } });
  if (values.help) {
    process.stdout.write(`${commandHelp('install')}\n`);
    return EXIT.OK;
  }
  const fromBundle = values['from-bundle'];
  const client = openClient(values);
  await client.connect();
  try {
    const result = await installPgLease(client, { fromBundle });
    const how = result.method === 'extension' ? 'as an extension' : 'from the bundled script';
    print(
      values.json,
      result.created
        ? `installed pg_lease ${result.version} ${how}`
        : result.updatedFrom
          ? `updated pg_lease from ${result.updatedFrom} to ${result.version} (${how})`
          : `pg_lease ${result.version} is already installed (${how}); nothing to do`,
      { ...result },
    );
    return EXIT.OK;
  } catch (error) {
    if (error instanceof PgLeaseDowngradeError)
      throw new CliError('downgrade', error.message.replace(/^pg_lease: /, ''), {
        hint: 'install this package at the installed version or newer; pg-lease --version shows the version it bundles',
      });
    const code = (error as { code?: unknown }).code;
    if (!fromBundle && (code === FEATURE_NOT_SUPPORTED || code === UNDEFINED_FILE))
      throw new CliError(code, (error as Error).message, {
        hint:
          'the server has no pg_lease extension files: install them (make install in extension/), ' +
          'or run: pg-lease install --from-bundle',
      });
    throw error;
  } finally {
    await client.end();
  }
}
