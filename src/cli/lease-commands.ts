/**
 * `pg-lease acquire | renew | release | inspect`: one call each, for scripts and operators.
 */
import { LeaseClient } from '../client.js';
import { LeaseTimeoutError } from '../errors.js';
import { connectionString, parseCommand, parseEpoch, print, required } from './common.js';
import { EXIT } from './exit-codes.js';

export const LEASE_COMMANDS_HELP = {
  acquire: `pg-lease acquire --key K --ttl D [--wait D] [--owner O] [--json]

Takes a lease once and prints its owner and epoch; nothing renews it afterwards (use
\`pg-lease renew\`, or \`pg-lease exec\` to hold a lease while a command runs).
Exit 0 when acquired, 75 when held by another owner or --wait ran out.`,
  renew: `pg-lease renew --key K --owner O --epoch E --ttl D [--json]

Extends a lease to server time + ttl. Exit 0 when ok, 76 for not_owner, lapsed or
epoch_mismatch (the status is printed).`,
  release: `pg-lease release --key K --owner O --epoch E [--json]

Ends a lease; the key becomes free and its epoch moves on. Exit 0 when ok, 76 otherwise.`,
  inspect: `pg-lease inspect --key K [--json]

Shows whether a key is held, by whom, its epoch (the fencing watermark when free) and
its expiry. Exit 0.`,
};

export async function acquireCommand(args: string[]): Promise<number> {
  const { values } = parseCommand(args, {
    key: { type: 'string' },
    ttl: { type: 'string' },
    wait: { type: 'string' },
    owner: { type: 'string' },
  });
  if (values.help) return help('acquire');
  const key = required(values, 'key');
  const ttl = required(values, 'ttl');
  return withClient(values, async (client) => {
    const owner = values.owner;
    let lease;
    try {
      lease = await client.acquire(key, {
        ttl,
        ...(values.wait === undefined ? {} : { wait: values.wait }),
        ...(owner === undefined ? {} : { owner }),
      });
    } catch (error) {
      if (!(error instanceof LeaseTimeoutError)) throw error;
      print(values.json, `not acquired: ${key} was still held when --wait ran out`, {
        acquired: false,
        key,
        reason: 'timeout',
      });
      return EXIT.NOT_ACQUIRED;
    }
    if (!lease) {
      print(values.json, `not acquired: ${key} is held by another owner`, {
        acquired: false,
        key,
        reason: 'held',
      });
      return EXIT.NOT_ACQUIRED;
    }
    print(
      values.json,
      [
        `acquired ${key}`,
        `  owner       ${lease.owner}`,
        `  epoch       ${lease.epoch}`,
        `  expires at  ${lease.expiresAt.toISOString()} (server time)`,
      ].join('\n'),
      {
        acquired: true,
        key,
        owner: lease.owner,
        epoch: lease.epoch,
        expiresAt: lease.expiresAt,
      },
    );
    return EXIT.OK;
  });
}

export async function renewCommand(args: string[]): Promise<number> {
  const { values } = parseCommand(args, {
    key: { type: 'string' },
    owner: { type: 'string' },
    epoch: { type: 'string' },
    ttl: { type: 'string' },
  });
  if (values.help) return help('renew');
  const key = required(values, 'key');
  const owner = required(values, 'owner');
  const epoch = parseEpoch(required(values, 'epoch'));
  const ttl = required(values, 'ttl');
  return withClient(values, async (client) => {
    const { status, expiresAt } = await client.renew(key, { owner, epoch, ttl });
    print(
      values.json,
      status === 'ok'
        ? `ok: ${key} renewed until ${expiresAt!.toISOString()} (server time)`
        : `${status}: ${key} was not renewed`,
      { key, status, expiresAt },
    );
    return status === 'ok' ? EXIT.OK : EXIT.LOST;
  });
}

export async function releaseCommand(args: string[]): Promise<number> {
  const { values } = parseCommand(args, {
    key: { type: 'string' },
    owner: { type: 'string' },
    epoch: { type: 'string' },
  });
  if (values.help) return help('release');
  const key = required(values, 'key');
  const owner = required(values, 'owner');
  const epoch = parseEpoch(required(values, 'epoch'));
  return withClient(values, async (client) => {
    const status = await client.release(key, { owner, epoch });
    print(
      values.json,
      status === 'ok' ? `ok: ${key} released` : `${status}: ${key} was not released`,
      { key, status },
    );
    return status === 'ok' ? EXIT.OK : EXIT.LOST;
  });
}

export async function inspectCommand(args: string[]): Promise<number> {
  const { values } = parseCommand(args, { key: { type: 'string' } });
  if (values.help) return help('inspect');
  const key = required(values, 'key');
  return withClient(values, async (client) => {
    const state = await client.inspect(key);
    if (!state) {
      print(values.json, `${key}: never leased`, {
        key,
        state: 'never',
        held: false,
        owner: null,
        epoch: null,
        expiresAt: null,
      });
    } else if (state.held) {
      print(
        values.json,
        `${key}: held by ${state.owner}, epoch ${state.epoch}, expires at ${state.expiresAt!.toISOString()} (server time)`,
        { key, state: 'held', ...state },
      );
    } else {
      print(
        values.json,
        `${key}: free (released or lapsed); epoch ${state.epoch} and older are stale`,
        { key, state: 'free', ...state },
      );
    }
    return EXIT.OK;
  });
}

async function withClient(
  values: { url?: string | undefined },
  run: (client: LeaseClient) => Promise<number>,
): Promise<number> {
  const client = new LeaseClient(connectionString(values));
  try {
    return await run(client);
  } finally {
    await client.end();
  }
}

function help(command: keyof typeof LEASE_COMMANDS_HELP): number {
  process.stdout.write(`${LEASE_COMMANDS_HELP[command]}\n`);
  return EXIT.OK;
}
