/**
 * Every code example in the docs compiles and runs as shown: the TypeScript blocks under a
 * user's strict settings against the built packages, then each as a program of its own against
 * a throwaway server; the SQL blocks statement by statement, as psql would send them. The
 * programs under examples/ are tested by test/examples; the shell lines of docs/cli.md by
 * test/cli.
 *
 * The docs read are README.md, docs/*.md but docs/cli.md, extension/README.md,
 * packages/testing/README.md and specs/*.md. Every fenced block in them is one of:
 *
 * - ```ts / ```typescript (```js / ```javascript: type-checked as JavaScript): written to a
 *   project of its own with `"type": "module"`, `pg-lease` and `pg-lease-testing` linked to
 *   the built packages, and compiled in one program with the settings of
 *   scripts/consumer-tsconfig.ts (strict, module and moduleResolution NodeNext). Each then
 *   runs in its own node process with DATABASE_URL set to a fresh database of this file's
 *   server, which is how the docs tell a program where to connect. A run passes when the
 *   module's top-level code settles without an error; the process is then ended, so a pool
 *   that an example leaves open does not keep it alive for node-postgres' idle timeout.
 * - ```sql: run statement by statement on one connection to a fresh database of its own, with
 *   pg_lease installed unless the block runs `CREATE EXTENSION pg_lease` itself. A statement
 *   that raises fails the test.
 * - ```sh / ```bash / ```console, or a fence with no language: shell lines and program output,
 *   which are not examples here.
 *
 * Any other language fails the test. An HTML comment on the line before a block (blank lines
 * between are allowed) says how the block runs, as directives separated by commas:
 *
 *   <!-- example: prelude NAME -->            the block assumes what PRELUDES[NAME] sets up
 *   <!-- example: fragment, prelude NAME -->  (TypeScript) the block is the body of an async
 *                                             function: it runs after the prelude's code
 *   <!-- example: not run: REASON -->         not run (a TypeScript block is still type-checked)
 *
 * A prelude is the least a block needs and that the doc leaves to the reader: the functions it
 * calls (`buildReport`), the client it names, the tables it writes, a role it grants to. Its
 * SQL `setup` runs in the block's database first, and its `check`, a query of one boolean,
 * must be true after the block ran, so that an example is seen to do what it says. A marker
 * with no block after it, an unknown directive or prelude, and a prelude no block uses fail
 * the test.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { PACKAGE_ROOT, PgCluster } from 'pg-lease-testing';
import ts from 'typescript';
import { strictConsumerTsconfig } from '../../scripts/consumer-tsconfig.js';
import { CURRENT_VERSION, FIXTURE_0_2_0 } from '../support/releases.js';

/** What a block needs beyond its own lines; see the header. */
interface Prelude {
  /** The language of the blocks it serves. */
  language: 'typescript' | 'javascript' | 'sql';
  /** Code placed before the block (a fragment's function follows it). */
  code?: string;
  /** Code placed after the block. */
  epilogue?: string;
  /** SQL run in the block's database before the block. */
  setup?: string;
  /** A query of one boolean that must be true after the block ran. */
  check?: string;
  /** Whether the block's database starts with pg_lease installed (default: true). */
  extension?: boolean;
}

/** Makes `key`'s live grant epoch 2: a grant of worker-1 that lapsed, taken over by worker-2. */
const EPOCH_2 = (key: string) => `
  SELECT lease.acquire('${key}', 'worker-1', '1 millisecond');
  SELECT pg_sleep(0.01);
  SELECT lease.acquire('${key}', 'worker-2', '30 seconds');`;

const PRELUDES: Record<string, Prelude> = {
  // docs/client.md, the first example.
  reports: {
    language: 'typescript',
    code: `
      async function buildReport({ signal }: { signal: AbortSignal }): Promise<string> {
        signal.throwIfAborted();
        return 'the report';
      }`,
    setup: `CREATE TABLE reports (id int PRIMARY KEY, body text); INSERT INTO reports VALUES (1, NULL);`,
    check: `SELECT body = 'the report' FROM reports WHERE id = 1`,
  },
  // docs/client.md: a `Lease` with `await using`.
  leases: {
    language: 'typescript',
    code: `
      import { LeaseClient } from 'pg-lease';
      const leases = new LeaseClient(process.env.DATABASE_URL!);
      async function doWork(epoch: bigint, signal: AbortSignal): Promise<void> {
        signal.throwIfAborted();
        if (epoch !== 1n) throw new Error(\`epoch \${epoch}\`);
      }`,
    epilogue: `await leases.end();`,
    check: `SELECT NOT held AND epoch = 2 FROM lease.inspect('job-42')`,
  },
  // docs/client.md: fenced transactions.
  client: {
    language: 'typescript',
    code: `
      import { LeaseClient } from 'pg-lease';
      const client = new LeaseClient(process.env.DATABASE_URL!);
      async function prepareInvoices(): Promise<number[]> {
        return [1, 2];
      }`,
    epilogue: `await client.end();`,
    setup: `CREATE TABLE invoices (id int PRIMARY KEY, state text);
            INSERT INTO invoices VALUES (1, 'draft'), (2, 'draft'), (3, 'draft');`,
    check: `SELECT array_agg(id ORDER BY id) = '{1,2}' FROM invoices WHERE state = 'sent'`,
  },
  // docs/client.md, Counted and shared keys: a semaphore. Each render logs when it ran and
  // under which permit; the check sees five renders, five epochs, never three at once.
  renders: {
    language: 'typescript',
    code: `
      import pg from 'pg';
      const log = new pg.Pool({ connectionString: process.env.DATABASE_URL });
      async function renderScene(scene: number, epoch: bigint, signal: AbortSignal): Promise<void> {
        await log.query(
          'INSERT INTO renders VALUES ($1, $2, clock_timestamp(), NULL)', [scene, epoch.toString()]);
        await new Promise((resolve) => setTimeout(resolve, 150));
        signal.throwIfAborted();
        await log.query('UPDATE renders SET finished_at = clock_timestamp() WHERE scene = $1', [scene]);
      }`,
    epilogue: `await log.end();`,
    setup: `CREATE TABLE renders (scene int PRIMARY KEY, epoch bigint, started_at timestamptz,
                                  finished_at timestamptz);`,
    check: `SELECT count(*) = 5 AND count(DISTINCT epoch) = 5 AND count(finished_at) = 5
                   AND NOT EXISTS (
                     SELECT FROM renders AS a
                      WHERE (SELECT count(*) FROM renders AS b
                              WHERE b.started_at <= a.started_at AND b.finished_at > a.started_at) > 2)
              FROM renders`,
  },
  // docs/client.md, Counted and shared keys: readers and a writer. Each logs when it ran; the
  // check sees the two first readers overlap and the rebuild overlap nobody.
  catalog: {
    language: 'typescript',
    code: `
      import pg from 'pg';
      const log = new pg.Pool({ connectionString: process.env.DATABASE_URL });
      async function logged(who: string, epoch: bigint, signal: AbortSignal): Promise<void> {
        await log.query(
          'INSERT INTO catalog_log VALUES ($1, $2, clock_timestamp(), NULL)', [who, epoch.toString()]);
        await new Promise((resolve) => setTimeout(resolve, 150));
        signal.throwIfAborted();
        await log.query('UPDATE catalog_log SET finished_at = clock_timestamp() WHERE who = $1', [who]);
      }
      const readCatalog = (reader: number, epoch: bigint, signal: AbortSignal) =>
        logged(\`reader \${reader}\`, epoch, signal);
      const rebuildCatalog = (epoch: bigint, signal: AbortSignal) => logged('rebuild', epoch, signal);`,
    epilogue: `await log.end();`,
    setup: `CREATE TABLE catalog_log (who text PRIMARY KEY, epoch bigint, started_at timestamptz,
                                      finished_at timestamptz);`,
    check: `SELECT count(finished_at) = 4
                   AND EXISTS (SELECT FROM catalog_log AS a, catalog_log AS b
                                WHERE a.who = 'reader 1' AND b.who = 'reader 2'
                                  AND a.started_at < b.finished_at AND b.started_at < a.finished_at)
                   AND NOT EXISTS (SELECT FROM catalog_log AS w, catalog_log AS o
                                    WHERE w.who = 'rebuild' AND o.who <> 'rebuild'
                                      AND w.started_at < o.finished_at AND o.started_at < w.finished_at)
              FROM catalog_log`,
  },
  // README.md, Fencing: `lease.fence` in a transaction.
  'invoice-run at epoch 2': {
    language: 'sql',
    setup: `CREATE TABLE invoices (id int PRIMARY KEY, run text, state text);
            INSERT INTO invoices VALUES (1, 'invoice-run', 'draft'), (2, 'other-run', 'draft');
            ${EPOCH_2('invoice-run')}`,
    check: `SELECT array_agg(run ORDER BY id) = '{invoice-run}' FROM invoices WHERE state = 'sent'`,
  },
  // README.md, Fencing: the `fence_row` trigger.
  'job 7 at epoch 2': {
    language: 'sql',
    setup: `CREATE TABLE jobs (id int PRIMARY KEY, lease_key text, lease_epoch bigint, result text);
            INSERT INTO jobs VALUES (7, 'job-7', 1, NULL);
            ${EPOCH_2('job-7')}`,
    check: `SELECT result = '...' AND lease_epoch = 2 FROM jobs WHERE id = 7`,
  },
  // README.md and extension/README.md: who may purge.
  lease_janitor: {
    language: 'sql',
    setup: `CREATE ROLE lease_janitor;`,
    check: `SELECT has_function_privilege('lease_janitor', 'lease.purge(interval, bigint)', 'EXECUTE')`,
  },
  // README.md, Updating from 0.1.0 or 0.2.0.
  'pg_lease 0.2.0': {
    language: 'sql',
    extension: false,
    setup: `CREATE EXTENSION pg_lease VERSION '0.2.0';
            SELECT lease.acquire('job-1', 'worker-1', '1 hour');`,
    check: `SELECT extversion = '${CURRENT_VERSION}'
                   AND (SELECT held AND owner = 'worker-1' AND epoch = 1 FROM lease.inspect('job-1'))
              FROM pg_extension WHERE extname = 'pg_lease'`,
  },
};

const LANGUAGES: Record<string, 'typescript' | 'javascript' | 'sql' | 'not an example'> = {
  ts: 'typescript',
  typescript: 'typescript',
  js: 'javascript',
  javascript: 'javascript',
  sql: 'sql',
  sh: 'not an example',
  bash: 'not an example',
  console: 'not an example',
  '': 'not an example',
};

interface Block {
  /** `README.md:247`: the doc and the line of the opening fence. */
  where: string;
  language: string;
  kind: (typeof LANGUAGES)[string] | undefined;
  /** Line number (1-based, in the doc) of the block's first line. */
  firstLine: number;
  code: string;
  fragment: boolean;
  prelude?: string;
  notRun?: string;
}

/** The docs whose blocks this file runs (paths relative to the repository). */
function docFiles(): string[] {
  const inDir = (dir: string, except: string[] = []) =>
    fs
      .readdirSync(path.join(PACKAGE_ROOT, dir))
      .filter((name) => name.endsWith('.md') && !except.includes(name))
      .sort()
      .map((name) => `${dir}/${name}`);
  return [
    'README.md',
    ...inDir('docs', ['cli.md']),
    'extension/README.md',
    'packages/testing/README.md',
    ...inDir('specs'),
  ];
}

const MARKER = /^\s*<!--\s*example:(.*?)-->\s*$/;
const FENCE = /^( {0,3})(`{3,}|~{3,})\s*([^\s`]*)[^`]*$/;

/** The fenced blocks of one doc, with their markers; problems go to `problems`. */
function parseDoc(file: string, problems: string[]): Block[] {
  const lines = fs.readFileSync(path.join(PACKAGE_ROOT, file), 'utf8').split('\n');
  const blocks: Block[] = [];
  let marker: { line: number; text: string } | undefined;
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!;
    const markerMatch = MARKER.exec(line);
    if (markerMatch) {
      if (marker) problems.push(`${file}:${marker.line}: example marker with no block after it`);
      marker = { line: i + 1, text: markerMatch[1]!.trim() };
      continue;
    }
    const open = FENCE.exec(line);
    if (!open) {
      if (marker && line.trim() !== '') {
        problems.push(`${file}:${marker.line}: example marker with no block after it`);
        marker = undefined;
      }
      continue;
    }
    const [, indent, fence, language] = open;
    const body: string[] = [];
    let j = i + 1;
    for (; j < lines.length; j++) {
      const closing = lines[j]!;
      if (closing.trim().startsWith(fence!) && closing.trim().replace(/[`~]/g, '') === '') break;
      body.push(closing.startsWith(indent!) ? closing.slice(indent!.length) : closing);
    }
    const where = `${file}:${i + 1}`;
    if (j === lines.length) problems.push(`${where}: the block is never closed`);
    const block: Block = {
      where,
      language: language!,
      kind: LANGUAGES[language!.toLowerCase()],
      firstLine: i + 2,
      code: body.join('\n') + '\n',
      fragment: false,
    };
    if (marker) applyMarker(block, marker.text, problems);
    marker = undefined;
    blocks.push(block);
    i = j;
  }
  if (marker) problems.push(`${file}:${marker.line}: example marker with no block after it`);
  return blocks;
}

function applyMarker(block: Block, text: string, problems: string[]): void {
  const notRun = /(?:^|,)\s*not run:(.*)$/.exec(text);
  if (notRun) {
    block.notRun = notRun[1]!.trim();
    if (!block.notRun) problems.push(`${block.where}: "not run" needs a reason`);
    text = text.slice(0, notRun.index);
  }
  for (const directive of text.split(',').map((part) => part.trim())) {
    if (directive === '') continue;
    const prelude = /^prelude\s+(.+)$/.exec(directive);
    if (directive === 'fragment') block.fragment = true;
    else if (prelude) block.prelude = prelude[1]!.trim();
    else problems.push(`${block.where}: unknown example directive "${directive}"`);
  }
  const isScript = block.kind === 'typescript' || block.kind === 'javascript';
  if (block.kind === 'not an example' || block.kind === undefined)
    problems.push(`${block.where}: an example marker on a \`\`\`${block.language} block`);
  if (block.fragment && !isScript)
    problems.push(`${block.where}: only TypeScript and JavaScript blocks can be fragments`);
  if (block.prelude !== undefined) {
    const prelude = PRELUDES[block.prelude];
    if (!prelude) problems.push(`${block.where}: no prelude "${block.prelude}" in this test`);
    else if (prelude.language !== block.kind)
      problems.push(`${block.where}: prelude "${block.prelude}" is for ${prelude.language}`);
  }
}

const problems: string[] = [];
const blocks = docFiles().flatMap((file) => parseDoc(file, problems));
const scripts = blocks.filter((b) => b.kind === 'typescript' || b.kind === 'javascript');
const sqlBlocks = blocks.filter((b) => b.kind === 'sql');

/** One TypeScript or JavaScript block as a file of the example project. */
interface ScriptFile {
  block: Block;
  source: string;
  output: string;
  /** Line (1-based) of the file where the block's first line is. */
  blockStart: number;
}

/** The example project: its own package.json, the built packages linked into node_modules. */
function makeProject(dir: string): void {
  const modules = path.join(dir, 'node_modules');
  fs.mkdirSync(path.join(modules, '@types'), { recursive: true });
  fs.symlinkSync(PACKAGE_ROOT, path.join(modules, 'pg-lease'));
  fs.symlinkSync(
    path.join(PACKAGE_ROOT, 'packages', 'testing'),
    path.join(modules, 'pg-lease-testing'),
  );
  fs.symlinkSync(path.join(PACKAGE_ROOT, 'node_modules', 'pg'), path.join(modules, 'pg'));
  for (const types of ['node', 'pg'])
    fs.symlinkSync(
      path.join(PACKAGE_ROOT, 'node_modules', '@types', types),
      path.join(modules, '@types', types),
    );
  fs.writeFileSync(path.join(dir, 'package.json'), '{"type":"module"}\n');
  fs.writeFileSync(
    path.join(dir, 'run.js'),
    [
      "import { pathToFileURL } from 'node:url';",
      'await import(pathToFileURL(process.argv[2]).href);',
      'process.exit(0);',
      '',
    ].join('\n'),
  );
}

function scriptFile(dir: string, block: Block, index: number): ScriptFile {
  const prelude = block.prelude === undefined ? undefined : PRELUDES[block.prelude];
  const name = `${String(index).padStart(2, '0')}-${block.where.replace(/[^A-Za-z0-9]+/g, '-')}`;
  const extension = block.kind === 'javascript' ? 'js' : 'ts';
  const head = [`// ${block.where}`, ...(prelude?.code ? [prelude.code.trim()] : [])];
  if (block.fragment) head.push('async function example() {');
  const tail = block.fragment ? ['}', 'await example();'] : [];
  if (prelude?.epilogue) tail.push(prelude.epilogue);
  const headText = head.join('\n') + '\n';
  const source = path.join(dir, 'examples', `${name}.${extension}`);
  fs.writeFileSync(source, headText + block.code + tail.join('\n') + '\n');
  return {
    block,
    source,
    output: path.join(dir, 'out', `${name}.js`),
    blockStart: headText.split('\n').length,
  };
}

/** Compiles every script in one program; returns the diagnostics, placed in the docs. */
function compile(dir: string, files: ScriptFile[]): string[] {
  const config = JSON.parse(strictConsumerTsconfig('unused.ts', { emit: true })) as {
    compilerOptions: object;
  };
  const { options, errors } = ts.convertCompilerOptionsFromJson(config.compilerOptions, dir);
  assert.deepEqual(errors, [], 'the consumer settings parse');
  const program = ts.createProgram({
    rootNames: files.map((file) => file.source),
    options: {
      ...options,
      allowJs: true,
      checkJs: true,
      rootDir: path.join(dir, 'examples'),
      outDir: path.join(dir, 'out'),
    },
  });
  const diagnostics = [...ts.getPreEmitDiagnostics(program), ...program.emit().diagnostics];
  return diagnostics.map((diagnostic) => {
    const message = ts.flattenDiagnosticMessageText(diagnostic.messageText, '\n');
    const file = files.find((f) => f.source === diagnostic.file?.fileName);
    if (!file || diagnostic.start === undefined) return `TS${diagnostic.code}: ${message}`;
    const { line } = diagnostic.file!.getLineAndCharacterOfPosition(diagnostic.start);
    const offset = line + 1 - file.blockStart;
    const blockLines = file.block.code.split('\n').length - 1;
    const at =
      offset >= 0 && offset < blockLines
        ? `${file.block.where.split(':')[0]}:${file.block.firstLine + offset}`
        : `${file.block.where} (prelude ${file.block.prelude ?? 'wrapper'}, line ${line + 1})`;
    return `${at}: TS${diagnostic.code}: ${message}`;
  });
}

/** A run of `node run.js <file>`: its exit code and output. */
function runNode(
  dir: string,
  file: string,
  env: NodeJS.ProcessEnv,
  timeoutMs: number,
): Promise<{ code: number | null; signal: NodeJS.Signals | null; output: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [path.join(dir, 'run.js'), file], {
      cwd: dir,
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
      timeout: timeoutMs,
    });
    let output = '';
    child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.once('error', reject);
    child.once('close', (code, signal) => resolve({ code, signal, output }));
  });
}

/** A block's SQL as psql sends it: one statement at a time, with the doc line each starts on. */
function splitSql(sql: string): { text: string; line: number }[] {
  const statements: { text: string; line: number }[] = [];
  let start = 0;
  let i = 0;
  const push = (end: number) => {
    // Comments and blank lines before a statement belong to the one before it.
    const text = sql.slice(start, end).replace(/^(\s|--[^\n]*)*/, '');
    if (text.trim() !== '') {
      const line = sql.slice(0, end - text.length).split('\n').length;
      statements.push({ text: text.trim(), line });
    }
    start = end + 1;
  };
  while (i < sql.length) {
    const rest = sql.slice(i);
    if (rest.startsWith('--')) {
      const end = sql.indexOf('\n', i);
      i = end === -1 ? sql.length : end;
    } else if (rest.startsWith('/*')) {
      const end = sql.indexOf('*/', i + 2);
      i = end === -1 ? sql.length : end + 2;
    } else if (sql[i] === "'" || sql[i] === '"') {
      const quote = sql[i]!;
      i++;
      while (i < sql.length) {
        if (sql[i] === quote && sql[i + 1] === quote) i += 2;
        else if (sql[i] === quote) break;
        else i++;
      }
      i++;
    } else if (/^\$(?:[A-Za-z_][A-Za-z_0-9]*)?\$/.test(rest)) {
      const tag = /^\$(?:[A-Za-z_][A-Za-z_0-9]*)?\$/.exec(rest)![0];
      const end = sql.indexOf(tag, i + tag.length);
      i = end === -1 ? sql.length : end + tag.length;
    } else if (sql[i] === ';') {
      push(i);
      i++;
    } else {
      i++;
    }
  }
  push(sql.length);
  return statements;
}

async function withConnection<T>(url: string, fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

/** A fresh database for `block`, its prelude's setup run in it; returns the URL. */
async function databaseFor(cluster: PgCluster, block: Block): Promise<string> {
  const prelude = block.prelude === undefined ? undefined : PRELUDES[block.prelude];
  const createsExtension = /\bCREATE\s+EXTENSION\s+pg_lease\b/i.test(block.code);
  const url = await cluster.createDatabase(undefined, {
    extension: (prelude?.extension ?? true) && !createsExtension,
  });
  if (prelude?.setup) await withConnection(url, (client) => client.query(prelude.setup!));
  return url;
}

async function assertCheck(url: string, block: Block): Promise<void> {
  const check = block.prelude === undefined ? undefined : PRELUDES[block.prelude]?.check;
  if (!check) return;
  const { rows } = await withConnection(url, (client) =>
    client.query<{ ok: boolean | null }>(`SELECT (${check}) AS ok`),
  );
  assert.equal(rows[0]?.ok, true, `${block.where}: after the block, ${check.trim()} is not true`);
}

let cluster: PgCluster;
let dir: string;
let files: ScriptFile[];
let diagnostics: string[];

before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-lease-doc-examples-'));
  makeProject(dir);
  fs.mkdirSync(path.join(dir, 'examples'));
  files = scripts.map((block, index) => scriptFile(dir, block, index));
  diagnostics = compile(dir, files);
  // A private server: the update example needs the released 0.2.0 install script staged.
  cluster = await PgCluster.start({ extraExtensionFiles: [FIXTURE_0_2_0] });
});
after(async () => {
  await cluster?.destroy();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

describe('the code blocks of the docs', () => {
  test('every block is an example this file runs, marked not run, or shell lines', () => {
    const all = [...problems];
    for (const block of blocks)
      if (block.kind === undefined)
        all.push(`${block.where}: a \`\`\`${block.language} block, which this test cannot run`);
    const used = new Set(blocks.map((block) => block.prelude));
    for (const name of Object.keys(PRELUDES))
      if (!used.has(name)) all.push(`prelude "${name}" is used by no block`);
    assert.deepEqual(all, []);
    assert.ok(scripts.length > 0 && sqlBlocks.length > 0, 'the docs have examples');
  });

  test('every TypeScript block compiles under a strict user configuration', () => {
    assert.deepEqual(diagnostics, []);
  });
});

// The two suites run side by side: the README's first SQL block waits 30 s for a lease to lapse.
describe('the examples run', { concurrency: true }, () => {
  describe('every TypeScript block runs', { concurrency: 2 }, () => {
    for (const block of scripts) {
      const run = block.notRun === undefined;
      test(`${block.where}${run ? '' : ` (not run: ${block.notRun})`}`, async (t) => {
        if (!run) return t.diagnostic(`not run: ${block.notRun}`);
        const file = files.find((f) => f.block === block)!;
        const url = await databaseFor(cluster, block);
        const result = await runNode(dir, file.output, { DATABASE_URL: url }, 60_000);
        assert.equal(
          result.code,
          0,
          `${block.where} (${result.signal ?? 'exit'}):\n${result.output}`,
        );
        await assertCheck(url, block);
      });
    }
  });

  describe('every SQL block runs', { concurrency: true }, () => {
    for (const block of sqlBlocks) {
      const run = block.notRun === undefined;
      test(`${block.where}${run ? '' : ` (not run: ${block.notRun})`}`, async (t) => {
        if (!run) return t.diagnostic(`not run: ${block.notRun}`);
        const url = await databaseFor(cluster, block);
        const file = block.where.split(':')[0];
        await withConnection(url, async (client) => {
          for (const statement of splitSql(block.code)) {
            const line = `${file}:${block.firstLine + statement.line - 1}`;
            await client.query(statement.text).catch((error: unknown) => {
              const e = error as pg.DatabaseError;
              assert.fail(
                `${line}: ${statement.text}\n  ${e.code ?? ''} ${e.message} ${e.detail ?? ''}`,
              );
            });
          }
        });
        await assertCheck(url, block);
      });
    }
  });
});
