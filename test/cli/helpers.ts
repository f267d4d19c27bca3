/**
 * Running the built `pg-lease` command as a user would: a separate process, real arguments,
 * real exit codes.
 */
import assert from 'node:assert/strict';
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { waitFor } from '../support/helpers.js';

/** dist/src/cli/main.js, next to this file's compiled twin in dist/test/cli. */
export const CLI = path.resolve(
  path.dirname(fileURLToPath(import.meta.url)),
  '..',
  '..',
  'src',
  'cli',
  'main.js',
);

export interface CliResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/** A running `pg-lease` process whose output is collected as it comes. */
export interface RunningCli {
  child: ChildProcessWithoutNullStreams;
  stdout(): string;
  stderr(): string;
  /** Resolves when the process has exited. */
  done: Promise<CliResult>;
  /** Waits until stdout contains `text`. */
  waitForOutput(text: string, timeoutMs?: number): Promise<void>;
}

/** Environment without DATABASE_URL, so that only what a test passes is used. */
function cleanEnv(extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
  const env = { ...process.env, ...extra };
  if (!('DATABASE_URL' in extra)) delete env.DATABASE_URL;
  return env;
}

export function startCli(args: string[], env: NodeJS.ProcessEnv = {}): RunningCli {
  const child = spawn(process.execPath, [CLI, ...args], { env: cleanEnv(env) });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const done = new Promise<CliResult>((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code, signal) => resolve({ code, signal, stdout, stderr }));
  });
  return {
    child,
    stdout: () => stdout,
    stderr: () => stderr,
    done,
    waitForOutput: (text, timeoutMs = 20_000) =>
      waitFor(
        `output "${text}" (stdout so far: ${JSON.stringify(stdout)}, stderr: ${JSON.stringify(stderr)})`,
        () => stdout.includes(text),
        timeoutMs,
      ),
  };
}

/** Runs `pg-lease args...` to completion (failing the test if it takes over `timeoutMs`). */
export async function runCli(
  args: string[],
  env: NodeJS.ProcessEnv = {},
  timeoutMs = 30_000,
): Promise<CliResult> {
  const running = startCli(args, env);
  const timer = setTimeout(() => running.child.kill('SIGKILL'), timeoutMs);
  try {
    const result = await running.done;
    assert.notEqual(result.signal, 'SIGKILL', `pg-lease ${args.join(' ')} did not finish in time`);
    return result;
  } finally {
    clearTimeout(timer);
  }
}

/** Parses the single JSON object a `--json` command prints. */
export function parseJson(result: CliResult): Record<string, unknown> {
  try {
    return JSON.parse(result.stdout) as Record<string, unknown>;
  } catch {
    return assert.fail(`not JSON: ${result.stdout}\nstderr: ${result.stderr}`);
  }
}
