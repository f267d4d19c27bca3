/**
 * The listening connection: LISTEN on channel `pg_lease` on one connection of the client's
 * pool, shared by every waiter and observer of the client, so that a release wakes them
 * instead of their polling (see wait.ts for how waiters use it). It is held only while someone
 * waits, and a while after (LINGER_MS), for the next one.
 */
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { poolSize } from './connection.js';

/** The channel releases notify on; the payload is the key. */
export const NOTIFY_CHANNEL = 'pg_lease';

/** How long `notifications: 'auto'` waits for its probe notification to come back. */
const PROBE_TIMEOUT_MS = 2_000;
/** How long the listening connection stays after its last waiter, for the next one. */
const LINGER_MS = 2_000;

/** One waiter's interest in notifications for a key. */
export class Subscription {
  generation = 0;
  #waiters: (() => void)[] = [];
  readonly #close: () => void;

  constructor(close: () => void) {
    this.#close = close;
  }

  notify(): void {
    this.generation++;
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const wake of waiters) wake();
  }

  /** Resolves once a notification came after generation `seen`. */
  changed(seen: number): Promise<void> {
    if (this.generation !== seen) return Promise.resolve();
    return new Promise((resolve) => this.#waiters.push(resolve));
  }

  close(): void {
    this.#close();
  }
}

/**
 * The one listening connection of a client, and who listens on it. Each waiter or observer of
 * a key holds a {@link Subscription}; a notification for the key moves every subscription's
 * generation on, so that one that arrives while an attempt is out is not lost. @internal
 */
export class Notifier {
  readonly #pool: pg.Pool | undefined;
  readonly #mode: boolean | 'auto';
  readonly #subscriptions = new Map<string, Set<Subscription>>();
  #count = 0;
  #connection: pg.PoolClient | undefined;
  #connecting: Promise<boolean> | undefined;
  #linger: NodeJS.Timeout | undefined;
  #probes = new Map<string, () => void>();
  readonly #onError = new Map<pg.PoolClient, (error: Error) => void>();
  #closed = false;
  /** Whether notifications work: decided by the first LISTEN (and its probe for 'auto'). */
  verdict: boolean | undefined;

  /**
   * @param reportError told of an error of the listening connection (which is then dropped): the
   *   client reports it, as it reports the pool's.
   */
  constructor(
    pool: pg.Pool | undefined,
    mode: boolean | 'auto',
    private readonly reportError: (error: Error) => void,
  ) {
    this.#pool = pool;
    this.#mode = mode;
    // A pool of one connection would give it to the listener and none to the attempts.
    if (!pool || mode === false || poolSize(pool) < 2) this.verdict = false;
  }

  subscribe(key: string): Subscription {
    const subscription: Subscription = new Subscription(() => {
      const set = this.#subscriptions.get(key);
      set?.delete(subscription);
      if (set?.size === 0) this.#subscriptions.delete(key);
      if (--this.#count === 0) this.#scheduleLinger();
    });
    let set = this.#subscriptions.get(key);
    if (!set) this.#subscriptions.set(key, (set = new Set()));
    set.add(subscription);
    this.#count++;
    clearTimeout(this.#linger);
    return subscription;
  }

  /** Resolves true once LISTEN is in force on the listening connection, false to poll. */
  listen(): Promise<boolean> {
    if (this.verdict === false || this.#closed) return Promise.resolve(false);
    if (this.#connection) return Promise.resolve(true);
    this.#connecting ??= this.#connect().finally(() => (this.#connecting = undefined));
    return this.#connecting;
  }

  async #connect(): Promise<boolean> {
    const connection = await this.#pool!.connect();
    const onError = (error: Error) => {
      this.reportError(error);
      this.#drop(connection, true);
    };
    this.#onError.set(connection, onError);
    connection.on('error', onError);
    connection.on('notification', (message) => this.#dispatch(message));
    try {
      await connection.query(`LISTEN ${NOTIFY_CHANNEL}`);
      if (this.verdict === undefined && this.#mode === 'auto') {
        const token = `pg_lease probe ${randomUUID()}`;
        let timer: NodeJS.Timeout | undefined;
        const arrived = new Promise<boolean>((resolve) => {
          this.#probes.set(token, () => resolve(true));
          timer = setTimeout(() => resolve(false), PROBE_TIMEOUT_MS);
        });
        await this.#pool!.query('SELECT pg_catalog.pg_notify($1, $2)', [NOTIFY_CHANNEL, token]);
        const works = await arrived;
        clearTimeout(timer);
        this.#probes.delete(token);
        if (!works) {
          this.verdict = false;
          await connection.query(`UNLISTEN ${NOTIFY_CHANNEL}`).catch(() => undefined);
          this.#drop(connection, false);
          return false;
        }
      }
      this.verdict = true;
    } catch (error) {
      this.#drop(connection, true);
      throw error;
    }
    if (this.#closed) {
      this.#drop(connection, false);
      return false;
    }
    this.#connection = connection;
    if (this.#count === 0) this.#scheduleLinger();
    return true;
  }

  #dispatch(message: pg.Notification): void {
    if (message.channel !== NOTIFY_CHANNEL || message.payload === undefined) return;
    const probe = this.#probes.get(message.payload);
    if (probe) return probe();
    for (const subscription of this.#subscriptions.get(message.payload) ?? [])
      subscription.notify();
  }

  /** Drops a broken or unneeded connection; waiters wake and try (and listen again). */
  #drop(connection: pg.PoolClient, broken: boolean): void {
    if (this.#connection === connection) this.#connection = undefined;
    const onError = this.#onError.get(connection);
    if (!onError) return; // dropped already
    this.#onError.delete(connection);
    connection.off('error', onError);
    connection.removeAllListeners('notification');
    try {
      connection.release(broken ? new Error('pg_lease: listening connection failed') : undefined);
    } catch {
      // released already
    }
    if (broken) for (const set of this.#subscriptions.values()) for (const s of set) s.notify();
  }

  #scheduleLinger(): void {
    clearTimeout(this.#linger);
    this.#linger = setTimeout(() => void this.#unlisten(), LINGER_MS);
    this.#linger.unref();
  }

  async #unlisten(): Promise<void> {
    const connection = this.#connection;
    if (!connection || this.#count > 0) return;
    this.#connection = undefined;
    try {
      await connection.query(`UNLISTEN ${NOTIFY_CHANNEL}`);
      this.#drop(connection, false);
    } catch {
      this.#drop(connection, true);
    }
  }

  async close(): Promise<void> {
    this.#closed = true;
    clearTimeout(this.#linger);
    await this.#connecting?.catch(() => undefined);
    this.#count = 0;
    await this.#unlisten();
  }
}
