/**
 * A node:test reporter that counts leaf tests per suite (the first folder under `test/`) and
 * writes the counts as JSON. `scripts/test.ts` prints the closing line from it and the matrix
 * builds its version x suite table from it.
 */
import * as path from 'node:path';

interface TestEvent {
  type: string;
  data: {
    file?: string;
    skip?: boolean | string;
    todo?: boolean | string;
    details?: { type?: string };
  };
}

/** Counts of one suite. */
export interface SuiteCounts {
  passed: number;
  failed: number;
  skipped: number;
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
  const suites: Record<string, SuiteCounts> = {};
  for await (const event of source) {
    if (event.type !== 'test:pass' && event.type !== 'test:fail') continue;
    if (event.data.details?.type === 'suite') continue;
    const counts = (suites[suiteOf(event.data.file)] ??= { passed: 0, failed: 0, skipped: 0 });
    if (event.type === 'test:fail') counts.failed++;
    else if (event.data.skip || event.data.todo) counts.skipped++;
    else counts.passed++;
  }
  yield JSON.stringify(suites) + '\n';
}
