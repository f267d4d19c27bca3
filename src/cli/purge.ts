/**
 * `pg-lease purge`: deletes keys that have been free or lapsed for a while (`lease.purge`).
 */
import { LeaseInvalidInputError } from '../errors.js';
import { isServerError } from '../sql/connection.js';
import { openLeaseClient, parseCommand, print, required } from './common.js';
import { CliError } from './errors.js';
import { commandHelp } from './help.js';
import { EXIT } from './exit-codes.js';

/** SQLSTATE insufficient_privilege. */
const INSUFFICIENT_PRIVILEGE = '42501';

export async function purgeCommand(args: string[]): Promise<number> {
  const { values } = parseCommand(args, {
    'older-than': { type: 'string' },
    batch: { type: 'string' },
  });
  if (values.help) {
    process.stdout.write(`${commandHelp('purge')}\n`);
    return EXIT.OK;
  }
  const olderThan = required(values, 'older-than');
  let batch: number | undefined;
  if (values.batch !== undefined) {
    batch = Number(values.batch);
    if (!/^\d+$/.test(values.batch) || !Number.isSafeInteger(batch) || batch < 1)
      throw new LeaseInvalidInputError(
        `batch must be a positive whole number, got ${JSON.stringify(values.batch)}`,
      );
  }
  const { client, close } = openLeaseClient(values);
  try {
    const purged = await client.purge({ olderThan, ...(batch === undefined ? {} : { batch }) });
    print(
      values.json,
      `purged ${purged} ${purged === 1 ? 'key' : 'keys'} free or lapsed for at least ${olderThan}`,
      { purged, olderThan },
    );
    return EXIT.OK;
  } catch (error) {
    if (isServerError(error, INSUFFICIENT_PRIVILEGE))
      throw new CliError(INSUFFICIENT_PRIVILEGE, (error as Error).message, {
        hint: 'lease.purge is for the role that created the extension and the roles it grants EXECUTE to',
      });
    throw error;
  } finally {
    await close();
  }
}
