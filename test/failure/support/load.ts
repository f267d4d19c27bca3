/**
 * A lease workload with a ledger: several clients cycle acquire/renew/release over a few keys
 * and write down every grant the server confirmed to them, with the server's own times. The
 * ledger is the evidence the crash-under-load check judges: epochs unique per key, and no
 * grant made while an earlier grant of the key was still confirmed to its holder.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import {
  acquireTimed as acquire,
  releaseTimed as release,
  renew,
} from '../../support/lease-calls.js';
import { connect, disconnect } from './sessions.js';

/** One grant as its holder saw it. Times are server times in microseconds. */
export interface GrantRecord {
  key: string;
  owner: string;
  epoch: bigint;
  /** Server time of the granting statement. */
  grantedAt: bigint;
  /** Expiry the server last confirmed to the holder (by acquire or an `ok` renew). */
  confirmedUntilUs: bigint;
  /** The holder's release returned `ok`. */
  released: boolean;
  /**
   * A call for this grant was in flight when the connection died, so the server may have
   * applied it (a release, say) without the holder ever hearing back.
   */
  uncertain: boolean;
}

export interface LoadOptions {
  url: string;
  keys: string[];
  clients: number;
  /** Owner names are `${ownerPrefix}-${client number}`. */
  ownerPrefix: string;
  /** Lease TTL in milliseconds. */
  ttlMs: number;
  signal: AbortSignal;
}

export interface LoadResult {
  grants: GrantRecord[];
  /** Calls that returned (including denied acquires and non-`ok` statuses). */
  calls: number;
  /** Errors that ended a client, e.g. its connection dying in a crash. */
  errors: Error[];
}

/**
 * Runs the workload until `signal` aborts or every client's connection has died.
 * Each client: acquire a random key (no wait); if granted, renew it zero to two times, then
 * release it (most of the time) or abandon it to lapse so that others take it over.
 */
export async function runLoad(options: LoadOptions): Promise<LoadResult> {
  const result: LoadResult = { grants: [], calls: 0, errors: [] };
  await Promise.all(
    Array.from({ length: options.clients }, (_, n) =>
      runClient(options, `${options.ownerPrefix}-${n}`, result),
    ),
  );
  return result;
}

async function runClient(options: LoadOptions, owner: string, result: LoadResult): Promise<void> {
  const { keys, signal } = options;
  const ttl = `${options.ttlMs} milliseconds`;
  const db = await connect(options.url, owner);
  // This client's latest grant per key: a same-owner re-acquire of a still-valid grant must
  // return that grant unchanged (same epoch and expiry) and is not a new grant.
  const latest = new Map<string, GrantRecord>();
  // Keys this client abandoned and leaves alone until they lapse, so that mostly other
  // clients take them over; the rest it may re-acquire while still valid.
  const shunnedUntil = new Map<string, number>();
  const ttlMs = options.ttlMs;
  let current: GrantRecord | undefined;
  try {
    while (!signal.aborted) {
      const now = Date.now();
      const open = keys.filter((k) => (shunnedUntil.get(k) ?? 0) <= now);
      const key = open[Math.floor(Math.random() * open.length)] ?? keys[0]!;
      current = undefined;
      const grant = await acquire(db, key, owner, ttl);
      result.calls++;
      if (!grant.acquired) {
        await sleep(Math.random() * 5);
        continue;
      }
      const previous = latest.get(key);
      if (previous && previous.epoch === grant.epoch) {
        if (previous.released || grant.expiresAt !== previous.confirmedUntilUs) {
          throw new Error(
            `re-acquire of ${key} by ${owner} returned epoch ${grant.epoch} with another expiry`,
          );
        }
        current = previous;
      } else {
        current = {
          key,
          owner,
          epoch: grant.epoch!,
          grantedAt: grant.grantedAt!,
          confirmedUntilUs: grant.expiresAt!,
          released: false,
          uncertain: false,
        };
        latest.set(key, current);
        result.grants.push(current);
      }

      let valid = true;
      for (let renewals = Math.floor(Math.random() * 3); renewals > 0 && valid; renewals--) {
        await sleep(Math.random() * 40);
        const renewed = await renew(db, key, owner, current.epoch, ttl);
        result.calls++;
        if (renewed.status === 'ok') current.confirmedUntilUs = renewed.expiresAt!;
        else valid = false;
      }
      if (valid && Math.random() < 0.6) {
        const released = await release(db, key, owner, current.epoch);
        result.calls++;
        current.released = released.status === 'ok';
      } else if (Math.random() < 0.8) {
        shunnedUntil.set(key, Date.now() + ttlMs + 50);
      }
    }
    current = undefined;
  } catch (error) {
    if (current) current.uncertain = true;
    result.errors.push(error as Error);
  } finally {
    await disconnect(db);
  }
}

/**
 * Judges a ledger. Returns one line per violation:
 * - two grants of one key with the same epoch (I2/I3: every grant gets a fresh epoch);
 * - a grant made while an earlier grant of the key, never released, was still confirmed to
 *   its holder (I1: the later grant's server time is before the earlier one's confirmed
 *   expiry). An earlier grant that was released, or whose release may have been in flight,
 *   can legitimately be followed at any time: only its epoch order is judged.
 */
export function findViolations(grants: GrantRecord[]): string[] {
  const violations: string[] = [];
  const byKey = new Map<string, GrantRecord[]>();
  for (const grant of grants) {
    const list = byKey.get(grant.key) ?? [];
    list.push(grant);
    byKey.set(grant.key, list);
  }
  for (const [key, list] of byKey) {
    list.sort((a, b) => (a.epoch < b.epoch ? -1 : a.epoch > b.epoch ? 1 : 0));
    for (let i = 1; i < list.length; i++) {
      if (list[i]!.epoch === list[i - 1]!.epoch) {
        violations.push(
          `${key}: epoch ${list[i]!.epoch} granted twice (${list[i - 1]!.owner}, ${list[i]!.owner})`,
        );
      }
    }
    for (const earlier of list) {
      if (earlier.released || earlier.uncertain) continue;
      for (const later of list) {
        if (later.epoch <= earlier.epoch) continue;
        if (later.grantedAt < earlier.confirmedUntilUs) {
          violations.push(
            `${key}: ${later.owner} got epoch ${later.epoch} ` +
              `${earlier.confirmedUntilUs - later.grantedAt} us before ${earlier.owner}'s ` +
              `epoch ${earlier.epoch} expired`,
          );
        }
      }
    }
  }
  return violations;
}

/**
 * Per key, the least epoch the server must report from now on: the greatest epoch any client
 * was granted, or that epoch + 1 when its holder's release was confirmed.
 */
export function committedWatermarks(grants: GrantRecord[]): Map<string, bigint> {
  const watermarks = new Map<string, bigint>();
  for (const grant of grants) {
    const floor = grant.released ? grant.epoch + 1n : grant.epoch;
    const seen = watermarks.get(grant.key) ?? 0n;
    watermarks.set(grant.key, floor > seen ? floor : seen);
  }
  return watermarks;
}

/** Grants that took a key over from an earlier grant left to lapse (the next epoch after it). */
export function countTakeovers(grants: GrantRecord[]): number {
  const byKeyAndEpoch = new Map(grants.map((g) => [`${g.key}\u0000${g.epoch}`, g]));
  return grants.filter((g) => {
    const earlier = byKeyAndEpoch.get(`${g.key}\u0000${g.epoch - 1n}`);
    return earlier !== undefined && !earlier.released && !earlier.uncertain;
  }).length;
}
