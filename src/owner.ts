/**
 * Default owner identities: readable enough to tell in `lease.inspect` who holds a key, unique
 * enough that two holders never share one by accident (a shared owner would make a second
 * acquire an idempotent re-acquire of the first holder's grant).
 */
import { randomBytes } from 'node:crypto';
import * as os from 'node:os';

/**
 * A fresh owner identity `host:pid:suffix`, with a random suffix so that every call gives a
 * different owner, also within one process. With `role`, `role/host:pid:suffix`: the form an
 * installation that binds owners to roles (`lease.bind_owners(true)`) requires, `role` being a
 * database role the connection's user is a member of.
 *
 * @example
 * import { defaultOwner } from 'pg-lease';
 * defaultOwner(); // 'build-7:41213:5f0c9a1e'
 * defaultOwner({ role: 'billing' }); // 'billing/build-7:41213:5f0c9a1e'
 */
export function defaultOwner(options: { role?: string } = {}): string {
  // Host names are at most 255 bytes, so the identity stays far below the 1000-byte limit.
  const identity = `${os.hostname()}:${process.pid}:${randomBytes(4).toString('hex')}`;
  return options.role === undefined ? identity : `${options.role}/${identity}`;
}
