/**
 * The statements of `pg-lease demo` beyond the lease calls: the job's output table, fenced by
 * a `lease.fence_row` trigger, the workers' writes to it and the final read. `table` is a name
 * the demo makes itself (letters, digits and `_`), never input.
 */
import type pg from 'pg';

/** Creates the output table and its fencing trigger on `admin`. @internal */
export async function createDemoTable(admin: pg.ClientBase, table: string): Promise<void> {
  await admin.query(
    `CREATE TABLE ${table} (job text PRIMARY KEY, lease_epoch bigint NOT NULL, result text)`,
  );
}

/** Fences `table`'s rows by the live grant of their `job` key (lease.fence_row). @internal */
export async function fenceDemoTable(admin: pg.ClientBase, table: string): Promise<void> {
  await admin.query(
    `CREATE TRIGGER ${table}_fence BEFORE INSERT OR UPDATE ON ${table}
         FOR EACH ROW EXECUTE FUNCTION lease.fence_row('job', 'lease_epoch')`,
  );
}

/** A plain upsert of a job's result under `epoch`: the trigger does the fencing. @internal */
export async function writeDemoResult(
  pool: pg.Pool,
  table: string,
  job: string,
  epoch: bigint,
  result: string,
): Promise<void> {
  await pool.query(
    `INSERT INTO ${table} (job, lease_epoch, result) VALUES ($1, $2, $3)
           ON CONFLICT (job) DO UPDATE SET lease_epoch = excluded.lease_epoch, result = excluded.result`,
    [job, epoch.toString(), result],
  );
}

/** The job's final row: its result and the epoch it was written under. @internal */
export async function readDemoResult(
  pool: pg.Pool,
  table: string,
  job: string,
): Promise<{ lease_epoch: string; result: string }> {
  const { rows } = await pool.query<{ lease_epoch: string; result: string }>(
    `SELECT lease_epoch::text, result FROM ${table} WHERE job = $1`,
    [job],
  );
  return rows[0]!;
}

/** Drops the output table. @internal */
export async function dropDemoTable(admin: pg.ClientBase, table: string): Promise<void> {
  await admin.query(`DROP TABLE ${table}`);
}
