/**
 * Runs the extension's SQL-format suite (`make installcheck`: pg_regress) against a
 * throwaway cluster of the system PostgreSQL. pg_regress comes with a system installation,
 * not with the npm binaries, so this is an extra check beside `npm test`. The races have no
 * isolationtester specs: they live in test/extension/*.test.ts, which runs on every major.
 *
 * A missing system PostgreSQL or missing pg_regress fails the run: a suite
 * that did not run has not passed. PG_LEASE_ALLOW_SKIP=1 turns that into a message and exit 0
 * (and lets the Makefile skip a suite whose tool is missing), for machines that cannot have
 * the tools.
 */
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { PgCluster, findSystemPgConfig, PACKAGE_ROOT } from 'pg-lease-testing';

const allowSkip = process.env.PG_LEASE_ALLOW_SKIP === '1';

function notRun(reason: string): never {
  if (allowSkip) {
    console.log(`installcheck: SKIPPED (PG_LEASE_ALLOW_SKIP=1): ${reason}`);
    process.exit(0);
  }
  console.error(`installcheck: FAILED, the suites did not run: ${reason}`);
  console.error('installcheck: set PG_LEASE_ALLOW_SKIP=1 to accept that on this machine');
  process.exit(1);
}

const pgConfig = process.env.PG_LEASE_PG_CONFIG ?? findSystemPgConfig();
if (!pgConfig) notRun('no system PostgreSQL (pg_config not on PATH)');
const pgxs = spawnSync(pgConfig, ['--pgxs'], { encoding: 'utf8' }).stdout.trim();
const pgRegress = path.resolve(path.dirname(pgxs), '..', 'test', 'regress', 'pg_regress');
if (!fs.existsSync(pgRegress))
  notRun(`${pgRegress} is missing (on Debian it comes with postgresql-client-<major>)`);

const cluster = await PgCluster.start({ installation: { pgConfig } });
let status = 1;
try {
  const extensionDir = path.join(PACKAGE_ROOT, 'extension');
  const make = ['-C', extensionDir, 'installcheck', `PG_CONFIG=${pgConfig}`];
  if (allowSkip) make.push('ALLOW_MISSING_TEST_TOOLS=1');
  const result = spawnSync('make', make, {
    stdio: 'inherit',
    env: {
      ...process.env,
      PGHOST: cluster.host,
      PGPORT: String(cluster.port),
      PGUSER: cluster.superuser,
    },
  });
  status = result.status ?? 1;
  const diffs = path.join(extensionDir, 'regression.diffs');
  if (status !== 0 && fs.existsSync(diffs)) console.log(fs.readFileSync(diffs, 'utf8'));
} finally {
  await cluster.destroy();
}
process.exit(status);
