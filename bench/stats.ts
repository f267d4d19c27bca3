/** Small, dependency-free statistics for latency logs and round-to-round medians. */

/**
 * Percentile by the nearest-rank method on a sorted array (the convention pgbench's own
 * latency reports and most load tools use): the smallest value with at least p% of samples
 * at or below it.
 *
 * @example
 * percentile([1, 2, 3, 4], 50); // 2
 */
export function percentile(sorted: ArrayLike<number>, p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length, Math.max(1, rank)) - 1]!;
}

/** Median of unsorted values; NaN for none. */
export function median(values: number[]): number {
  const finite = values.filter((v) => Number.isFinite(v)).sort((a, b) => a - b);
  if (finite.length === 0) return Number.NaN;
  const mid = finite.length >> 1;
  return finite.length % 2 === 1 ? finite[mid]! : (finite[mid - 1]! + finite[mid]!) / 2;
}

/** Arithmetic mean; NaN for none. */
export function mean(values: ArrayLike<number>): number {
  if (values.length === 0) return Number.NaN;
  let sum = 0;
  for (let i = 0; i < values.length; i++) sum += values[i]!;
  return sum / values.length;
}

/** Latency summary of one sample set, in microseconds. */
export interface LatencySummary {
  n: number;
  meanUs: number;
  p50Us: number;
  p95Us: number;
  p99Us: number;
  maxUs: number;
  /**
   * Share of samples logged as exactly 0 us. pgbench can log a call as 0 us when its thread
   * lost the core between sending and reading: it then reuses the clock reading it took
   * before. Above a percent or so, percentiles of short calls are understated.
   */
  zeroShare: number;
}

/** Summarises latencies given in microseconds. */
export function summarise(latenciesUs: number[]): LatencySummary {
  const sorted = Float64Array.from(latenciesUs).sort();
  let zeros = 0;
  while (zeros < sorted.length && sorted[zeros] === 0) zeros++;
  return {
    n: sorted.length,
    meanUs: mean(sorted),
    p50Us: percentile(sorted, 50),
    p95Us: percentile(sorted, 95),
    p99Us: percentile(sorted, 99),
    maxUs: sorted.length ? sorted[sorted.length - 1]! : Number.NaN,
    zeroShare: sorted.length ? zeros / sorted.length : Number.NaN,
  };
}

/** Rounds for display without losing the magnitude of small ratios. */
export function round(value: number, digits = 3): number {
  if (!Number.isFinite(value)) return value;
  const factor = 10 ** digits;
  return Math.round(value * factor) / factor;
}
