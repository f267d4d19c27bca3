/**
 * Small helpers every suite shares: polling for a condition, waiting for an abort, and keys
 * no other test uses.
 */
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';

/** Polls `condition` every 25 ms until it holds; fails the test after `timeoutMs`. */
export async function waitFor(
  what: string,
  condition: () => boolean | Promise<boolean>,
  timeoutMs = 20_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) assert.fail(`timed out after ${timeoutMs} ms waiting until ${what}`);
    await sleep(25);
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

let keyCounter = 0;

/** A key unique to this process and test, readable in failure output. */
export function uniqueKey(label = 'key'): string {
  return `${label}:${process.pid}:${++keyCounter}:${Math.random().toString(36).slice(2, 8)}`;
}

/**
 * Waits until a keep-alive handle has renewed since its expiry was `before` (ms), after an
 * outage, then checks that it was never lost and that the server still lists its grant.
 */
export async function assertRodeOut(
  client: {
    inspect(key: string): Promise<{ held: boolean; owner: string | null; epoch: bigint } | null>;
  },
  lease: { key: string; owner: string; epoch: bigint; expiresAt: Date; signal: AbortSignal },
  before: number,
): Promise<void> {
  await waitFor(
    'a renewal succeeds after the restart',
    () => lease.expiresAt.getTime() > before || lease.signal.aborted,
    30_000,
  );
  assert.equal(lease.signal.aborted, false, String(lease.signal.reason));
  const state = await client.inspect(lease.key);
  assert.equal(state?.held, true);
  assert.equal(state?.owner, lease.owner);
  assert.equal(state?.epoch, lease.epoch);
}
