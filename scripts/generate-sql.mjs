// Builds the extension's SQL scripts from its maintained source, the way extension/Makefile
// does, and the TypeScript module that bundles them into the npm package. It is what
// `npm run build` runs, so a machine with Node.js and npm but no make gets the same files; plain
// JavaScript so that it runs before tsc, which compiles what it writes.
//
// The convention, which extension/Makefile states too and test/extension/build.test.ts checks
// by running make and comparing the bytes:
//   - V is default_version in extension/pg_lease.control, the one place that names it.
//   - A step is a file extension/src/upgrade/<from>--<to>.sql.
//   - sql/pg_lease--V.sql is src/guard.sql, src/install.sql, then src/objects/*.sql.
//   - For the <from> F of every step (other than V), sql/pg_lease--F--V.sql is src/guard.sql,
//     the steps from F to V in the order they chain (F--X.sql, X--Y.sql, ..., ...--V.sql), then
//     src/objects/*.sql: one direct update script per earlier version.
//   - objects/*.sql in file-name order (byte order).
//   - A script is five header lines (its path, a generated-file note, an empty line, the psql
//     comment and the \echo line), then each part byte for byte, after one empty line.
// extension/sql holds only these scripts (none is kept in git): any other pg_lease--*.sql there
// is removed. src/generated/sql.ts (not kept in git either) holds the install script and every
// update script, for `pg-lease install --from-bundle`.
//
// Usage: node scripts/generate-sql.mjs [--check]
//   --check  write nothing; exit 1 if any generated file is not what the source generates.
import { Buffer } from 'node:buffer';
import * as fs from 'node:fs';
import * as path from 'node:path';
import process from 'node:process';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const extensionDir = path.join(root, 'extension');
const sqlDir = path.join(extensionDir, 'sql');
const bundleFile = path.join(root, 'src', 'generated', 'sql.ts');

const UPDATE_SCRIPT = /^pg_lease--(.+)--(.+)\.sql$/;

/** default_version of the control file in `dir`. */
export function defaultVersion(dir = extensionDir) {
  const control = path.join(dir, 'pg_lease.control');
  const match = /^\s*default_version\s*=\s*'([^']*)'/m.exec(fs.readFileSync(control, 'utf8'));
  if (!match || match[1] === '') throw new Error(`no default_version in ${control}`);
  return match[1];
}

/** The `.sql` files of a directory, as make's `$(sort $(wildcard dir/*.sql))` lists them. */
function sqlFiles(dir) {
  return fs
    .readdirSync(dir)
    .filter((name) => name.endsWith('.sql') && !name.startsWith('.'))
    .sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
}

/** The steps in src/upgrade: { name, from, to }. */
function upgradeSteps(dir) {
  return sqlFiles(path.join(dir, 'src', 'upgrade'))
    .filter((name) => name.includes('--'))
    .map((name) => {
      const versions = name.slice(0, -'.sql'.length).split('--');
      if (versions.length !== 2 || versions.some((version) => version === ''))
        throw new Error(`src/upgrade/${name} is not named <from>--<to>.sql`);
      return { name, from: versions[0], to: versions[1] };
    });
}

/** The steps from `from` to `version`, in the order they chain. */
function chain(steps, from, version) {
  const names = [];
  for (let at = from; at !== version;) {
    const next = steps.filter((step) => step.from === at);
    if (next.length !== 1)
      throw new Error(
        `${next.length === 0 ? 'no step' : 'several steps'} from ${at} in src/upgrade on the way to ${version}`,
      );
    if (names.includes(next[0].name)) throw new Error(`src/upgrade loops at ${next[0].name}`);
    names.push(next[0].name);
    at = next[0].to;
  }
  return names.map((name) => path.join('upgrade', name));
}

function script(dir, file, loadHint, parts) {
  const header = [
    `/* extension/sql/${file} */`,
    '/* Built from extension/src by concatenation (extension/Makefile, scripts/generate-sql.mjs): edit those files, not this one. */',
    '',
    '-- complain if script is sourced in psql, rather than via CREATE EXTENSION',
    `\\echo Use "${loadHint}" to load this file. \\quit`,
    '',
  ].join('\n');
  const chunks = [Buffer.from(header)];
  for (const part of parts)
    chunks.push(Buffer.from('\n'), fs.readFileSync(path.join(dir, 'src', part)));
  return Buffer.concat(chunks);
}

/**
 * The scripts the source in extension directory `dir` builds: file name under sql/ -> bytes,
 * the install script first.
 */
export function extensionScripts(dir = extensionDir) {
  const version = defaultVersion(dir);
  const objects = sqlFiles(path.join(dir, 'src', 'objects')).map((name) =>
    path.join('objects', name),
  );
  const steps = upgradeSteps(dir);
  const scripts = new Map();
  const installName = `pg_lease--${version}.sql`;
  scripts.set(
    installName,
    script(dir, installName, 'CREATE EXTENSION pg_lease', ['guard.sql', 'install.sql', ...objects]),
  );
  const sources = [...new Set(steps.map((step) => step.from))]
    .filter((from) => from !== version)
    .sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
  for (const from of sources) {
    const file = `pg_lease--${from}--${version}.sql`;
    scripts.set(
      file,
      script(dir, file, `ALTER EXTENSION pg_lease UPDATE TO '${version}'`, [
        'guard.sql',
        ...chain(steps, from, version),
        ...objects,
      ]),
    );
  }
  return scripts;
}

/** A template literal holding `text` exactly. */
function templateLiteral(text) {
  return '`' + text.replace(/\\/g, '\\\\').replace(/`/g, '\\`').replace(/\$\{/g, '\\${') + '`';
}

/**
 * The server's limits, read from the functions that define them in objects/10-rules.sql
 * (`lease._max_bytes()` and its siblings, each `RETURN <integer>;`), so that the client states
 * the same numbers without a copy of them.
 */
export function serverLimits() {
  const rules = fs.readFileSync(path.join(extensionDir, 'src', 'objects', '10-rules.sql'), 'utf8');
  const limit = (name) => {
    const match = new RegExp(`FUNCTION lease\\.${name}\\(\\)[^;]*?\\nRETURN (\\d+);`).exec(rules);
    if (!match) throw new Error(`objects/10-rules.sql: no lease.${name}() returning an integer`);
    return Number(match[1]);
  };
  return {
    bytes: limit('_max_bytes'),
    years: limit('_max_years'),
    keys: limit('_max_keys'),
    permits: limit('_max_permits'),
  };
}

/**
 * The templates of `lease._message` (objects/10-rules.sql), by id: each entry is one line
 * `WHEN 'id' THEN 'template'`, a SQL string literal ('' for a quote).
 */
export function serverMessages() {
  const rules = fs.readFileSync(path.join(extensionDir, 'src', 'objects', '10-rules.sql'), 'utf8');
  const body =
    /FUNCTION lease\._message\(p_id text\)[^;]*?\nRETURN CASE p_id\n([\s\S]*?)\nEND;/.exec(rules);
  if (!body)
    throw new Error('objects/10-rules.sql: no lease._message(p_id text) RETURN CASE p_id ... END;');
  const messages = {};
  for (const line of body[1].split('\n')) {
    const entry = /^\s*WHEN '([a-z_]+)' THEN '((?:[^']|'')*)'$/.exec(line);
    if (!entry)
      throw new Error(
        `objects/10-rules.sql, lease._message: not WHEN 'id' THEN 'template': ${line}`,
      );
    messages[entry[1]] = entry[2].replaceAll("''", "'");
  }
  return messages;
}

/** src/generated/sql.ts for the scripts of {@link extensionScripts}. */
export function bundleModule(scripts, version = defaultVersion()) {
  const installName = `pg_lease--${version}.sql`;
  const install = scripts.get(installName);
  if (install === undefined) throw new Error(`no install script ${installName}`);
  const updates = [...scripts.keys()]
    .map((name) => UPDATE_SCRIPT.exec(name))
    .filter((match) => match !== null)
    .map(
      (match) =>
        `  { from: '${match[1]}', to: '${match[2]}', script: ${templateLiteral(scripts.get(match[0]).toString('utf8'))} },`,
    );
  return [
    '// Generated by scripts/generate-sql.mjs from extension/src, with the scripts it writes to',
    '// extension/sql. Do not edit: edit extension/src and run `npm run build`.',
    '',
    '/** The extension version the bundled install script creates. */',
    `export const BUNDLED_VERSION = '${version}';`,
    '',
    '/** Keys and owners are 1 to this many bytes (`lease._max_bytes()`). */',
    `export const MAX_BYTES = ${serverLimits().bytes};`,
    '',
    '/** ttl, wait and older_than are at most this many years (`lease._max_years()`). */',
    `export const MAX_YEARS = ${serverLimits().years};`,
    '',
    '/** A batch takes at most this many keys (`lease._max_keys()`). */',
    `export const MAX_BATCH_KEYS = ${serverLimits().keys};`,
    '',
    '/** A counted key has at most this many permits (`lease._max_permits()`). */',
    `export const MAX_PERMITS = ${serverLimits().permits};`,
    '',
    '/** The wording of the refusals the client gives too (`lease._message`): format templates. */',
    `export const MESSAGES = ${JSON.stringify(serverMessages(), null, 2)} as const;`,
    '',
    '/** File name of the bundled install script under extension/sql. */',
    `export const BUNDLED_SCRIPT_NAME = '${installName}';`,
    '',
    '/** The install script, byte for byte as in extension/sql. */',
    `export const BUNDLED_INSTALL_SCRIPT = ${templateLiteral(install.toString('utf8'))};`,
    '',
    '/** Every update script in extension/sql (each goes straight to BUNDLED_VERSION), byte for byte. */',
    'export const BUNDLED_UPDATE_SCRIPTS: readonly { from: string; to: string; script: string }[] = [',
    ...updates,
    '];',
    '',
  ].join('\n');
}

function main() {
  const check = process.argv.includes('--check');
  const stale = [];
  const write = (file, wanted) => {
    const current = fs.existsSync(file) ? fs.readFileSync(file) : undefined;
    if (current !== undefined && current.equals(wanted)) return; // leave the file (and its mtime) alone
    if (check) stale.push(path.relative(root, file));
    else {
      fs.mkdirSync(path.dirname(file), { recursive: true });
      fs.writeFileSync(file, wanted);
    }
  };
  const scripts = extensionScripts();
  for (const [name, content] of scripts) write(path.join(sqlDir, name), content);
  // A script the source no longer builds (an earlier version's) must not be installed or shipped.
  for (const name of fs.existsSync(sqlDir) ? fs.readdirSync(sqlDir) : []) {
    if (!/^pg_lease--.*\.sql$/.test(name) || scripts.has(name)) continue;
    if (check) stale.push(`${path.relative(root, path.join(sqlDir, name))} (not built any more)`);
    else fs.rmSync(path.join(sqlDir, name));
  }
  write(bundleFile, Buffer.from(bundleModule(scripts)));
  if (stale.length > 0) {
    process.stderr.write(
      `out of date with extension/src (run npm run build): ${stale.join(', ')}\n`,
    );
    process.exitCode = 1;
  }
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) main();
