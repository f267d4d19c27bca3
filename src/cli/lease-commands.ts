/**
 * `pg-lease acquire | renew | release | inspect`: one call each, for scripts and operators.
 */
import type { LeaseClient } from '../client.js';
import { LeaseTimeoutError } from '../errors.js';
import { openLeaseClient, parseCommand, parseEpoch, print, required } from './common.js';
import { EXIT } from './exit-codes.js';
import { commandHelp } from './help.js';

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
  const { client, close } = openLeaseClient(values);
  try {
    return await run(client);
  } finally {
    await close();
  }
}

function help(command: 'acquire' | 'renew' | 'release' | 'inspect'): number {
  process.stdout.write(`${commandHelp(command)}\n`);
  return EXIT.OK;
}
