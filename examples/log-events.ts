/**
 * Example: one log line per pg-lease client event.
 *
 * `logLeaseEvents(logger)` subscribes to the events (see src/events.ts) and writes a short line
 * with the fields that matter for each: info for the routine ones, warn for failed renewals,
 * lost leases and broken pool connections. Any logger with `info` and `warn` taking a string
 * works (console, or a pino/winston child logger). Returns the function that unsubscribes.
 *
 * In your project, import from 'pg-lease' instead of '../src/index.js'.
 */
import { subscribeLeaseEvents } from '../src/index.js';

export interface LineLogger {
  info(line: string): void;
  warn(line: string): void;
}

const ms = (value: number) => `${Math.round(value)}ms`;

export function logLeaseEvents(logger: LineLogger = console): () => void {
  return subscribeLeaseEvents({
    acquired: (e) =>
      logger.info(
        `lease acquired key=${e.key} owner=${e.owner} epoch=${e.epoch} waited=${ms(e.waitedMs)}`,
      ),
    notAcquired: (e) =>
      logger.info(`lease not acquired key=${e.key} reason=${e.reason} waited=${ms(e.waitedMs)}`),
    renewed: (e) =>
      logger.info(`lease renewed key=${e.key} epoch=${e.epoch} latency=${ms(e.latencyMs)}`),
    renewalFailed: (e) =>
      logger.warn(
        `lease renewal failed key=${e.key} epoch=${e.epoch} retrying=${e.retrying} ` +
          `time_left=${ms(e.timeLeftMs)} error=${JSON.stringify(e.error instanceof Error ? e.error.message || e.error.name : String(e.error))}`,
      ),
    lost: (e) =>
      logger.warn(
        `lease lost key=${e.key} epoch=${e.epoch} reason=${e.reason} source=${e.source}` +
          (e.source === 'deadline' ? ' (no renewal confirmed in time: server unreachable?)' : ''),
      ),
    released: (e) =>
      logger.info(
        `lease released key=${e.key} epoch=${e.epoch} status=${e.status} held=${ms(e.heldMs)}`,
      ),
    connectionError: (e) =>
      logger.warn(
        `lease client connection failed connection=${e.connection} error=${JSON.stringify(e.error instanceof Error ? e.error.message || e.error.name : String(e.error))}`,
      ),
  });
}
