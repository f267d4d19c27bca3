/**
 * Small helpers shared by the client and CLI tests. Everything runs against a real server.
 */
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';

/** Polls `condition` until it holds; fails the test after `timeoutMs`. */
export async function waitFor(
  what: string,
  condition: () => boolean | Promise<boolean>,
  timeoutMs = 20_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) assert.fail(`timed out waiting until ${what}`);
    await sleep(20);
  }
}

/** Resolves with the signal's reason once it aborts; fails the test after `timeoutMs`. */
export async function abortReason(signal: AbortSignal, timeoutMs = 20_000): Promise<unknown> {
  if (signal.aborted) return signal.reason;
  const timer = new AbortController();
  try {
    return await Promise.race([
      new Promise((resolve) =>
        signal.addEventListener('abort', () => resolve(signal.reason), { once: true }),
      ),
      sleep(timeoutMs, undefined, { signal: timer.signal }).then(() =>
        assert.fail(`signal did not abort within ${timeoutMs} ms`),
      ),
    ]);
  } finally {
    timer.abort();
  }
}

/** A key no other test uses. */
let keys = 0;
export function uniqueKey(prefix = 'key'): string {
  return `${prefix}-${process.pid}-${++keys}`;
}
