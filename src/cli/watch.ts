/**
 * `pg-lease watch`: a live view of the keys, refreshed until Ctrl-C (or --count refreshes).
 *
 * On a terminal every refresh redraws the screen in place, with the cursor hidden until the
 * command ends; otherwise (a pipe, a file) frames follow each other, separated by a blank line.
 * With --json every refresh prints one JSON object per line. Ctrl-C (SIGINT) and SIGTERM end it
 * cleanly: the cursor comes back, the connection closes, and the exit code is 0.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { LeaseInvalidInputError } from '../errors.js';
import { checkDuration } from '../validation.js';
import { openLeaseClient, parseCommand, toJson } from './common.js';
import { describeFailure } from './errors.js';
import { commandHelp } from './help.js';
import { EXIT } from './exit-codes.js';
import { leaseTable, LIST_OPTIONS, withHolders } from './list.js';

const CLEAR = '\x1b[H\x1b[2J';
const HIDE_CURSOR = '\x1b[?25l';
const SHOW_CURSOR = '\x1b[?25h';

export async function watchCommand(args: string[]): Promise<number> {
  const { values } = parseCommand(args, {
    ...LIST_OPTIONS,
    interval: { type: 'string' },
    count: { type: 'string' },
  });
  if (values.help) {
    process.stdout.write(`${commandHelp('watch')}\n`);
    return EXIT.OK;
  }
  const interval = checkDuration('interval', values.interval ?? '1s', 'positive');
  if (interval.violation !== undefined) throw new LeaseInvalidInputError(interval.violation);
  const intervalUs = interval.microseconds;
  const count = values.count === undefined ? Infinity : Number(values.count);
  if (count !== Infinity && !(Number.isSafeInteger(count) && count >= 1))
    throw new LeaseInvalidInputError(
      `count must be a positive whole number, got ${JSON.stringify(values.count)}`,
    );

  const stop = new AbortController();
  // Installed with on(), not once(): a typed Ctrl-C can arrive twice (the terminal signals the
  // whole foreground group, and a wrapper such as script(1) may pass it on again); a second one
  // during shutdown must not kill the process with the default action.
  const onSignal = () => stop.abort();
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  const tty = process.stdout.isTTY === true && !values.json;
  const { client, close } = openLeaseClient(values);
  if (tty) process.stdout.write(HIDE_CURSOR);
  try {
    for (let shown = 0; shown < count && !stop.signal.aborted;) {
      let body: string;
      try {
        const leases = await withHolders(
          client,
          await client.list({
            ...(values.prefix === undefined ? {} : { prefix: values.prefix }),
            all: values.all,
          }),
        );
        if (values.json) {
          process.stdout.write(`${toJson({ at: new Date(), leases })}\n`);
          body = '';
        } else body = leaseTable(leases, values.all);
      } catch (error) {
        // The first refresh fails the command (a wrong URL, no extension); later ones are shown.
        if (shown === 0) throw error;
        if (values.json) {
          const { failure } = describeFailure(error, args, 'watch');
          process.stdout.write(`${toJson({ at: new Date(), error: failure })}\n`);
          body = '';
        } else body = `refresh failed: ${error instanceof Error ? error.message : String(error)}`;
      }
      if (stop.signal.aborted) break;
      if (!values.json) {
        const header = `pg-lease watch${values.prefix === undefined ? '' : ` ${JSON.stringify(values.prefix)}`}: ${new Date().toISOString()}, every ${values.interval ?? '1s'}${count === Infinity ? ', Ctrl-C to stop' : ''}`;
        process.stdout.write(
          tty ? `${CLEAR}${header}\n\n${body}\n` : `${shown > 0 ? '\n' : ''}${header}\n${body}\n`,
        );
      }
      shown++;
      if (shown >= count) break;
      await sleep(intervalUs / 1000, undefined, { signal: stop.signal }).catch(() => undefined);
    }
    return EXIT.OK;
  } finally {
    if (tty) process.stdout.write(SHOW_CURSOR);
    await close();
    process.removeListener('SIGINT', onSignal);
    process.removeListener('SIGTERM', onSignal);
  }
}
