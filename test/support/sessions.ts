/**
 * An isolationtester-style step runner: several sessions (one `pg.Client` each) and a monitor
 * connection that watches them.
 *
 * Like PostgreSQL's isolationtester, a step is sent to its session and then either completes
 * or is seen blocked: the monitor polls `pg_blocking_pids(pid)`, so a test knows that a session
 * waits on another's lock from the server itself, never from a sleep that guesses. A blocked
 * step keeps running in the background; the test goes on with other sessions and later awaits
 * the step's result.
 *
 * @example
 * await using iso = await Isolation.open(url, ['s1', 's2']);
 * const { s1, s2 } = iso.named;
 * await s1.query('BEGIN');
 * await s1.run(acquireCall(key, 'a', '1 min'));
 * const s2Acquire = s2.start(acquireCall(key, 'b', '1 min'));
 * await iso.untilBlocked(s2Acquire, s1); // s2 waits on s1's uncommitted grant
 * await s1.query('COMMIT');
 * assert.equal((await s2Acquire.result()).acquired, false);
 */
import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import type { Call, Queryable } from './lease-calls.js';

const POLL_MS = 10;
const DEFAULT_UNTIL_MS = 30_000;
/**
 * How long a step that must go through may be seen blocked before it counts as blocked. A
 * lock held for the few milliseconds of another session's single attempt is not a delay the
 * contract cares about; a lock held until another transaction ends is.
 */
const DEFAULT_BLOCK_GRACE_MS = 1_000;

/** Raised by a step that was required to go through but stayed blocked by other sessions. */
export class StepBlockedError extends Error {
  override name = 'StepBlockedError';
  constructor(
    readonly step: string,
    readonly blockers: string[],
  ) {
    super(`step "${step}" is blocked by ${blockers.join(', ')}`);
  }
}

/** A statement sent to a session; it may still be running. */
export class Step<T = pg.QueryResult> {
  #settledAt: number | undefined;
  readonly #promise: Promise<T>;

  /**
   * @param startedAt `performance.now()` read before the statement was sent: read after, a
   *   process descheduled in between would make the step look shorter than it was.
   */
  constructor(
    readonly session: Session,
    readonly description: string,
    promise: Promise<T>,
    readonly startedAt: number,
  ) {
    this.#promise = promise.finally(() => {
      this.#settledAt = performance.now();
    });
    // The outcome is read by result(); a rejection nobody awaits must not crash the run.
    this.#promise.catch(() => undefined);
  }

  /** Whether the statement has completed or failed. */
  get settled(): boolean {
    return this.#settledAt !== undefined;
  }

  /** Milliseconds from sending the statement to its completion (or until now if running). */
  get elapsedMs(): number {
    return (this.#settledAt ?? performance.now()) - this.startedAt;
  }

  /** Waits for the statement and returns its result (or throws its error). */
  result(): Promise<T> {
    return this.#promise;
  }

  /** Waits for the statement and returns its error; fails if it succeeded. */
  async error(): Promise<pg.DatabaseError> {
    try {
      await this.#promise;
    } catch (error) {
      assert.ok(error instanceof pg.DatabaseError, `expected a PostgreSQL error, got ${error}`);
      return error;
    }
    assert.fail(`step "${this.description}" succeeded but was expected to fail`);
  }

  /** Resolves when the statement has settled, never rejects. */
  settledPromise(): Promise<void> {
    return this.#promise.then(
      () => undefined,
      () => undefined,
    );
  }
}

/** One connection of an {@link Isolation} run. */
export class Session implements Queryable {
  #pending: Step<unknown> | undefined;

  constructor(
    readonly name: string,
    readonly client: pg.Client,
    readonly pid: number,
    private readonly iso: Isolation,
  ) {}

  /** Sends a statement and returns at once; the step runs in the background. */
  start(text: string, values?: unknown[]): Step;
  start<T>(call: Call<T>): Step<T>;
  start<T>(textOrCall: string | Call<T>, values: unknown[] = []): Step<T | pg.QueryResult> {
    const call = typeof textOrCall === 'string' ? undefined : textOrCall;
    const text = call ? call.text : (textOrCall as string);
    const params = call ? call.values : values;
    const startedAt = performance.now();
    const promise = this.client
      .query(text, params)
      .then((result) => (call ? call.parse(result) : result));
    const step = new Step<T | pg.QueryResult>(this, `${this.name}: ${text}`, promise, startedAt);
    this.#pending = step;
    return step;
  }

  /**
   * Runs a statement that must go through: resolves with its result, or rejects with
   * {@link StepBlockedError} when the monitor sees it blocked by another session for longer than
   * `graceMs`. The blocked statement then stays pending and is cancelled by close().
   */
  async query(
    text: string,
    values: unknown[] = [],
    options: { graceMs?: number } = {},
  ): Promise<pg.QueryResult> {
    const step = this.start(text, values);
    await this.iso.untilSettled(step, options.graceMs ?? DEFAULT_BLOCK_GRACE_MS);
    return step.result();
  }

  /** Typed form of {@link query}. */
  async run<T>(call: Call<T>, options: { graceMs?: number } = {}): Promise<T> {
    const step = this.start(call);
    await this.iso.untilSettled(step, options.graceMs ?? DEFAULT_BLOCK_GRACE_MS);
    return step.result();
  }

  /** Whether the last statement sent is still running. */
  get busy(): boolean {
    return this.#pending !== undefined && !this.#pending.settled;
  }
}

/** A set of sessions plus the monitor connection that watches them. */
export class Isolation<N extends string = string> implements AsyncDisposable {
  /** The sessions in the order they were named. */
  readonly sessions: Session[] = [];
  /** The sessions by name: `const { s1, s2 } = iso.named`. */
  readonly named = {} as { readonly [K in N]: Session };
  #closed = false;

  private constructor(readonly monitor: pg.Client) {}

  /** Opens one connection per name (application_name `pg_lease_test:<name>`) and a monitor. */
  static async open<const N extends string>(
    url: string,
    names: readonly N[],
  ): Promise<Isolation<N>> {
    const monitor = await connect(url, 'pg_lease_test:monitor');
    const iso = new Isolation<N>(monitor);
    try {
      for (const name of names) {
        const client = await connect(url, `pg_lease_test:${name}`);
        const { rows } = await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
        const session = new Session(name, client, rows[0]!.pid, iso as Isolation);
        iso.sessions.push(session);
        (iso.named as Record<string, Session>)[name] = session;
      }
    } catch (error) {
      await iso.close();
      throw error;
    }
    return iso;
  }

  /** The session of that name. */
  session(name: string): Session {
    const found = this.sessions.find((session) => session.name === name);
    assert.ok(found, `no session named ${name}`);
    return found;
  }

  /** Names of the sessions (or pids of other backends) that block `session` right now. */
  async blockers(session: Session): Promise<string[]> {
    const { rows } = await this.monitor.query<{ pids: number[] }>(
      'SELECT pg_blocking_pids($1) AS pids',
      [session.pid],
    );
    return rows[0]!.pids.map(
      (pid) => this.sessions.find((other) => other.pid === pid)?.name ?? `pid ${pid}`,
    );
  }

  /**
   * Waits until the step is blocked on a lock (by `by` when given), as the server reports it.
   * Fails if the step completes instead.
   */
  async untilBlocked(
    step: Step<unknown>,
    by?: Session,
    timeoutMs = DEFAULT_UNTIL_MS,
  ): Promise<void> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      if (step.settled) await this.#failSettled(step, 'block');
      const blockers = await this.blockers(step.session);
      if (blockers.length > 0 && (!by || blockers.includes(by.name))) return;
      if (performance.now() > deadline)
        assert.fail(`step "${step.description}" did not block within ${timeoutMs} ms`);
      await sleep(POLL_MS);
    }
  }

  /**
   * Waits until the step either completes or is blocked on a lock (by `by` when given), for
   * interleavings where the contract allows both: a call that needs no lock may answer at once.
   */
  async blockedOrSettled(
    step: Step<unknown>,
    by?: Session,
    timeoutMs = DEFAULT_UNTIL_MS,
  ): Promise<'blocked' | 'settled'> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      if (step.settled) return 'settled';
      const blockers = await this.blockers(step.session);
      if (blockers.length > 0 && (!by || blockers.includes(by.name))) return 'blocked';
      if (performance.now() > deadline)
        assert.fail(`step "${step.description}" neither completed nor blocked in ${timeoutMs} ms`);
      await sleep(POLL_MS);
    }
  }

  /**
   * Waits until the step is waiting inside the server: blocked on a lock, or sleeping between
   * attempts (wait event class `Timeout`, e.g. `PgSleep`). Fails if the step completes instead.
   */
  async untilWaiting(step: Step<unknown>, timeoutMs = DEFAULT_UNTIL_MS): Promise<void> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      if (step.settled) await this.#failSettled(step, 'wait');
      const { rows } = await this.monitor.query<{ waiting: boolean }>(
        `SELECT state = 'active'
                AND (wait_event_type IN ('Timeout', 'Lock') OR cardinality(pg_blocking_pids(pid)) > 0)
                AS waiting
           FROM pg_stat_activity WHERE pid = $1`,
        [step.session.pid],
      );
      if (rows[0]?.waiting) return;
      if (performance.now() > deadline)
        assert.fail(`step "${step.description}" did not start waiting within ${timeoutMs} ms`);
      await sleep(POLL_MS);
    }
  }

  /**
   * Waits for a step that must go through. Rejects with {@link StepBlockedError} when the step
   * stays blocked by other backends for `graceMs` in a row.
   */
  async untilSettled(step: Step<unknown>, graceMs = DEFAULT_BLOCK_GRACE_MS): Promise<void> {
    let blockedSince: number | undefined;
    for (;;) {
      const settled = await Promise.race([
        step.settledPromise().then(() => true),
        sleep(POLL_MS).then(() => false),
      ]);
      if (settled) return;
      const blockers = await this.blockers(step.session);
      if (blockers.length === 0) {
        blockedSince = undefined;
        continue;
      }
      blockedSince ??= performance.now();
      if (performance.now() - blockedSince >= graceMs) {
        throw new StepBlockedError(step.description, blockers);
      }
    }
  }

  async #failSettled(step: Step<unknown>, expected: string): Promise<never> {
    let outcome: string;
    try {
      outcome = `completed with ${JSON.stringify(await step.result(), jsonSafe)}`;
    } catch (error) {
      outcome = `failed with ${String(error)}`;
    }
    assert.fail(`step "${step.description}" was expected to ${expected} but ${outcome}`);
  }

  /** Cancels statements still running, then closes every connection. Safe to call twice. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    const busy = this.sessions.filter((session) => session.busy).map((session) => session.pid);
    if (busy.length > 0) {
      await this.monitor
        .query('SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid', [busy])
        .catch(() => undefined);
    }
    await Promise.all(this.sessions.map((session) => session.client.end().catch(() => undefined)));
    await this.monitor.end().catch(() => undefined);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

function jsonSafe(_key: string, value: unknown): unknown {
  return typeof value === 'bigint' ? `${value}n` : value;
}

async function connect(url: string, applicationName: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: url, application_name: applicationName });
  // A backend terminated by close() reports an error on an idle client; that is expected.
  client.on('error', () => undefined);
  await client.connect();
  // A safety net against a hung test, far above any bound a test asserts.
  await client.query("SET statement_timeout = '90s'");
  return client;
}
