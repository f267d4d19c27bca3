/**
 * Streaming standbys of a harness cluster, made with the server alone: the npm binaries ship
 * `postgres`, `initdb` and `pg_ctl` but no `pg_basebackup`, so the base backup is the
 * low-level one (`pg_backup_start` / `pg_backup_stop`, non-exclusive, on one connection) plus
 * a file copy of the data directory, and the standby streams from the primary over a
 * physical replication slot (PostgreSQL's own `PostgreSQL::Test::Cluster` `backup` and
 * `init_from_backup`, without the tool).
 *
 * Synchronous replication is switched on the primary with `ALTER SYSTEM` and a reload, so it
 * can be switched off again (a primary left with a dead synchronous standby waits forever).
 */
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { PgCluster } from './cluster.js';

/** Options for {@link startStandby}. */
export interface StandbyOptions {
  /**
   * Make it a synchronous standby: the primary's `synchronous_standby_names` becomes
   * `FIRST 1 (<name>)` and the call returns once the primary reports it `sync`. Default false.
   */
  synchronous?: boolean;
  /** Stream over a physical replication slot, so the primary keeps WAL the standby lacks. Default true. */
  slot?: boolean;
  /** The standby's `application_name` (letters, digits, `_`). Default: `standby_<random>`. */
  name?: string;
  /** Extra server settings of the standby; the primary's settings are the defaults. */
  settings?: Record<string, string | number | boolean>;
  /** As in `ClusterOptions.runAs`. */
  runAs?: string;
}

/** A running standby and where it streams from; disposing of it destroys its cluster. */
export interface Standby extends AsyncDisposable {
  readonly cluster: PgCluster;
  readonly primary: PgCluster;
  /** Its `application_name`, as `pg_stat_replication` and `synchronous_standby_names` know it. */
  readonly name: string;
  /** Its replication slot on the primary, if it uses one. */
  readonly slot: string | undefined;
}

const WAIT_MS = 60_000;

/** Settings of the primary that must not carry over to a standby made from it. */
const PRIMARY_ONLY = new Set([
  'synchronous_standby_names',
  'primary_conninfo',
  'primary_slot_name',
]);

/** Contents of the data dir a base backup leaves out: the server recreates them (see the backup docs). */
const EMPTY_DIRS = new Set([
  'pg_wal',
  'pg_replslot',
  'pg_dynshmem',
  'pg_notify',
  'pg_serial',
  'pg_snapshots',
  'pg_stat_tmp',
  'pg_subtrans',
]);
const SKIPPED_FILES = new Set([
  'postmaster.pid',
  'postmaster.opts',
  'backup_label',
  'tablespace_map',
  'backup_manifest',
  'standby.signal',
  'recovery.signal',
]);

/**
 * Starts a streaming standby of `primary` (which must be running) and returns once it
 * streams (and, when synchronous, once the primary counts it as its synchronous standby).
 * The standby is a {@link PgCluster} of its own: `crash()`, `stop()`, `start()` and
 * `destroy()` work on it as on any cluster, and {@link promote} makes it a primary.
 *
 * @example
 * await using primary = await PgCluster.start();
 * const url = await primary.createDatabase('leases');
 * const standby = await startStandby(primary, { synchronous: true });
 * await primary.crash();
 * await promote(standby.cluster);
 * // standby.cluster.url('leases') now serves every commit the primary acknowledged
 */
export async function startStandby(
  primary: PgCluster,
  options: StandbyOptions = {},
): Promise<Standby> {
  if (!primary.running) throw new Error('pg-lease: the primary must be running to take a backup');
  const name = options.name ?? `standby_${randomBytes(4).toString('hex')}`;
  if (!/^[a-z0-9_]+$/.test(name))
    throw new Error(`pg-lease: standby name "${name}" must be letters, digits and _`);
  const slot = (options.slot ?? true) ? name : undefined;
  if (slot)
    await primary.query('SELECT pg_catalog.pg_create_physical_replication_slot($1, true)', [slot]);

  // The copied postgresql.conf carries the primary's settings; these are appended to it.
  const own: Record<string, string | number | boolean> = {
    // Once promoted, the copy must not wait for a synchronous standby of its own.
    synchronous_standby_names: '',
    hot_standby: 'on',
    primary_conninfo: `host=${primary.host} port=${primary.port} user=${primary.superuser} application_name=${name}`,
    ...(slot ? { primary_slot_name: slot } : {}),
    ...options.settings,
  };
  const settings: Record<string, string | number | boolean> = {};
  for (const [setting, value] of Object.entries(primary.settings))
    if (!PRIMARY_ONLY.has(setting)) settings[setting] = value;
  Object.assign(settings, own);

  let cluster: PgCluster;
  try {
    cluster = await PgCluster.start({
      installation: primary.installation,
      settings,
      ...(options.runAs ? { runAs: options.runAs } : {}),
      populate: async (standby) => {
        await baseBackup(primary, standby, name);
        standby.appendConf(own);
      },
    });
  } catch (error) {
    if (slot) await dropSlot(primary, slot);
    throw error;
  }
  const standby: Standby = {
    cluster,
    primary,
    name,
    slot,
    [Symbol.asyncDispose]: () => cluster.destroy(),
  };
  if (options.synchronous) await setSynchronousStandbys(primary, [name]);
  await waitForStreaming(standby, options.synchronous ? 'sync' : undefined);
  return standby;
}

/**
 * Sets the primary's `synchronous_standby_names` to `FIRST n (names...)` (empty: no
 * synchronous standby, commits stop waiting) and reloads its configuration.
 *
 * @example
 * await setSynchronousStandbys(primary, []); // let a primary whose standby died commit again
 */
export async function setSynchronousStandbys(primary: PgCluster, names: string[]): Promise<void> {
  const value = names.length === 0 ? '' : `FIRST 1 (${names.join(', ')})`;
  await primary.query(`ALTER SYSTEM SET synchronous_standby_names = ${pg.escapeLiteral(value)}`);
  await primary.query('SELECT pg_catalog.pg_reload_conf()');
  // A reload is asynchronous: wait until a new session sees the value.
  await pollUntil(`synchronous_standby_names = '${value}' on the primary`, async () => {
    const { rows } = await primary.query<{ value: string }>(
      "SELECT pg_catalog.current_setting('synchronous_standby_names') AS value",
    );
    return rows[0]!.value === value;
  });
}

/**
 * Waits until the primary's `pg_stat_replication` shows the standby streaming, and in
 * `syncState` (e.g. `'sync'`) when given.
 */
export async function waitForStreaming(standby: Standby, syncState?: string): Promise<void> {
  await pollUntil(`${standby.name} streams${syncState ? ` as ${syncState}` : ''}`, async () => {
    const { rows } = await standby.primary.query<{ state: string; sync_state: string }>(
      'SELECT state, sync_state FROM pg_catalog.pg_stat_replication WHERE application_name = $1',
      [standby.name],
    );
    const row = rows[0];
    return row?.state === 'streaming' && (syncState === undefined || row.sync_state === syncState);
  });
}

/**
 * Waits until the standby has replayed everything the primary has written so far (the
 * primary's current WAL position when called).
 *
 * @example
 * await primary.query("INSERT ..."); // async replication: not necessarily on the standby yet
 * await waitForReplay(standby);       // now it is
 */
export async function waitForReplay(standby: Standby): Promise<void> {
  const { rows } = await standby.primary.query<{ lsn: string }>(
    'SELECT pg_catalog.pg_current_wal_lsn()::text AS lsn',
  );
  const target = rows[0]!.lsn;
  await pollUntil(`${standby.name} replays up to ${target}`, async () => {
    const { rows: replayed } = await standby.cluster.query<{ done: boolean }>(
      'SELECT pg_catalog.pg_last_wal_replay_lsn() >= $1::pg_lsn AS done',
      [target],
    );
    return replayed[0]!.done === true;
  });
}

/**
 * Promotes a standby to a primary (`pg_promote`, waiting for the end of recovery) and
 * returns once it accepts writes. Whatever WAL it has received is replayed first; what it
 * never received is lost.
 *
 * @example
 * await primary.crash();
 * await promote(standby.cluster);
 */
export async function promote(cluster: PgCluster): Promise<void> {
  const { rows } = await cluster.query<{ promoted: boolean }>(
    'SELECT pg_catalog.pg_promote(true, 60) AS promoted',
  );
  if (!rows[0]!.promoted)
    throw new Error(`pg-lease: promotion did not finish in 60 s\n${cluster.logTail()}`);
  await pollUntil('the promoted server leaves recovery', async () => {
    const { rows: state } = await cluster.query<{ recovering: boolean }>(
      'SELECT pg_catalog.pg_is_in_recovery() AS recovering',
    );
    return state[0]!.recovering === false;
  });
}

/**
 * The low-level base backup: start it on one connection, copy the data directory, stop it
 * on the same connection and write the backup label it returns, then copy the WAL written
 * meanwhile and mark the copy as a standby.
 */
async function baseBackup(primary: PgCluster, standby: PgCluster, label: string): Promise<void> {
  const session = new pg.Client({ connectionString: primary.url() });
  await session.connect();
  try {
    // Non-exclusive backups: 15 renamed the functions and dropped the exclusive mode.
    const modern = primary.installation.major >= 15;
    await session.query(
      modern
        ? 'SELECT pg_catalog.pg_backup_start($1, true)'
        : 'SELECT pg_catalog.pg_start_backup($1, true, false)',
      [label],
    );
    copyDataDir(primary.dataDir, standby.dataDir);
    const { rows } = await session.query<{ labelfile: string; spcmapfile: string | null }>(
      modern
        ? 'SELECT labelfile, spcmapfile FROM pg_catalog.pg_backup_stop(false)'
        : 'SELECT labelfile, spcmapfile FROM pg_catalog.pg_stop_backup(false, false)',
    );
    const { labelfile, spcmapfile } = rows[0]!;
    fs.writeFileSync(path.join(standby.dataDir, 'backup_label'), labelfile, { mode: 0o600 });
    if (spcmapfile)
      fs.writeFileSync(path.join(standby.dataDir, 'tablespace_map'), spcmapfile, { mode: 0o600 });
  } finally {
    await session.end();
  }
  // The WAL from the backup's start on: recovery reads it locally, then streams the rest. A
  // segment still being written is copied torn; recovery stops at its first invalid record
  // and streams from there.
  copyTree(path.join(primary.dataDir, 'pg_wal'), path.join(standby.dataDir, 'pg_wal'), (rel) =>
    rel.startsWith('archive_status' + path.sep),
  );
  fs.writeFileSync(path.join(standby.dataDir, 'standby.signal'), '', { mode: 0o600 });
  dropPrimaryOnlySettings(path.join(standby.dataDir, 'postgresql.auto.conf'));
  const owner = standby.serverAccount;
  if (owner) chownTree(standby.dataDir, owner.uid, owner.gid);
  fs.chmodSync(standby.dataDir, 0o700);
}

function copyDataDir(from: string, to: string): void {
  copyTree(from, to, (rel) => {
    const parts = rel.split(path.sep);
    const base = parts[parts.length - 1]!;
    if (parts.length === 1 && SKIPPED_FILES.has(base)) return true;
    if (parts.length > 1 && EMPTY_DIRS.has(parts[0]!)) return true;
    return base === 'pg_internal.init' || base.startsWith('pgsql_tmp');
  });
}

/** Copies a tree that may change under it: files that vanish meanwhile are skipped. */
function copyTree(from: string, to: string, skip: (relative: string) => boolean): void {
  const walk = (relative: string) => {
    const source = path.join(from, relative);
    const target = path.join(to, relative);
    fs.mkdirSync(target, { recursive: true, mode: 0o700 });
    let entries: fs.Dirent[];
    try {
      entries = fs.readdirSync(source, { withFileTypes: true });
    } catch {
      return;
    }
    for (const entry of entries) {
      const rel = path.join(relative, entry.name);
      if (skip(rel)) continue;
      if (entry.isDirectory()) {
        walk(rel);
      } else if (entry.isFile()) {
        try {
          fs.copyFileSync(path.join(from, rel), path.join(to, rel));
        } catch (error) {
          if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw error;
        }
      }
    }
  };
  walk('');
}

function chownTree(dir: string, uid: number, gid: number): void {
  fs.chownSync(dir, uid, gid);
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    const full = path.join(dir, entry.name);
    if (entry.isDirectory()) chownTree(full, uid, gid);
    else fs.chownSync(full, uid, gid);
  }
}

/** The copy must not ask for a synchronous standby of its own once promoted. */
function dropPrimaryOnlySettings(autoConf: string): void {
  if (!fs.existsSync(autoConf)) return;
  const kept = fs
    .readFileSync(autoConf, 'utf8')
    .split('\n')
    .filter((line) => !PRIMARY_ONLY.has(line.split('=')[0]!.trim()));
  fs.writeFileSync(autoConf, kept.join('\n'));
}

async function dropSlot(primary: PgCluster, slot: string): Promise<void> {
  await primary
    .query('SELECT pg_catalog.pg_drop_replication_slot($1)', [slot])
    .catch(() => undefined);
}

async function pollUntil(what: string, condition: () => Promise<boolean>): Promise<void> {
  const deadline = Date.now() + WAIT_MS;
  for (;;) {
    try {
      if (await condition()) return;
    } catch {
      // the server may be restarting or still in recovery; ask again
    }
    if (Date.now() > deadline) throw new Error(`pg-lease: timed out waiting until ${what}`);
    await sleep(50);
  }
}
