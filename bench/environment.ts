/** The environment record written beside every result: what ran, where, with which settings. */
import { execFileSync, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import type { PgCluster } from 'pg-lease-testing';
import type { Pgbench } from './pgbench.js';
import { BENCH_DATABASE } from './setup.js';

export const RECORDED_SETTINGS = [
  'server_version',
  'fsync',
  'synchronous_commit',
  'full_page_writes',
  'wal_sync_method',
  'wal_level',
  'wal_compression',
  'data_checksums',
  'shared_buffers',
  'wal_buffers',
  'max_wal_size',
  'checkpoint_timeout',
  'autovacuum',
  'commit_delay',
  'huge_pages',
  'jit',
  'max_connections',
];

export interface Environment {
  command: string;
  startedAt: string;
  gitCommit: string | null;
  gitDirty: boolean | null;
  node: string;
  postgres: { versionString: string; source: string; bindir: string; version: string };
  pgbench: { path: string; version: string };
  os: { platform: string; release: string; prettyName: string | null; kernel: string };
  cpu: { model: string; logicalCores: number; mhz: number | null };
  memoryBytes: number;
  storage: { dataDir: string; df: string | null; lsblk: string | null; mounts: string | null };
  settings: Record<string, string>;
  extensionScripts: { file: string; sha256: string }[];
  candidates: { file: string; sha256: string }[];
  connection: string;
  fsyncTest: string | null;
  notes: string[];
}

function run(command: string, args: string[]): string | null {
  try {
    return execFileSync(command, args, {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    }).trim();
  } catch {
    return null;
  }
}

function sha256(file: string): string {
  return createHash('sha256').update(fs.readFileSync(file)).digest('hex');
}

/** Collects the record while the bench cluster is up. */
export async function recordEnvironment(options: {
  cluster: PgCluster;
  pgbench: Pgbench;
  packageRoot: string;
  command: string;
  candidates: string[];
  fsyncTest: boolean;
}): Promise<Environment> {
  const { cluster, pgbench, packageRoot } = options;
  const settings: Record<string, string> = {};
  const { rows } = await cluster.query<{ name: string; setting: string; unit: string | null }>(
    'SELECT name, setting, unit FROM pg_settings WHERE name = ANY($1) ORDER BY name',
    [RECORDED_SETTINGS],
    BENCH_DATABASE,
  );
  for (const row of rows)
    settings[row.name] = row.unit ? `${row.setting} (${row.unit})` : row.setting;
  const cpuinfo = fs.existsSync('/proc/cpuinfo') ? fs.readFileSync('/proc/cpuinfo', 'utf8') : '';
  const osRelease = fs.existsSync('/etc/os-release')
    ? fs.readFileSync('/etc/os-release', 'utf8')
    : '';
  const mhz = /cpu MHz\s*:\s*([\d.]+)/.exec(cpuinfo)?.[1];
  const sqlDir = path.join(packageRoot, 'extension', 'sql');
  const extensionScripts = fs
    .readdirSync(sqlDir)
    .filter((name) => name.endsWith('.sql'))
    .sort()
    .map((name) => ({ file: `extension/sql/${name}`, sha256: sha256(path.join(sqlDir, name)) }));
  const git = (args: string[]) => run('git', ['-C', packageRoot, ...args]);
  const status = git(['status', '--porcelain', '--', 'extension']);
  return {
    command: options.command,
    startedAt: new Date().toISOString(),
    gitCommit: git(['rev-parse', 'HEAD']),
    gitDirty: status === null ? null : status.length > 0,
    node: process.version,
    postgres: {
      versionString: cluster.installation.versionString,
      source: cluster.installation.source,
      bindir: cluster.installation.bindir,
      version: cluster.installation.version,
    },
    pgbench: { path: pgbench.path, version: pgbench.version },
    os: {
      platform: os.platform(),
      release: os.release(),
      prettyName: /PRETTY_NAME="?([^"\n]*)"?/.exec(osRelease)?.[1] ?? null,
      kernel: run('uname', ['-a']) ?? os.release(),
    },
    cpu: {
      model: /model name\s*:\s*(.*)/.exec(cpuinfo)?.[1] ?? os.cpus()[0]?.model ?? 'unknown',
      logicalCores: os.cpus().length,
      mhz: mhz ? Number(mhz) : null,
    },
    memoryBytes: os.totalmem(),
    storage: {
      dataDir: cluster.dataDir,
      df: run('df', ['-hT', cluster.dataDir]),
      lsblk: run('lsblk', ['-o', 'NAME,SIZE,TYPE,ROTA,MOUNTPOINTS']),
      mounts: run('findmnt', ['-T', cluster.dataDir, '-o', 'TARGET,SOURCE,FSTYPE,OPTIONS']),
    },
    settings,
    extensionScripts,
    candidates: options.candidates.map((file) => ({ file, sha256: sha256(file) })),
    connection:
      "pgbench over the cluster's private Unix socket, -M prepared, one connection per client",
    fsyncTest: options.fsyncTest ? fsyncTest(cluster.baseDir) : null,
    notes: [
      "Shared machine: other engineers' test runs used the same cores during this run. Absolute " +
        'figures carry that noise; the lease/baseline ratios do much less, because every lease run ' +
        'is paired with its baseline in the same round, back to back, in alternating order, and the ' +
        'ratio reported is the median of the per-round ratios. The load average before each run is ' +
        'kept in summary.json (runs[].loadAverage).',
      'autovacuum is off; every run starts after VACUUM of the table it writes and a CHECKPOINT, ' +
        'so no run inherits dead row versions or pending full-page images from another.',
    ],
  };
}

/** fdatasync cost on the data dir's file system, from a system pg_test_fsync if present. */
function fsyncTest(dir: string): string | null {
  const candidates = ['pg_test_fsync'];
  try {
    for (const version of fs.readdirSync('/usr/lib/postgresql').sort().reverse())
      candidates.push(path.join('/usr/lib/postgresql', version, 'bin', 'pg_test_fsync'));
  } catch {
    // no Debian-style layout
  }
  for (const binary of candidates) {
    const result = spawnSync(binary, ['-s', '1', '-f', path.join(dir, 'fsync-test.tmp')], {
      encoding: 'utf8',
      timeout: 60_000,
    });
    fs.rmSync(path.join(dir, 'fsync-test.tmp'), { force: true });
    if (result.status === 0) {
      const lines = result.stdout
        .split('\n')
        .filter((line) => /^\s+(open_datasync|fdatasync|fsync|open_sync)\s/.test(line))
        .slice(0, 5);
      return `${binary} -s 1 (one 8kB write):\n${lines.join('\n')}`;
    }
  }
  return null;
}

/**
 * Writes the record into a run's folder: environment.md, and environment.json as `json` renders
 * it (pretty-printed by default).
 */
export function writeEnvironment(
  out: string,
  env: Environment,
  json: (env: Environment) => string = (e) => JSON.stringify(e, null, 2) + '\n',
): void {
  fs.writeFileSync(path.join(out, 'environment.md'), environmentMarkdown(env));
  fs.writeFileSync(path.join(out, 'environment.json'), json(env));
}

/** The record as markdown. */
export function environmentMarkdown(env: Environment): string {
  const gib = (bytes: number) => `${(bytes / 2 ** 30).toFixed(1)} GiB`;
  const lines = [
    '# Environment',
    '',
    `- command: \`${env.command}\``,
    `- started: ${env.startedAt}`,
    `- git commit: ${env.gitCommit ?? 'none'}${env.gitDirty ? ' (extension/ has uncommitted changes)' : ''}`,
    `- node: ${env.node}`,
    `- PostgreSQL: ${env.postgres.versionString} (${env.postgres.source}, ${env.postgres.bindir})`,
    `- pgbench: ${env.pgbench.version} (${env.pgbench.path})`,
    `- OS: ${env.os.prettyName ?? env.os.platform} — ${env.os.kernel}`,
    `- CPU: ${env.cpu.model}, ${env.cpu.logicalCores} logical cores${env.cpu.mhz ? `, ${env.cpu.mhz} MHz` : ''}`,
    `- memory: ${gib(env.memoryBytes)}`,
    `- connection: ${env.connection}`,
    '',
    '## Storage of the data directory',
    '',
    '```',
    env.storage.df ?? '(df unavailable)',
    '',
    env.storage.mounts ?? '',
    '',
    env.storage.lsblk ?? '(lsblk unavailable)',
    '```',
    '',
  ];
  if (env.fsyncTest) lines.push('## Flush cost', '', '```', env.fsyncTest, '```', '');
  lines.push('## Server settings', '', '| setting | value |', '|---|---|');
  for (const [name, value] of Object.entries(env.settings)) lines.push(`| ${name} | ${value} |`);
  lines.push('', '## SQL under test', '');
  for (const script of env.extensionScripts) lines.push(`- ${script.file} sha256 ${script.sha256}`);
  for (const script of env.candidates)
    lines.push(`- candidate ${script.file} sha256 ${script.sha256}`);
  lines.push('', '## Notes', '');
  for (const note of env.notes) lines.push(`- ${note}`);
  return lines.join('\n') + '\n';
}
