/**
 * Default owner identities: readable enough to tell in `lease.inspect` who holds a key, unique
 * enough that two holders never share one by accident (a shared owner would make a second
 * acquire an idempotent re-acquire of the first holder's grant).
 */
import { randomBytes } from 'node:crypto';
import * as os from 'node:os';

/** Read once: a host name does not change under a running process that anyone relies on. */
let hostname: string | undefined;
/** Where this process's suffixes start (random), and how many it has handed out. */
const start = randomBytes(4).readUInt32BE(0);
let issued = 0;

/**
 * A fresh owner identity `host:pid:suffix`. The suffix counts up from a random start, so every
 * call gives a different owner within one process (for 2^32 calls) and a restarted process with
 * the same pid starts somewhere else. With `role`, `role/host:pid:suffix`: the form an
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
  hostname ??= os.hostname();
  const suffix = ((start + issued++) >>> 0).toString(16).padStart(8, '0');
  const identity = `${hostname}:${process.pid}:${suffix}`;
  return options.role === undefined ? identity : `${options.role}/${identity}`;
}
