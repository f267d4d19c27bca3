/**
 * A node:test reporter that counts leaf tests per suite (the first folder under `test/`) and
 * the seconds each test file took, and writes both as JSON. `scripts/test.ts` prints the
 * closing line and the slowest files from it; the matrix builds its version x suite table from
 * it.
 */
import * as path from 'node:path';

interface TestEvent {
  type: string;
  data: {
    file?: string;
    nesting?: number;
    skip?: boolean | string;
    todo?: boolean | string;
    details?: { type?: string; duration_ms?: number };
  };
}

/** Counts of one suite. */
export interface SuiteCounts {
  passed: number;
  failed: number;
  skipped: number;
}

/** What the reporter writes. */
export interface Summary {
  suites: Record<string, SuiteCounts>;
  /**
   * Seconds per test file: the sum of its top-level tests' durations, so a file whose tests
   * run concurrently counts more than its wall-clock time (a measure of what it waits for).
   */
  fileSeconds: Record<string, number>;
}

export function suiteOf(file: string | undefined): string {
  if (!file) return 'other';
  const parts = file.split(path.sep);
  const index = parts.lastIndexOf('test');
  return index >= 0 && index + 2 < parts.length ? parts[index + 1]! : 'other';
}

export default async function* summaryReporter(
  source: AsyncIterable<TestEvent>,
): AsyncGenerator<string> {
  const summary: Summary = { suites: {}, fileSeconds: {} };
  for await (const event of source) {
    if (event.type !== 'test:pass' && event.type !== 'test:fail') continue;
    const file = event.data.file ?? 'other';
    if (event.data.nesting === 0) {
      summary.fileSeconds[file] =
        (summary.fileSeconds[file] ?? 0) + (event.data.details?.duration_ms ?? 0) / 1000;
    }
    if (event.data.details?.type === 'suite') continue;
    const counts = (summary.suites[suiteOf(file)] ??= { passed: 0, failed: 0, skipped: 0 });
    if (event.type === 'test:fail') counts.failed++;
    else if (event.data.skip || event.data.todo) counts.skipped++;
    else counts.passed++;
  }
  yield JSON.stringify(summary) + '\n';
}
