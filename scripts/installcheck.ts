/**
 * Runs the extension's SQL-format suites (`make installcheck`: pg_regress and
 * isolationtester) against a throwaway cluster of the system PostgreSQL. These tools come
 * with a system installation, not with the npm binaries, so this is an extra check beside
 * `npm test`, which covers the same cases on its own.
 *
 * Exits 0 with a message when no system PostgreSQL or no pg_regress is found.
 */
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { PgCluster, findSystemPgConfig, PACKAGE_ROOT } from 'pg-lease-testing';

const pgConfig = process.env.PG_LEASE_PG_CONFIG ?? findSystemPgConfig();
if (!pgConfig) {
  console.log('installcheck: skipped, no system PostgreSQL (pg_config not on PATH)');
  process.exit(0);
}
const pgxs = spawnSync(pgConfig, ['--pgxs'], { encoding: 'utf8' }).stdout.trim();
const pgRegress = path.resolve(path.dirname(pgxs), '..', 'test', 'regress', 'pg_regress');
if (!fs.existsSync(pgRegress)) {
  console.log(
    `installcheck: skipped, ${pgRegress} is missing (install the server's pgxs test tools)`,
  );
  process.exit(0);
}

const cluster = await PgCluster.start({ installation: { pgConfig } });
let status = 1;
try {
  const extensionDir = path.join(PACKAGE_ROOT, 'extension');
  const result = spawnSync('make', ['-C', extensionDir, 'installcheck', `PG_CONFIG=${pgConfig}`], {
    stdio: 'inherit',
    env: {
      ...process.env,
      PGHOST: cluster.host,
      PGPORT: String(cluster.port),
      PGUSER: cluster.superuser,
    },
  });
  status = result.status ?? 1;
  for (const diffs of ['regression.diffs', 'output_iso/regression.diffs']) {
    const file = path.join(extensionDir, diffs);
    if (status !== 0 && fs.existsSync(file)) console.log(fs.readFileSync(file, 'utf8'));
  }
} finally {
  await cluster.destroy();
}
process.exit(status);
