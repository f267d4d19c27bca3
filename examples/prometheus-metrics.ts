/**
 * Example: Prometheus metrics from pg-lease's client events, with prom-client.
 *
 * `leaseMetrics()` subscribes to the events (see src/events.ts) and keeps counters, histograms
 * and a gauge in a prom-client registry; serve `registry.metrics()` on your /metrics endpoint.
 * Run it on its own to see it work against a database:
 *
 *   DATABASE_URL=postgres://... node dist/examples/prometheus-metrics.js   # then curl :9464/metrics
 *
 * Keys are not a label by default: a service that leases one key per job would create a time
 * series per job. Pass `keyLabel` to map keys to a small set of groups (say, their prefix).
 *
 * In your project, import from 'pg-lease' instead of '../src/index.js'.
 */
import * as http from 'node:http';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { LeaseClient, subscribeLeaseEvents } from '../src/index.js';

export interface LeaseMetricsOptions {
  /** Registry to register the metrics in. Default: a new one. */
  registry?: Registry;
  /** Maps a key to the value of a `key` label (keep the set small). Default: no key label. */
  keyLabel?: (key: string) => string;
}

export interface LeaseMetrics {
  registry: Registry;
  /** Unsubscribes from the events; the metrics keep their values. */
  stop(): void;
}

const LATENCY_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5];

export function leaseMetrics(options: LeaseMetricsOptions = {}): LeaseMetrics {
  const registry = options.registry ?? new Registry();
  const keyLabel = options.keyLabel;
  const withKey = (names: string[]) => (keyLabel ? [...names, 'key'] : names);
  const labels = (key: string, values: Record<string, string> = {}) =>
    keyLabel ? { ...values, key: keyLabel(key) } : values;

  const acquired = new Counter({
    name: 'pg_lease_acquired_total',
    help: 'Grants received by this process.',
    labelNames: withKey([]),
    registers: [registry],
  });
  const notAcquired = new Counter({
    name: 'pg_lease_not_acquired_total',
    help: 'Acquires that got no grant, by reason (held, timeout).',
    labelNames: withKey(['reason']),
    registers: [registry],
  });
  const acquireWait = new Histogram({
    name: 'pg_lease_acquire_wait_seconds',
    help: 'Time from sending an acquire to its grant, waits included.',
    labelNames: withKey([]),
    buckets: [...LATENCY_BUCKETS, 10, 30, 60],
    registers: [registry],
  });
  const renewLatency = new Histogram({
    name: 'pg_lease_renew_latency_seconds',
    help: 'Round trip of successful renewals.',
    labelNames: withKey([]),
    buckets: LATENCY_BUCKETS,
    registers: [registry],
  });
  const renewalFailures = new Counter({
    name: 'pg_lease_renewal_failures_total',
    help: 'Renewals that failed without a verdict (connection errors, timeouts), by whether keep-alive retries.',
    labelNames: withKey(['retrying']),
    registers: [registry],
  });
  const lost = new Counter({
    name: 'pg_lease_lost_total',
    help: 'Leases lost, by reason (not_owner, lapsed, epoch_mismatch, expired) and source (server, deadline).',
    labelNames: withKey(['reason', 'source']),
    registers: [registry],
  });
  const released = new Counter({
    name: 'pg_lease_released_total',
    help: 'Releases answered, by status.',
    labelNames: withKey(['status']),
    registers: [registry],
  });
  const held = new Gauge({
    name: 'pg_lease_held',
    help: 'Leases this process holds right now (acquired, neither lost nor released).',
    labelNames: withKey([]),
    registers: [registry],
  });
  const holding = new Set<string>();
  const grant = (e: { key: string; owner: string; epoch: bigint }) =>
    `${e.owner}\u0000${e.epoch}\u0000${e.key}`;
  const ended = (e: { key: string; owner: string; epoch: bigint }) => {
    if (holding.delete(grant(e))) held.dec(labels(e.key));
  };

  const stop = subscribeLeaseEvents({
    acquired: (e) => {
      acquired.inc(labels(e.key));
      acquireWait.observe(labels(e.key), e.waitedMs / 1000);
      if (!holding.has(grant(e))) {
        holding.add(grant(e));
        held.inc(labels(e.key));
      }
    },
    notAcquired: (e) => notAcquired.inc(labels(e.key, { reason: e.reason })),
    renewed: (e) => renewLatency.observe(labels(e.key), e.latencyMs / 1000),
    renewalFailed: (e) =>
      renewalFailures.inc(labels(e.key, { retrying: e.retrying ? 'true' : 'false' })),
    lost: (e) => {
      lost.inc(labels(e.key, { reason: e.reason, source: e.source }));
      ended(e);
    },
    released: (e) => {
      released.inc(labels(e.key, { status: e.status }));
      ended(e);
    },
  });
  return { registry, stop };
}

/** Serves the metrics on :PORT/metrics (default 9464) while a worker takes a lease in a loop. */
async function main(): Promise<void> {
  const { registry } = leaseMetrics({ keyLabel: (key) => key.split(':')[0]! });
  const server = http.createServer((request, response) => {
    if (request.url !== '/metrics') return void response.writeHead(404).end();
    void registry.metrics().then((text) => {
      response.writeHead(200, { 'content-type': registry.contentType }).end(text);
    });
  });
  server.listen(Number(process.env.PORT ?? 9464));
  const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL });
  const client = new LeaseClient(pool);
  for (;;) {
    await client.withLease('example:report', { ttl: '10s', wait: '30s' }, async () => {
      await new Promise((resolve) => setTimeout(resolve, 2_000));
    });
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) await main();
