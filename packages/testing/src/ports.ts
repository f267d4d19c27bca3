/**
 * TCP ports for throwaway servers, reserved with lock files the way PostgreSQL's own test
 * clusters reserve theirs (PostgreSQL::Test::Cluster): a port is taken only by creating
 * `<port>.lock` exclusively in a directory every harness process on the machine shares, so two
 * test processes never get the same port even when they ask at the same moment. A lock whose
 * process is gone is stale and taken over.
 *
 * Ports come from 20000-32767: below Linux's ephemeral range (32768-60999), so an outgoing
 * connection of some other program cannot be handed a reserved port between the reservation
 * and the server's start. A candidate must also accept a bind on the loopback address, which
 * skips ports other software is listening on.
 */
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';

const FIRST_PORT = 20_000;
const LAST_PORT = 32_767;

/** A port held by this process until {@link PortReservation.release}. */
export interface PortReservation {
  readonly port: number;
  /** The lock file; removing it frees the port. */
  readonly lockFile: string;
  release(): void;
}

/**
 * The directory of the lock files: shared by every user (sticky and world-writable, like
 * /tmp), so that root and normal-user runs on one machine see each other's reservations.
 * `PG_LEASE_PORT_DIR` overrides it.
 */
export function portLockDir(): string {
  const dir = process.env.PG_LEASE_PORT_DIR ?? path.join(os.tmpdir(), 'pg-lease-ports');
  if (!fs.existsSync(dir)) {
    fs.mkdirSync(dir, { recursive: true });
    try {
      fs.chmodSync(dir, 0o1777);
    } catch {
      // made by another user in the meantime; theirs is as good
    }
  }
  return dir;
}

/** Reserves a free loopback port; see the module comment for how. */
export async function reservePort(host: string): Promise<PortReservation> {
  const dir = portLockDir();
  // From a random start, every port of the range in turn, so that one free port is found
  // however full the range is, and parallel runs mostly start far apart.
  const size = LAST_PORT - FIRST_PORT + 1;
  const start = Math.floor(Math.random() * size);
  for (let offset = 0; offset < size; offset++) {
    const port = FIRST_PORT + ((start + offset) % size);
    const lockFile = path.join(dir, `${port}.lock`);
    if (!takeLock(lockFile)) continue;
    if (await bindable(port, host)) {
      return {
        port,
        lockFile,
        release: () => fs.rmSync(lockFile, { force: true }),
      };
    }
    fs.rmSync(lockFile, { force: true });
  }
  throw new Error(`pg-lease-testing: no free port in ${FIRST_PORT}-${LAST_PORT} (locks in ${dir})`);
}

/** Creates the lock exclusively, or takes over one whose process has ended. */
function takeLock(lockFile: string): boolean {
  for (let round = 0; round < 2; round++) {
    try {
      fs.writeFileSync(lockFile, `${process.pid}\n`, { flag: 'wx', mode: 0o644 });
      return true;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
    }
    const stale = stalePid(lockFile);
    if (stale === undefined) return false;
    // Two processes may both find the lock stale. Each moves it aside under a name of its
    // own; one that finds it moved a lock with another pid (the other's fresh one) puts it
    // back and gives up this port.
    const claimed = `${lockFile}.${process.pid}.stale`;
    try {
      fs.renameSync(lockFile, claimed);
    } catch {
      return false;
    }
    const moved = readPid(claimed);
    if (moved !== stale) {
      try {
        fs.linkSync(claimed, lockFile);
      } catch {
        // a third process holds the port now; either way it is not ours
      }
      fs.rmSync(claimed, { force: true });
      return false;
    }
    fs.rmSync(claimed, { force: true });
  }
  return false;
}

/** The pid of a lock whose process has ended, or undefined when the lock is live or unreadable. */
function stalePid(lockFile: string): number | undefined {
  const pid = readPid(lockFile);
  if (pid === undefined) return undefined;
  try {
    process.kill(pid, 0);
    return undefined;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'ESRCH' ? pid : undefined;
  }
}

function readPid(file: string): number | undefined {
  try {
    const pid = Number(fs.readFileSync(file, 'utf8').trim());
    return Number.isInteger(pid) && pid > 0 ? pid : undefined;
  } catch {
    return undefined;
  }
}

async function bindable(port: number, host: string): Promise<boolean> {
  return new Promise((resolve) => {
    const server = net.createServer();
    server.unref();
    server.once('error', () => resolve(false));
    server.listen({ port, host, exclusive: true }, () => server.close(() => resolve(true)));
  });
}
