/**
 * `pg-lease list`: the keys of the database at a glance, as `lease.list` reports them.
 */
import type { LeaseClient, LeaseHolder } from '../client.js';
import type { ListedLease } from '../operations.js';
import { openLeaseClient, parseCommand, print } from './common.js';
import { commandHelp } from './help.js';
import { EXIT } from './exit-codes.js';

export const LIST_OPTIONS = {
  prefix: { type: 'string' },
  all: { type: 'boolean', default: false },
} as const;

export async function listCommand(args: string[]): Promise<number> {
  const { values } = parseCommand(args, LIST_OPTIONS);
  if (values.help) {
    process.stdout.write(`${commandHelp('list')}\n`);
    return EXIT.OK;
  }
  const { client, close } = openLeaseClient(values);
  try {
    const listed = await client.list({
      ...(values.prefix === undefined ? {} : { prefix: values.prefix }),
      all: values.all,
    });
    const leases = await withHolders(client, listed);
    print(values.json, leaseTable(leases, values.all), { leases });
    return EXIT.OK;
  } finally {
    await close();
  }
}

/** A listed key with, when many hold it, each of its holders. */
export type ListedWithHolders = ListedLease & { holders?: LeaseHolder[] };

/**
 * The keys as listed, each key held by many (a counted key's permits, shared grants; listed
 * with no owner) with its holders, asked for one key at a time (a holder may be gone by then;
 * the key then shows as listed).
 */
export async function withHolders(
  client: Pick<LeaseClient, 'holders'>,
  listed: ListedLease[],
): Promise<ListedWithHolders[]> {
  const leases: ListedWithHolders[] = [];
  for (const lease of listed) {
    if (!(lease.held && lease.owner === null)) leases.push(lease);
    else leases.push({ ...lease, holders: await client.holders(lease.key) });
  }
  return leases;
}

/** The text table of `list` and `watch`: one line per key, or a note when there is none. */
export function leaseTable(leases: ListedWithHolders[], all: boolean): string {
  if (leases.length === 0) return all ? '(no keys)' : '(no key is held)';
  const rows = [
    ['KEY', 'STATE', 'OWNER', 'EPOCH', 'TIME LEFT'],
    ...leases.flatMap((lease) =>
      lease.holders !== undefined && lease.holders.length > 0
        ? lease.holders.map((holder) => [
            printable(lease.key),
            `held (${lease.holders!.length})`,
            printable(holder.owner),
            holder.epoch.toString(),
            timeLeft(holder.remainingMs),
          ])
        : [
            [
              printable(lease.key),
              lease.held ? 'held' : 'free',
              lease.owner === null ? '-' : printable(lease.owner),
              lease.epoch.toString(),
              lease.remainingMs === null ? '-' : timeLeft(lease.remainingMs),
            ],
          ],
    ),
  ];
  const widths = rows[0]!.map((_, column) => Math.max(...rows.map((row) => row[column]!.length)));
  return rows
    .map((row) =>
      row
        .map((cell, column) => (column === row.length - 1 ? cell : cell.padEnd(widths[column]!)))
        .join('  '),
    )
    .join('\n');
}

/** Milliseconds as the largest two units: `950ms`, `12.3s`, `4m05s`, `2h10m`, `3d04h`. */
export function timeLeft(ms: number): string {
  if (ms < 1_000) return `${Math.floor(ms)}ms`;
  if (ms < 60_000) return `${(Math.floor(ms / 100) / 10).toFixed(1)}s`;
  const s = Math.floor(ms / 1_000);
  const two = (n: number) => String(n).padStart(2, '0');
  if (s < 3_600) return `${Math.floor(s / 60)}m${two(s % 60)}s`;
  if (s < 86_400) return `${Math.floor(s / 3_600)}h${two(Math.floor(s / 60) % 60)}m`;
  return `${Math.floor(s / 86_400)}d${two(Math.floor(s / 3_600) % 24)}h`;
}

/** Control characters (a key may hold any text) shown as escapes, so they cannot move the cursor. */
function printable(text: string): string {
  // eslint-disable-next-line no-control-regex
  return text.replace(/[\u0000-\u001f\u007f-\u009f]/g, (c) => JSON.stringify(c).slice(1, -1));
}
