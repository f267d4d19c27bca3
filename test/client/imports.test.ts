/**
 * The package's layering, read from the import declarations of src/ with TypeScript's parser:
 * `src/sql/` is the only way to the database, and nothing depends on itself in a circle. A
 * module that needs a statement asks `src/sql/` for one; a module of `src/sql/` imports only
 * its own, the foundation below it (errors.ts, the built `generated/`) and node-postgres. So
 * a statement sent from anywhere else, or a layer that calls back up into the one above it,
 * fails here before it can behave differently from the rest.
 *
 * And one place publishes each event: two call sites of one event would be two accounts of
 * it that can drift apart (one path's `waitedMs` counted from elsewhere, a field left out).
 *
 * Type-only imports count for cycles (a cycle of types is still a cycle of meaning), not for
 * node-postgres: a module may name `pg.Pool` in a signature without sending anything.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';
import ts from 'typescript';

/** The repository: this file runs as dist/test/client/imports.test.js. */
const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const SRC = path.join(ROOT, 'src');

/** What `src/sql/` may import from outside itself: modules that import nothing above them. */
const BELOW_SQL = ['errors.ts', 'generated/'];

/** node-postgres and its parts: only `src/sql/` may use them for more than types. */
const DRIVER = /^pg(-pool|-cursor|-native)?$/;

interface Import {
  /** The imported module, relative to src/ (for a module of the package), else its specifier. */
  target: string;
  /** Whether it is in the package (resolved to a file under src/). */
  local: boolean;
  /** `import type`, `export type`, or only type specifiers: nothing at run time. */
  typeOnly: boolean;
}

interface Module {
  imports: Import[];
  /** Calls of a method named `query` (node-postgres' statement call), as line numbers. */
  queryCalls: number[];
  /** The event of each `publish('event', ...)` call (events.ts), with its line. */
  publishes: { event: string; line: number }[];
}

function sourceFiles(dir: string): string[] {
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const full = path.join(dir, entry.name);
    if (entry.isDirectory()) return sourceFiles(full);
    return entry.name.endsWith('.ts') && !entry.name.endsWith('.d.ts') ? [full] : [];
  });
}

function isTypeOnly(node: ts.ImportDeclaration | ts.ExportDeclaration): boolean {
  if (ts.isExportDeclaration(node)) {
    if (node.isTypeOnly) return true;
    const clause = node.exportClause;
    return (
      clause !== undefined &&
      ts.isNamedExports(clause) &&
      clause.elements.length > 0 &&
      clause.elements.every((e) => e.isTypeOnly)
    );
  }
  const clause = node.importClause;
  if (!clause) return false; // `import 'x'` runs x
  if (clause.isTypeOnly) return true;
  if (clause.name) return false;
  const bindings = clause.namedBindings;
  return (
    bindings !== undefined &&
    ts.isNamedImports(bindings) &&
    bindings.elements.length > 0 &&
    bindings.elements.every((e) => e.isTypeOnly)
  );
}

/** Reads the imports and `.query(` calls of every module under `src`. */
function readModules(src: string): Map<string, Module> {
  const modules = new Map<string, Module>();
  for (const file of sourceFiles(src)) {
    const text = fs.readFileSync(file, 'utf8');
    const source = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true);
    const module: Module = { imports: [], queryCalls: [], publishes: [] };
    const name = path.relative(src, file).split(path.sep).join('/');
    const add = (specifier: string, typeOnly: boolean) => {
      if (!specifier.startsWith('.')) {
        module.imports.push({ target: specifier, local: false, typeOnly });
        return;
      }
      // The package imports its modules as .js (NodeNext); the source is the .ts beside it.
      const resolved = path.resolve(path.dirname(file), specifier.replace(/\.js$/, '.ts'));
      module.imports.push({
        target: path.relative(src, resolved).split(path.sep).join('/'),
        local: true,
        typeOnly,
      });
    };
    const visit = (node: ts.Node) => {
      if (
        (ts.isImportDeclaration(node) || ts.isExportDeclaration(node)) &&
        node.moduleSpecifier &&
        ts.isStringLiteral(node.moduleSpecifier)
      )
        add(node.moduleSpecifier.text, isTypeOnly(node));
      else if (
        ts.isCallExpression(node) &&
        node.expression.kind === ts.SyntaxKind.ImportKeyword &&
        node.arguments[0] &&
        ts.isStringLiteral(node.arguments[0])
      )
        add(node.arguments[0].text, false);
      else if (
        ts.isCallExpression(node) &&
        ts.isPropertyAccessExpression(node.expression) &&
        node.expression.name.text === 'query'
      )
        module.queryCalls.push(source.getLineAndCharacterOfPosition(node.getStart()).line + 1);
      else if (
        ts.isCallExpression(node) &&
        ts.isIdentifier(node.expression) &&
        node.expression.text === 'publish' &&
        node.arguments[0] &&
        ts.isStringLiteral(node.arguments[0])
      )
        module.publishes.push({
          event: node.arguments[0].text,
          line: source.getLineAndCharacterOfPosition(node.getStart()).line + 1,
        });
      ts.forEachChild(node, visit);
    };
    visit(source);
    modules.set(name, module);
  }
  return modules;
}

/** Every cycle of the import graph, each as the modules along it (first one repeated last). */
function cycles(modules: Map<string, Module>): string[][] {
  const found: string[][] = [];
  const state = new Map<string, 'open' | 'done'>();
  const stack: string[] = [];
  const visit = (name: string) => {
    state.set(name, 'open');
    stack.push(name);
    for (const { target, local } of modules.get(name)?.imports ?? []) {
      if (!local || !modules.has(target)) continue;
      if (state.get(target) === 'open') found.push([...stack.slice(stack.indexOf(target)), target]);
      else if (!state.has(target)) visit(target);
    }
    stack.pop();
    state.set(name, 'done');
  };
  for (const name of [...modules.keys()].sort()) if (!state.has(name)) visit(name);
  return found;
}

const modules = readModules(SRC);
const inSql = (name: string) => name.startsWith('sql/');

test('the import graph of src/ has no cycle', () => {
  assert.ok(modules.has('client.ts') && modules.has('sql/wire.ts'), `no sources under ${SRC}`);
  assert.deepEqual(
    cycles(modules).map((cycle) => cycle.join(' -> ')),
    [],
  );
});

test('only src/sql/ uses node-postgres for more than types', () => {
  const offenders: string[] = [];
  for (const [name, module] of modules) {
    if (inSql(name)) continue;
    for (const { target, local, typeOnly } of module.imports)
      if (!local && DRIVER.test(target) && !typeOnly) offenders.push(`${name} imports ${target}`);
    for (const line of module.queryCalls) offenders.push(`${name}:${line} calls .query()`);
  }
  assert.deepEqual(offenders, []);
});

test('src/sql/ imports nothing above it', () => {
  const offenders: string[] = [];
  for (const [name, module] of modules) {
    if (!inSql(name)) continue;
    for (const { target, local } of module.imports)
      if (local && !inSql(target) && !BELOW_SQL.some((below) => target.startsWith(below)))
        offenders.push(`${name} imports ${target}`);
  }
  assert.deepEqual(offenders, []);
});

test('what src/sql/ imports from outside it imports nothing of the package but itself', () => {
  const offenders: string[] = [];
  for (const [name, module] of modules) {
    if (!BELOW_SQL.some((below) => name.startsWith(below))) continue;
    for (const { target, local } of module.imports)
      if (local && !BELOW_SQL.some((below) => target.startsWith(below)))
        offenders.push(`${name} imports ${target}`);
  }
  assert.deepEqual(offenders, []);
});

test('each event is published from one place', () => {
  const sites = new Map<string, string[]>();
  for (const [name, module] of modules)
    for (const { event, line } of module.publishes)
      sites.set(event, [...(sites.get(event) ?? []), `${name}:${line}`]);
  assert.ok(sites.has('acquired') && sites.has('lost'), 'no publish() calls found');
  const repeated = [...sites]
    .filter(([, at]) => at.length > 1)
    .map(([e, at]) => `${e}: ${at.join(', ')}`);
  assert.deepEqual(repeated, []);
});
