/**
 * The profiling phase, on a second cluster of the same build and settings plus
 * pg_stat_statements and track_functions (kept out of the throughput cluster so the
 * headline numbers carry no instrumentation cost). It answers "where does the time go":
 *
 * - per-statement times inside the functions (pg_stat_statements.track = all, pgbench -r);
 * - plans of the statements inside the functions (auto_explain.log_nested_statements);
 * - server-side cost per call without round trip or commit flush, for the shipped
 *   functions, the diagnostic variants and bare SQL (plpgsql loops, backend CPU time);
 * - the share of the commit flush in a call's latency (synchronous_commit on vs off).
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { PgCluster, type PgInstallation } from 'pg-lease-testing';
import { materialiseScript, type BenchContext } from './measure.js';
import { readLogs, runPgbench, withPositions } from './pgbench.js';
import {
  BENCH_DATABASE,
  buildArms,
  resetForRun,
  setupBenchDatabase,
  tablesOf,
  withClient,
} from './setup.js';
import { median, summarise } from './stats.js';
import { WORKLOADS, armDefines, inOp, type Arm } from './workloads.js';

export interface ProfileResult {
  statements: {
    workload: string;
    arm: string;
    toplevel: boolean;
    query: string;
    calls: number;
    meanUs: number;
  }[];
  functions: { name: string; calls: number; totalUsPerCall: number; selfUsPerCall: number }[];
  /** Server-side microseconds per call, median of rounds: op -> implementation -> us. */
  serverUsPerCall: Record<string, Record<string, number>>;
  /** Backend CPU (us) per call of trivial functions: what each function-layer feature costs alone. */
  callOverhead: Record<string, number>;
  /** p50 latency (us) of single calls at 1 client with synchronous_commit on and off. */
  flush: Record<string, { on: number; off: number }>;
  /** pgbench -r per-statement average latencies of the W1 cycle, as printed. */
  perStatement: Record<string, string>;
  autoExplainFile: string;
}

/** Profiles the installation's pg_lease; writes profile files into `resultsDir`. */
export async function profile(
  installation: PgInstallation,
  baseSettings: Record<string, string | number>,
  context: Omit<BenchContext, 'cluster'>,
  transactions: number,
  candidates: string[],
): Promise<ProfileResult> {
  const cluster = await PgCluster.start({
    installation,
    settings: {
      ...baseSettings,
      shared_preload_libraries: 'pg_stat_statements',
      'pg_stat_statements.track': 'none',
      track_functions: 'all',
    },
  });
  const ctx: BenchContext = { ...context, cluster };
  try {
    const arms = buildArms(true, candidates);
    await setupBenchDatabase(cluster, arms, candidates, 1);
    await cluster.query('CREATE EXTENSION pg_stat_statements', [], BENCH_DATABASE);
    const result: ProfileResult = {
      statements: [],
      functions: [],
      serverUsPerCall: {},
      callOverhead: {},
      flush: {},
      perStatement: {},
      autoExplainFile: 'auto-explain.txt',
    };
    await statementProfile(ctx, transactions, result);
    await autoExplain(cluster, path.join(context.resultsDir, result.autoExplainFile));
    result.serverUsPerCall = await serverLoops(
      cluster,
      arms.filter((arm) => arm.table),
      500,
    );
    result.callOverhead = await callOverhead(cluster);
    result.flush = await flushShare(ctx);
    return result;
  } finally {
    await cluster.destroy();
  }
}

/** Arms whose statements and flush share are profiled (ids and key tags as in buildArms). */
const PROFILED_ARMS = buildArms(false, []).filter((arm) => arm.id === 'lease' || arm.id === 'bare');

async function statementProfile(ctx: BenchContext, transactions: number, result: ProfileResult) {
  for (const workload of WORKLOADS.filter((w) => w.id !== 'W2-contend')) {
    for (const arm of PROFILED_ARMS) {
      await resetForRun(ctx.cluster, tablesOf([arm]), workload.keyPrefix);
      await withClient(ctx.cluster, BENCH_DATABASE, async (client) => {
        await client.query('SELECT pg_stat_statements_reset()');
        await client.query('SELECT pg_stat_reset()');
      });
      const run = await runPgbench(ctx.pgbench, {
        target: {
          socketDir: ctx.cluster.socketDir,
          port: ctx.cluster.port,
          user: ctx.cluster.superuser,
          database: BENCH_DATABASE,
        },
        scriptFile: materialiseScript(ctx, workload, arm),
        clients: 1,
        transactions,
        defines: armDefines(workload, arm),
        pgOptions: '-c pg_stat_statements.track=all',
        extraArgs: ['-r'],
      });
      const perStatement = run.stdout.slice(run.stdout.indexOf('statement latencies'));
      result.perStatement[`${workload.id} ${arm.id}`] = perStatement.trim();
      await withClient(ctx.cluster, BENCH_DATABASE, async (client) => {
        const { rows } = await client.query<{
          query: string;
          calls: string;
          mean: number;
          toplevel: boolean;
        }>(
          `SELECT query, calls, mean_exec_time AS mean, toplevel FROM pg_stat_statements
           WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
             AND calls >= $1 ORDER BY toplevel DESC, total_exec_time DESC`,
          [Math.floor(transactions / 4)],
        );
        for (const row of rows) {
          if (/pg_stat_statements_reset|pg_stat_reset/.test(row.query)) continue;
          result.statements.push({
            workload: workload.id,
            arm: arm.id,
            toplevel: row.toplevel,
            query: row.query.replace(/\s+/g, ' ').trim(),
            calls: Number(row.calls),
            meanUs: row.mean * 1000,
          });
        }
        if (arm.script === 'lease') {
          const fns = await client.query<{
            name: string;
            calls: string;
            total: number;
            self: number;
          }>(
            `SELECT schemaname || '.' || funcname AS name, calls, total_time AS total, self_time AS self
             FROM pg_stat_user_functions WHERE schemaname = 'lease' ORDER BY total_time DESC`,
          );
          for (const f of fns.rows) {
            result.functions.push({
              name: `${workload.id}: ${f.name}`,
              calls: Number(f.calls),
              totalUsPerCall: (f.total * 1000) / Number(f.calls),
              selfUsPerCall: (f.self * 1000) / Number(f.calls),
            });
          }
        }
      });
    }
  }
}

/** One call of each function and of each bare statement, with auto_explain on nested statements. */
async function autoExplain(cluster: PgCluster, file: string): Promise<void> {
  const lines: string[] = [];
  await withClient(cluster, BENCH_DATABASE, async (client) => {
    client.on('notice', (notice: { message?: string }) => lines.push(notice.message ?? ''));
    await client.query(`LOAD 'auto_explain'`);
    for (const setting of [
      'auto_explain.log_min_duration = 0',
      'auto_explain.log_analyze = on',
      'auto_explain.log_buffers = on',
      'auto_explain.log_nested_statements = on',
      'auto_explain.log_verbose = on',
      'client_min_messages = log',
    ])
      await client.query(`SET ${setting}`);
    const calls = [
      `SELECT * FROM lease.acquire('explain-1', 'bench', interval '5 minutes')`,
      `SELECT * FROM lease.renew('explain-1', 'bench', (SELECT epoch FROM lease.inspect('explain-1')), interval '5 minutes')`,
      `SELECT * FROM lease.release('explain-1', 'bench', (SELECT epoch FROM lease.inspect('explain-1')))`,
      `SELECT * FROM lease.inspect('w3i-k00-0')`,
    ];
    for (const call of calls) {
      lines.push(`\n===== ${call}`);
      await client.query(call);
      // Second call: plans cached, as in steady state.
      if (!call.includes('release')) {
        lines.push(`\n===== (again, cached plans) ${call}`);
        await client.query(call);
      }
    }
  });
  fs.writeFileSync(file, lines.join('\n') + '\n');
}

/** plpgsql statements performing each op for an arm (`e`: the epoch acquire returned, `er`: the renew key's). */
function loopBody(arm: Arm): Record<'acquire' | 'release' | 'renew' | 'inspect', string> {
  const inspectKey = `w3i-${arm.keyTag}-0`;
  if (arm.script === 'bare') {
    return {
      acquire: `INSERT INTO bare.leases AS l (key, owner, epoch, expires_at)
          VALUES ('loop-a', 'bench', 1, clock_timestamp() + interval '5 minutes')
          ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, epoch = l.epoch + 1,
            expires_at = excluded.expires_at
          WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp() RETURNING l.epoch INTO e;`,
      release: `UPDATE bare.leases SET owner = NULL, expires_at = NULL, epoch = epoch + 1
          WHERE key = 'loop-a' AND owner = 'bench' AND epoch = e AND expires_at > clock_timestamp();`,
      renew: `UPDATE bare.leases SET expires_at = clock_timestamp() + interval '5 minutes'
          WHERE key = 'loop-r' AND owner = 'bench' AND epoch = er AND expires_at > clock_timestamp();`,
      inspect: `PERFORM owner, epoch, expires_at FROM bare.leases WHERE key = '${inspectKey}';`,
    };
  }
  const schema = arm.schema ?? 'lease';
  return {
    acquire: `SELECT a.epoch INTO e FROM ${schema}.acquire('loop-a', 'bench', interval '5 minutes') a;`,
    release: `PERFORM * FROM ${schema}.release('loop-a', 'bench', e);`,
    renew: `PERFORM * FROM ${schema}.renew('loop-r', 'bench', er, interval '5 minutes');`,
    inspect: `PERFORM * FROM ${schema}.inspect('${inspectKey}');`,
  };
}

/** CPU time the backend has used, in ns (Linux schedstat), or undefined where unavailable. */
function backendCpuNs(pid: number): number | undefined {
  try {
    return Number(fs.readFileSync(`/proc/${pid}/schedstat`, 'utf8').split(' ')[0]);
  } catch {
    return undefined;
  }
}

/**
 * Microseconds of backend CPU per call, measured inside the server: no client round trip,
 * no parse, a COMMIT after each write (flushed; the wait is not CPU) so that HOT
 * pruning works as in the real workload. CPU time comes from the backend's schedstat, so
 * time the backend spent waiting for a core on the shared machine is not counted (wall
 * time is the fallback off Linux). Acquire and release run as pairs; the pair's CPU time is
 * split between them in the proportion of their wall times.
 */
export async function serverLoops(
  cluster: PgCluster,
  arms: Arm[],
  iterations: number,
): Promise<Record<string, Record<string, number>>> {
  const samples: Record<string, Record<string, number[]>> = {};
  const add = (op: string, arm: string, us: number) => ((samples[op] ??= {})[arm] ??= []).push(us);
  await withClient(cluster, BENCH_DATABASE, async (client) => {
    let notices: string[] = [];
    client.on('notice', (notice: { message?: string }) => notices.push(notice.message ?? ''));
    const pid = (await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!
      .pid;
    // pg_lease's writes refuse asynchronous commit (lease._begin_write turns
    // synchronous_commit off back to local), so every arm commits with a flush; the wait for
    // it is not CPU time and does not count.
    await client.query('SET synchronous_commit = local');
    for (const table of tablesOf(arms)) {
      await client.query(
        `INSERT INTO ${table} (key, owner, epoch, expires_at)
         VALUES ('loop-r', 'bench', 1, clock_timestamp() + interval '1 day')
         ON CONFLICT (key) DO UPDATE SET owner = 'bench', expires_at = clock_timestamp() + interval '1 day'`,
      );
    }
    const timed = async (sql: string): Promise<{ cpuUs: number; notice: string }> => {
      notices = [];
      const cpu0 = backendCpuNs(pid);
      const wall0 = process.hrtime.bigint();
      await client.query(sql);
      const wall = Number(process.hrtime.bigint() - wall0) / 1000;
      const cpu1 = backendCpuNs(pid);
      const cpuUs = cpu0 !== undefined && cpu1 !== undefined ? (cpu1 - cpu0) / 1000 : wall;
      return { cpuUs, notice: notices.join('\n') };
    };
    for (let round = 0; round < 5; round++) {
      for (const arm of round % 2 ? [...arms].reverse() : arms) {
        const body = loopBody(arm);
        const pair = await timed(`
          DO $$
          DECLARE e bigint; t0 timestamptz; ta interval := '0'; tr interval := '0';
          BEGIN
            FOR i IN 1..${iterations} LOOP
              t0 := clock_timestamp(); ${body.acquire} ta := ta + (clock_timestamp() - t0);
              COMMIT;
              t0 := clock_timestamp(); ${body.release} tr := tr + (clock_timestamp() - t0);
              COMMIT;
            END LOOP;
            RAISE NOTICE 'split % %', extract(epoch FROM ta), extract(epoch FROM tr);
          END $$`);
        const split = /split ([\d.]+) ([\d.]+)/.exec(pair.notice);
        if (!split) throw new Error(`profile loop for ${arm.id} printed no split`);
        const share = Number(split[1]) / (Number(split[1]) + Number(split[2]));
        add('acquire', arm.id, (pair.cpuUs * share) / iterations);
        add('release', arm.id, (pair.cpuUs * (1 - share)) / iterations);
        const renew = await timed(`
          DO $$
          DECLARE er bigint;
          BEGIN
            SELECT epoch INTO er FROM ${arm.table} WHERE key = 'loop-r';
            FOR i IN 1..${iterations} LOOP ${body.renew} COMMIT; END LOOP;
          END $$`);
        add('renew', arm.id, renew.cpuUs / iterations);
        const inspect = await timed(`
          DO $$ BEGIN FOR i IN 1..${iterations} LOOP ${body.inspect} END LOOP; END $$`);
        add('inspect', arm.id, inspect.cpuUs / iterations);
      }
    }
  });
  const result: Record<string, Record<string, number>> = {};
  for (const [op, byArm] of Object.entries(samples)) {
    result[op] = {};
    for (const [arm, values] of Object.entries(byArm)) result[op][arm] = median(values);
  }
  return result;
}

/** Trivial functions, one feature each, called from a plpgsql loop. */
const MICRO_FUNCTIONS: Record<string, string> = {
  'plpgsql, OUT parameter': `CREATE FUNCTION bench_micro.f(OUT x int) LANGUAGE plpgsql
     AS $$ BEGIN x := 1; END $$`,
  '+ SECURITY DEFINER': `CREATE FUNCTION bench_micro.f(OUT x int) LANGUAGE plpgsql SECURITY DEFINER
     AS $$ BEGIN x := 1; END $$`,
  '+ SECURITY DEFINER + SET search_path': `CREATE FUNCTION bench_micro.f(OUT x int) LANGUAGE plpgsql
     SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$ BEGIN x := 1; END $$`,
  'RETURNS TABLE + RETURN NEXT, SECURITY DEFINER + SET': `CREATE FUNCTION bench_micro.f()
     RETURNS TABLE (x int) LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
     ROWS 1 AS $$ BEGIN x := 1; RETURN NEXT; END $$`,
  '... + PERFORM of a helper with SET': `CREATE FUNCTION bench_micro.h() RETURNS void LANGUAGE plpgsql
     SET search_path = pg_catalog, pg_temp AS $$ BEGIN END $$;
     CREATE FUNCTION bench_micro.f() RETURNS TABLE (x int) LANGUAGE plpgsql SECURITY DEFINER
     SET search_path = pg_catalog, pg_temp ROWS 1
     AS $$ BEGIN PERFORM bench_micro.h(); x := 1; RETURN NEXT; END $$`,
  '... + BEGIN/EXCEPTION block (subtransaction, no XID)': `CREATE FUNCTION bench_micro.f()
     RETURNS TABLE (x int) LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
     ROWS 1 AS $$ BEGIN BEGIN x := 1; EXCEPTION WHEN SQLSTATE 'PLL01' THEN x := 2; END;
     RETURN NEXT; END $$`,
  'SQL function (inlined)': `CREATE FUNCTION bench_micro.f(OUT x int) LANGUAGE sql AS $$ SELECT 1 $$`,
  'SQL function + SET search_path (not inlined)': `CREATE FUNCTION bench_micro.f(OUT x int)
     LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$ SELECT 1 $$`,
};

/**
 * Backend CPU per call of trivial functions, each adding one feature the shipped functions
 * use, called 20000 times from a plpgsql loop (`PERFORM * FROM f()`); the empty loop's cost
 * (`PERFORM 1`) is subtracted. Median of 5 rounds.
 */
async function callOverhead(cluster: PgCluster): Promise<Record<string, number>> {
  const iterations = 20000;
  const samples: Record<string, number[]> = {};
  await withClient(cluster, BENCH_DATABASE, async (client) => {
    const pid = (await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!
      .pid;
    const cpuOf = async (sql: string) => {
      const before = backendCpuNs(pid);
      const wall0 = process.hrtime.bigint();
      await client.query(sql);
      const wall = Number(process.hrtime.bigint() - wall0);
      const after = backendCpuNs(pid);
      return (
        (before !== undefined && after !== undefined ? after - before : wall) / 1000 / iterations
      );
    };
    for (let round = 0; round < 5; round++) {
      const empty = await cpuOf(
        `DO $$ BEGIN FOR i IN 1..${iterations} LOOP PERFORM 1; END LOOP; END $$`,
      );
      for (const [name, ddl] of Object.entries(MICRO_FUNCTIONS)) {
        await client.query('DROP SCHEMA IF EXISTS bench_micro CASCADE');
        await client.query('CREATE SCHEMA bench_micro');
        await client.query(ddl);
        await client.query('SELECT * FROM bench_micro.f()'); // compile outside the timing
        const us = await cpuOf(
          `DO $$ BEGIN FOR i IN 1..${iterations} LOOP PERFORM * FROM bench_micro.f(); END LOOP; END $$`,
        );
        (samples[name] ??= []).push(us - empty);
      }
    }
    await client.query('DROP SCHEMA IF EXISTS bench_micro CASCADE');
  });
  return Object.fromEntries(
    Object.entries(samples).map(([name, values]) => [name, median(values)]),
  );
}

/** p50 of single calls at 1 client, commit flush on vs off, lease vs bare. */
async function flushShare(ctx: BenchContext): Promise<Record<string, { on: number; off: number }>> {
  const result: Record<string, { on: number; off: number }> = {};
  const workload = WORKLOADS.find((w) => w.id === 'W3-renew')!;
  for (let round = 0; round < 3; round++) {
    for (const arm of PROFILED_ARMS) {
      for (const sync of ['on', 'off']) {
        await resetForRun(ctx.cluster, tablesOf([arm]), workload.keyPrefix);
        const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-lease-bench-flush-'));
        try {
          const run = await runPgbench(ctx.pgbench, {
            target: {
              socketDir: ctx.cluster.socketDir,
              port: ctx.cluster.port,
              user: ctx.cluster.superuser,
              database: BENCH_DATABASE,
            },
            scriptFile: materialiseScript(ctx, workload, arm),
            clients: 1,
            durationSeconds: 3,
            defines: armDefines(workload, arm),
            pgOptions: `-c synchronous_commit=${sync}`,
            logPrefix: path.join(dir, 'flush'),
          });
          const op = workload.ops[0]!;
          const latencies = withPositions(readLogs(run.logFiles))
            .filter((row) => inOp(op, row.position))
            .map((row) => row.latencyUs);
          const key = `renew ${arm.id}`;
          const entry = (result[key] ??= { on: 0, off: 0 });
          const p50 = summarise(latencies).p50Us;
          // Median of three rounds, kept incrementally as a list in a side map.
          (flushSamples[`${key} ${sync}`] ??= []).push(p50);
          entry[sync as 'on' | 'off'] = median(flushSamples[`${key} ${sync}`]!);
        } finally {
          fs.rmSync(dir, { recursive: true, force: true });
        }
      }
    }
  }
  return result;
}

const flushSamples: Record<string, number[]> = {};
