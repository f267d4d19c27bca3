/**
 * `pg-lease exec`: run a command while holding a lease, the way `flock` runs one while holding
 * a file lock, but fenced and across machines.
 */
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { LeaseAbortedError, LeaseInvalidInputError, LeaseTimeoutError } from '../errors.js';
import { checkDuration, limitViolation } from '../validation.js';
import { openLeaseClient, parseCommand, print, required, warn } from './common.js';
import { printFailure } from './errors.js';
import { ExecReporter, failureOf } from './exec-events.js';
import { commandHelp } from './help.js';
import { EXIT, UsageError } from './exit-codes.js';

/**
 * Signals passed on to the command's process group. The group is not the terminal's foreground
 * group, so the terminal's Ctrl-C reaches the command only this way.
 */
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
    limit: { type: 'string' },
    shared: { type: 'boolean', default: false },
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
  const limit = limitOf(values.limit, values.shared);
  const verbose = values.verbose;
  const json = values.json;
  // --verbose: what happens to the lease and the command, one line per event on stderr.
  const reporter = new ExecReporter({ enabled: verbose, json, key });
  /** pg-lease's own outcome: one JSON object on stdout with --json, else a line on stderr. */
  const outcome = (text: string, value: Record<string, unknown>) =>
    json ? print(true, text, value) : warn(text);
  /** A failure of pg-lease's own, printed as every command prints one. */
  const failed = (code: string, message: string, exit: number): number => {
    printFailure(json, { code, message });
    return exit;
  };

  // One handler for the whole run, installed before anything can be signalled: while waiting
  // a signal stops the wait (nothing is acquired); once the command is started it is passed on
  // to the command's group (also when it arrives between the spawn and the first await).
  const stopWaiting = new AbortController();
  let forward: ((signal: NodeJS.Signals) => void) | undefined;
  const pending: NodeJS.Signals[] = [];
  let acquired = false;
  const onSignal = (signal: NodeJS.Signals) => {
    if (forward) forward(signal);
    else if (stopWaiting.signal.aborted || acquired) pending.push(signal);
    else stopWaiting.abort(signal);
  };
  for (const signal of FORWARDED_SIGNALS) process.on(signal, onSignal);

  const { client, close } = openLeaseClient(values);
  try {
    reporter.follow();
    let lease;
    if (values.wait !== undefined) {
      // An invalid --wait is told by acquire, which refuses it.
      const wait = checkDuration('wait', values.wait, 'non-negative');
      if (wait.violation === undefined)
        reporter.emit({
          event: 'waiting',
          key,
          wait: values.wait,
          waitMs: wait.microseconds / 1000,
        });
    }
    try {
      lease = await client.acquire(key, {
        ttl,
        keepAlive: true,
        signal: stopWaiting.signal,
        ...(values.wait === undefined ? {} : { wait: values.wait }),
        ...(values.owner === undefined ? {} : { owner: values.owner }),
        ...(limit === undefined ? {} : { limit }),
        ...(values.shared ? { shared: true } : {}),
      });
    } catch (error) {
      if (error instanceof LeaseAbortedError) {
        const signal = stopWaiting.signal.reason as NodeJS.Signals;
        outcome(`not acquired: ${signal} stopped the wait for ${key}`, {
          acquired: false,
          key,
          reason: 'signal',
          signal,
        });
        return 128 + (os.constants.signals[signal] ?? 0);
      }
      if (!(error instanceof LeaseTimeoutError)) throw error;
      outcome(`not acquired: ${key} was still held when --wait ran out`, {
        acquired: false,
        key,
        reason: 'timeout',
      });
      return EXIT.NOT_ACQUIRED;
    }
    acquired = true;
    if (!lease) {
      outcome(`not acquired: ${key} ${heldText(limit, values.shared)}`, {
        acquired: false,
        key,
        reason: 'held',
      });
      return EXIT.NOT_ACQUIRED;
    }
    reporter.granted(lease);
    if (lease.lost) {
      // Granted, but too late to be of use (a wait that ate the whole ttl): do not start.
      await lease.release().catch(() => undefined);
      return failed(
        'lease_lost',
        `${describeLoss(lease.lost)}; not running the command`,
        EXIT.LOST,
      );
    }

    // detached: the command leads a process group (and session) of its own, so that loss and
    // forwarded signals reach everything it started, not only its first process.
    const child = spawn(command[0]!, command.slice(1), {
      stdio: 'inherit',
      detached: true,
      env: {
        ...process.env,
        PG_LEASE_KEY: lease.key,
        PG_LEASE_OWNER: lease.owner,
        PG_LEASE_EPOCH: lease.epoch.toString(),
      },
    });
    if (child.pid !== undefined)
      reporter.emit({ event: 'started', pid: child.pid, command: [...command] });
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>(
      (resolve, reject) => {
        child.once('exit', (code, signal) => resolve({ code, signal }));
        child.once('error', reject);
      },
    );

    const signalGroup = (signal: NodeJS.Signals) => {
      try {
        if (child.pid !== undefined) process.kill(-child.pid, signal);
      } catch {
        // the group is gone
      }
    };
    forward = (signal: NodeJS.Signals) => {
      reporter.emit({ event: 'signal', signal, reason: 'forwarded' });
      signalGroup(signal);
    };
    for (const signal of pending.splice(0)) forward(signal);

    let killTimer: NodeJS.Timeout | undefined;
    const onLoss = () => {
      const lost = lease.lost;
      if (!lost) return; // released: the command has exited already
      signalGroup('SIGTERM');
      killTimer = setTimeout(() => {
        reporter.emit({ event: 'signal', signal: 'SIGKILL', reason: 'grace' });
        signalGroup('SIGKILL');
      }, graceMs);
      // Told once the client has published the loss (it aborts the signal first), so that the
      // event stream has the loss before what exec did about it.
      queueMicrotask(() => {
        if (!json)
          warn(
            `${describeLoss(lost)}; stopping the command (SIGTERM, SIGKILL after ${values.grace ?? DEFAULT_GRACE})`,
          );
        reporter.emit({ event: 'signal', signal: 'SIGTERM', reason: 'lost' });
      });
    };
    lease.signal.addEventListener('abort', onLoss, { once: true });

    let ended;
    let lostWhileRunning;
    let released: string | undefined;
    try {
      ended = await exited;
      lostWhileRunning = lease.lost;
      reporter.emit({
        event: 'exited',
        pid: child.pid ?? null,
        exitCode: ended.code,
        signal: ended.signal,
      });
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      return failed(
        code ?? 'error',
        `cannot run ${command[0]}: ${(error as Error).message}`,
        code === 'ENOENT' || (code === 'EACCES' && !onPath(command[0]!))
          ? EXIT.NOT_FOUND
          : EXIT.CANNOT_EXECUTE,
      );
    } finally {
      clearTimeout(killTimer);
      lease.signal.removeEventListener('abort', onLoss);
      forward = () => undefined;
      // Nothing the command started may go on once the lease is released.
      signalGroup('SIGTERM');
      await lease.release().then(
        (status) => {
          released = status;
          // With --verbose the client's release event has been told already.
          if (!json && !verbose && status !== 'ok' && !lease.lost)
            warn(`released ${key}: ${status}`);
        },
        (error: unknown) => {
          released = `error: ${(error as Error).message}`;
          reporter.emit({
            event: 'releaseFailed',
            key: lease.key,
            owner: lease.owner,
            epoch: lease.epoch,
            error: failureOf(error),
          });
          if (!json)
            warn(`could not release ${key} (it lapses at its expiry): ${(error as Error).message}`);
        },
      );
    }
    if (lostWhileRunning) {
      // As text, the loss was told when it happened (it stopped the command).
      if (json)
        printFailure(true, {
          code: 'lease_lost',
          message: `${describeLoss(lostWhileRunning)}; the command was stopped`,
        });
      return EXIT.LOST;
    }
    const exit = ended.signal
      ? 128 + (os.constants.signals[ended.signal] ?? 0)
      : (ended.code ?? EXIT.FAILURE);
    if (json)
      print(true, '', {
        key: lease.key,
        owner: lease.owner,
        epoch: lease.epoch,
        exitCode: ended.code,
        signal: ended.signal,
        released,
      });
    return exit;
  } finally {
    for (const signal of FORWARDED_SIGNALS) process.off(signal, onSignal);
    reporter.close();
    await close();
  }
}

/**
 * `--limit N` as a number (1 to 1000), checked with `--shared` before anything is sent: the
 * two do not combine (a counted key takes no shared grants).
 */
function limitOf(text: string | undefined, shared: boolean): number | undefined {
  if (text === undefined) return undefined;
  if (shared)
    throw new UsageError(
      '--limit and --shared cannot be combined: a counted key takes no shared grants',
    );
  const limit = /^\d+$/.test(text) ? Number(text) : text;
  const violation = limitViolation(limit);
  if (violation !== undefined) throw new LeaseInvalidInputError(violation);
  return limit as number;
}

/** Why a key was not granted at once, by kind of grant. */
function heldText(limit: number | undefined, shared: boolean): string {
  if (limit !== undefined)
    return `has no free permit (all ${limit} are held), or is held exclusively`;
  if (shared) return 'is held exclusively, or an exclusive acquirer waits for it';
  return 'is held by another owner';
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
