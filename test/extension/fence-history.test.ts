/**
 * I12 over a randomized history: several workers with short ttls compete for a few keys and
 * write to a table fenced by `lease.fence_row`, some of them stalling past their expiry, before
 * their fence or inside the fenced transaction. Every grant, renewal, release, fence and commit
 * is logged with server times (`clock_timestamp()`, in microseconds) read around it. Afterwards
 * every committed row is checked against the log:
 *
 * - its epoch is a grant of its key that the writer held;
 * - that grant was live when the fence ran: the fence started before the expiry in force
 *   (the grant's, or that of the last renewal committed before the fence) and no release of it
 *   had committed;
 * - no later grant of the key committed before the row did: every later grant's commit was
 *   observed after the row's transaction had reached its COMMIT.
 *
 * Each check compares a bound that the contract guarantees with a reading that a broken fence
 * would cross, so that the test cannot fail for a correct implementation whatever the timing:
 * e.g. a later grant was committed by the time its worker read the clock after it, and a
 * fenced transaction's commit comes after the clock reading just before it. A fence without
 * its row lock lets a takeover commit while a stalled fenced transaction is open; a fence that
 * accepts an older epoch lets a stalled worker write after the takeover. Both break the last
 * check (and the second also the liveness one), which the test reports with the worker, key,
 * epochs and times.
 *
 * The random choices come from a seeded generator; a failure prints its seed, and
 * PG_LEASE_FENCE_SEED=<seed> replays the same choices (timing still varies).
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { createFencedTable, STALE_EPOCH } from '../support/fence.js';
import { uniqueKey } from '../support/helpers.js';
import { micros } from '../support/lease-calls.js';
import { generator } from '../support/history-model.js';

const WORKERS = 5;
const KEYS = 2;
const TTL_MS = 300;
const RUN_MS = 12_000;
/** How likely a worker stalls past its expiry before a fenced write, or inside one. */
const STALL_BEFORE = 0.15;
const STALL_INSIDE = 0.15;

let db: TestDatabase;
before(async () => {
  db = await createTestDatabase();
  await createFencedTable(db.pool, 'history');
});
after(() => db.close());

interface Grant {
  key: string;
  worker: string;
  epoch: bigint;
  expiresAt: bigint;
  /** Server time read after the granting statement returned: the grant had committed. */
  committedBy: bigint;
  /** Renewals: new expiry, and the server time by which the renewal had committed. */
  renewals: { expiresAt: bigint; committedBy: bigint }[];
  /** Server time by which a release of the grant had committed. */
  releasedBy?: bigint;
}

interface Write {
  id: number;
  key: string;
  worker: string;
  epoch: bigint;
  /** Server time read just before the fence's statement (in the fenced transaction). */
  fenceStart: bigint;
  /** Server time read just before COMMIT, in the transaction: the commit came after it. */
  beforeCommit: bigint;
  stalledInside: boolean;
}

interface Refusal {
  key: string;
  worker: string;
  epoch: bigint;
  fenceStart: bigint;
  /** Server time read after the refusal. */
  refusedBy: bigint;
}


const NOW = `${micros('clock_timestamp()')} AS now`;

async function now(client: pg.Client): Promise<bigint> {
  const { rows } = await client.query<{ now: string }>(`SELECT ${NOW}`);
  return BigInt(rows[0]!.now);
}

interface History {
  grants: Grant[];
  writes: Write[];
  refusals: Refusal[];
  stallsInside: number;
  stallsBefore: number;
}

async function runWorker(
  name: string,
  keys: string[],
  random: () => number,
  deadline: number,
  history: History,
  ids: { next: number },
): Promise<void> {
  const client = new pg.Client({ connectionString: db.url, application_name: name });
  client.on('error', () => undefined);
  await client.connect();
  const stall = () => sleep(TTL_MS * (1.5 + random()));
  try {
    while (Date.now() < deadline) {
      const key = keys[Math.floor(random() * keys.length)]!;
      const { rows } = await client.query<{ acquired: boolean; epoch: string; expires_us: string }>(
        `SELECT acquired, epoch::text AS epoch, ${micros('expires_at')} AS expires_us
           FROM lease.acquire($1, $2, $3::int * interval '1 millisecond')`,
        [key, name, TTL_MS],
      );
      const committedBy = await now(client);
      const row = rows[0]!;
      if (!row.acquired) {
        await sleep(random() * TTL_MS * 0.2);
        continue;
      }
      const epoch = BigInt(row.epoch);
      let grant = history.grants.find((g) => g.key === key && g.epoch === epoch);
      if (!grant) {
        grant = { key, worker: name, epoch, expiresAt: BigInt(row.expires_us), committedBy, renewals: [] };
        history.grants.push(grant);
      }

      let lost = false;
      const writes = 1 + Math.floor(random() * 3);
      for (let i = 0; i < writes && !lost; i++) {
        if (random() < STALL_BEFORE) {
          history.stallsBefore++;
          await stall();
        }
        const stallInside = random() < STALL_INSIDE;
        const id = ids.next++;
        await client.query('BEGIN');
        const fenceStart = await now(client);
        try {
          // The trigger runs the fence; the stall comes after it, before the commit.
          await client.query('INSERT INTO history VALUES ($1, $2, $3, $4)', [id, key, String(epoch), name]);
          if (stallInside) {
            history.stallsInside++;
            await stall();
          }
          const beforeCommit = await now(client);
          await client.query('COMMIT');
          history.writes.push({ id, key, worker: name, epoch, fenceStart, beforeCommit, stalledInside: stallInside });
        } catch (error) {
          await client.query('ROLLBACK');
          if ((error as { code?: string }).code !== STALE_EPOCH) throw error;
          history.refusals.push({ key, worker: name, epoch, fenceStart, refusedBy: await now(client) });
          lost = true;
          break;
        }
        if (random() < 0.5) {
          const renewed = await client.query<{ status: string; expires_us: string | null }>(
            `SELECT status, ${micros('expires_at')} AS expires_us
               FROM lease.renew($1, $2, $3, $4::int * interval '1 millisecond')`,
            [key, name, String(epoch), TTL_MS],
          );
          const renewedBy = await now(client);
          if (renewed.rows[0]!.status !== 'ok') lost = true;
          else grant.renewals.push({ expiresAt: BigInt(renewed.rows[0]!.expires_us!), committedBy: renewedBy });
        }
      }
      if (!lost && random() < 0.5) {
        const released = await client.query<{ status: string }>(
          'SELECT status FROM lease.release($1, $2, $3)',
          [key, name, String(epoch)],
        );
        if (released.rows[0]!.status === 'ok') grant.releasedBy = await now(client);
      }
    }
  } finally {
    await client.end().catch(() => undefined);
  }
}

/** The expiry in force for `grant` at a moment after `at`, as far as the log proves it. */
function expiryInForce(grant: Grant, at: bigint): bigint {
  let expiry = grant.expiresAt;
  for (const renewal of grant.renewals) if (renewal.committedBy < at) expiry = renewal.expiresAt;
  return expiry;
}

/** Every way the history breaks I12 (or refuses a write it should have let through). */
function violations(history: History): string[] {
  const found: string[] = [];
  const us = (t: bigint) => `${t} us`;
  for (const write of history.writes) {
    const what = `row ${write.id} (${write.worker}, key ${write.key}, epoch ${write.epoch})`;
    const grant = history.grants.find((g) => g.key === write.key && g.epoch === write.epoch);
    if (!grant || grant.worker !== write.worker) {
      found.push(`${what}: no grant of that epoch to that worker`);
      continue;
    }
    const expiry = expiryInForce(grant, write.fenceStart);
    if (write.fenceStart >= expiry)
      found.push(`${what}: fenced at ${us(write.fenceStart)} or later, the grant expired at ${us(expiry)}`);
    if (grant.releasedBy !== undefined && grant.releasedBy < write.fenceStart)
      found.push(`${what}: fenced after the grant was released (by ${us(grant.releasedBy)})`);
    for (const later of history.grants) {
      if (later.key !== write.key || later.epoch <= write.epoch) continue;
      if (later.committedBy < write.beforeCommit)
        found.push(
          `${what}${write.stalledInside ? ', stalled inside its transaction,' : ''} committed after ` +
            `${us(write.beforeCommit)}, but epoch ${later.epoch} (${later.worker}) had committed by ${us(later.committedBy)}`,
        );
    }
  }
  for (const refusal of history.refusals) {
    const grant = history.grants.find((g) => g.key === refusal.key && g.epoch === refusal.epoch)!;
    const expiry = expiryInForce(grant, refusal.fenceStart);
    const takenOver = history.grants.some(
      (g) => g.key === refusal.key && g.epoch > refusal.epoch && g.committedBy < refusal.refusedBy,
    );
    // Refused although the grant was surely live at the fence, and nobody could have taken it.
    if (refusal.refusedBy < expiry && !takenOver && grant.releasedBy === undefined)
      found.push(
        `${refusal.worker}'s write under epoch ${refusal.epoch} of ${refusal.key} was refused by ` +
          `${us(refusal.refusedBy)}, before the grant's expiry at ${us(expiry)}`,
      );
  }
  return found;
}

describe('fenced writes over a randomized history (I12)', () => {
  test('every committed row carries a grant live at its fence, and no later grant committed before it', async (t) => {
    const seed = Number(process.env.PG_LEASE_FENCE_SEED ?? Math.floor(Math.random() * 2 ** 31));
    const random = generator(seed);
    const keys = Array.from({ length: KEYS }, (_, i) => uniqueKey(`history-${i}`));
    const history: History = { grants: [], writes: [], refusals: [], stallsInside: 0, stallsBefore: 0 };
    const ids = { next: 1 };
    const deadline = Date.now() + RUN_MS;
    await Promise.all(
      Array.from({ length: WORKERS }, (_, i) => {
        const workerRandom = generator(Math.floor(random() * 2 ** 31));
        return runWorker(`worker-${i}`, keys, workerRandom, deadline, history, ids);
      }),
    );

    const context = `seed ${seed}: ${history.grants.length} grants, ${history.writes.length} commits, ${history.refusals.length} refusals, ${history.stallsBefore} stalls before and ${history.stallsInside} inside a fenced transaction`;
    t.diagnostic(context);
    // The table holds exactly the logged commits.
    const { rows } = await db.pool.query<{ id: number; lease_key: string; lease_epoch: string; note: string }>(
      'SELECT id, lease_key, lease_epoch::text, note FROM history ORDER BY id',
    );
    assert.deepEqual(
      rows.map((row) => `${row.id} ${row.lease_key} ${row.lease_epoch} ${row.note}`),
      [...history.writes]
        .sort((a, b) => a.id - b.id)
        .map((write) => `${write.id} ${write.key} ${write.epoch} ${write.worker}`),
      context,
    );
    const found = violations(history);
    const shown = found.slice(0, 10).join('\n');
    const more = found.length > 10 ? `\n... and ${found.length - 10} more` : '';
    assert.equal(found.length, 0, `I12 broken (${context}):\n${shown}${more}`);
    // A history without these would not have tested the fence.
    assert.ok(history.refusals.length > 0, `no write was refused (${context})`);
    assert.ok(history.stallsInside > 0, `no worker stalled inside a fenced transaction (${context})`);
    const takeovers = history.grants.filter((g) =>
      history.grants.some((older) => older.key === g.key && older.epoch === g.epoch - 1n && older.releasedBy === undefined),
    );
    assert.ok(takeovers.length > 0, `no lapsed grant was taken over (${context})`);
  });
});
