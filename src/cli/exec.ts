/**
 * `pg-lease exec`: run a command while holding a lease, the way `flock` runs one while holding
 * a file lock, but fenced and across machines.
 */
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { LeaseClient } from '../client.js';
import { LeaseInvalidInputError, LeaseTimeoutError } from '../errors.js';
import { checkDuration } from '../validation.js';
import { connectionString, parseCommand, required, warn } from './common.js';
import { commandHelp } from './help.js';
import { EXIT, UsageError } from './exit-codes.js';

/** Signals passed on to the command; the terminal's SIGINT also reaches it directly. */
const FORWARDED_SIGNALS: NodeJS.Signals[] = [
  'SIGHUP',
  'SIGINT',
  'SIGQUIT',
  'SIGTERM',
  'SIGUSR1',
  'SIGUSR2',
];

const DEFAULT_GRACE = '10s';

export async function execCommand(args: string[]): Promise<number> {
  const separator = args.indexOf('--');
  const { values } = parseCommand(separator === -1 ? args : args.slice(0, separator), {
    key: { type: 'string' },
    ttl: { type: 'string' },
    wait: { type: 'string' },
    owner: { type: 'string' },
    grace: { type: 'string' },
    verbose: { type: 'boolean', default: false },
  });
  if (values.help) {
    process.stdout.write(`${commandHelp('exec')}\n`);
    return EXIT.OK;
  }
  const command = separator === -1 ? [] : args.slice(separator + 1);
  if (command.length === 0) throw new UsageError('exec needs a command after --');
  const key = required(values, 'key');
  const ttl = required(values, 'ttl');
  const graceMs = graceMilliseconds(values.grace ?? DEFAULT_GRACE);
  const verbose = values.verbose;

  const client = new LeaseClient(connectionString(values));
  try {
    let lease;
    try {
      lease = await client.acquire(key, {
        ttl,
        keepAlive: true,
        ...(values.wait === undefined ? {} : { wait: values.wait }),
        ...(values.owner === undefined ? {} : { owner: values.owner }),
      });
    } catch (error) {
      if (!(error instanceof LeaseTimeoutError)) throw error;
      warn(`not acquired: ${key} was still held when --wait ran out`);
      return EXIT.NOT_ACQUIRED;
    }
    if (!lease) {
      warn(`not acquired: ${key} is held by another owner`);
      return EXIT.NOT_ACQUIRED;
    }
    if (verbose) warn(`holding ${key} as ${lease.owner}, epoch ${lease.epoch}`);
    if (lease.lost) {
      // Granted, but too late to be of use (a wait that ate the whole ttl): do not start.
      warn(`${describeLoss(lease.lost)}; not running the command`);
      await lease.release().catch(() => undefined);
      return EXIT.LOST;
    }

    const child = spawn(command[0]!, command.slice(1), {
      stdio: 'inherit',
      env: {
        ...process.env,
        PG_LEASE_KEY: lease.key,
        PG_LEASE_OWNER: lease.owner,
        PG_LEASE_EPOCH: lease.epoch.toString(),
      },
    });
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>(
      (resolve, reject) => {
        child.once('exit', (code, signal) => resolve({ code, signal }));
        child.once('error', reject);
      },
    );

    const forward = (signal: NodeJS.Signals) => {
      if (verbose) warn(`passing ${signal} on to the command`);
      child.kill(signal);
    };
    for (const signal of FORWARDED_SIGNALS) process.on(signal, forward);

    let killTimer: NodeJS.Timeout | undefined;
    const onLoss = () => {
      const lost = lease.lost;
      if (!lost) return; // released: the command has exited already
      warn(
        `${describeLoss(lost)}; stopping the command (SIGTERM, SIGKILL after ${values.grace ?? DEFAULT_GRACE})`,
      );
      child.kill('SIGTERM');
      killTimer = setTimeout(() => child.kill('SIGKILL'), graceMs);
    };
    lease.signal.addEventListener('abort', onLoss, { once: true });

    let outcome;
    let lostWhileRunning;
    try {
      outcome = await exited;
      lostWhileRunning = lease.lost;
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      warn(`cannot run ${command[0]}: ${(error as Error).message}`);
      return code === 'ENOENT' || (code === 'EACCES' && !onPath(command[0]!))
        ? EXIT.NOT_FOUND
        : EXIT.CANNOT_EXECUTE;
    } finally {
      clearTimeout(killTimer);
      lease.signal.removeEventListener('abort', onLoss);
      for (const signal of FORWARDED_SIGNALS) process.off(signal, forward);
      await lease.release().then(
        (status) => {
          if (verbose || (status !== 'ok' && !lease.lost)) warn(`released ${key}: ${status}`);
        },
        (error: unknown) =>
          warn(`could not release ${key} (it lapses at its expiry): ${(error as Error).message}`),
      );
    }
    if (lostWhileRunning) return EXIT.LOST;
    if (outcome.signal) return 128 + (os.constants.signals[outcome.signal] ?? 0);
    return outcome.code ?? EXIT.FAILURE;
  } finally {
    await client.end();
  }
}

function describeLoss(lost: Error): string {
  return lost.message.replace(/^pg_lease: /, '');
}

function graceMilliseconds(text: string): number {
  const grace = checkDuration('grace', text, 'non-negative');
  if (grace.violation !== undefined) throw new LeaseInvalidInputError(grace.violation);
  return grace.microseconds / 1000;
}

/**
 * Whether the command exists: a path as given, a bare name in some PATH directory. Node reports
 * EACCES for a name it did not find when a PATH directory was unreadable (root's PATH under
 * another user); like a shell, that is "not found" (127), not "cannot execute" (126).
 */
function onPath(command: string): boolean {
  if (command.includes('/')) return fs.existsSync(command);
  return (process.env.PATH ?? '')
    .split(path.delimiter)
    .some((dir) => dir !== '' && fs.existsSync(path.join(dir, command)));
}
