/**
 * Where the CLI connects, by libpq's rules (as psql would): `--url`, else `DATABASE_URL`, else
 * nothing; a connection service (the `service` parameter, else `PGSERVICE`) fills what the
 * string left unset, from `PGSERVICEFILE` (default `~/.pg_service.conf`), else
 * `PGSYSCONFDIR/pg_service.conf`; node-postgres then takes what is still unset from `PGHOST`,
 * `PGPORT`, `PGUSER`, `PGDATABASE`, `PGPASSWORD` (and `~/.pgpass`), `PGSSLMODE`, `PGAPPNAME`,
 * `PGOPTIONS`, and its defaults. With no host anywhere, libpq's default Unix socket directory
 * is used when it has the server's socket, else localhost.
 *
 * A postgres:// URL is read by node-postgres's own parser (pg-connection-string), so that the
 * CLI takes every URL node-postgres takes: `postgresql://user@/db?host=/sock/dir` and
 * `postgresql://%2Fsock%2Fdir/db` name a Unix socket directory. Where libpq and node-postgres
 * differ, the CLI refuses rather than connect elsewhere: several hosts (libpq tries each in
 * turn) are a usage error. `connect_timeout` is kept as node-postgres's connection timeout.
 *
 * A string that is neither a postgres:// URL nor a `keyword=value` connection string is a
 * usage error, named with where it came from.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import type pg from 'pg';
import { parse as parseUrlAsPg } from 'pg-connection-string';
import { UsageError } from './exit-codes.js';

/** libpq keywords the CLI passes on (those node-postgres reads from a URL's query). */
const KEYWORDS = new Set([
  'host',
  'hostaddr',
  'port',
  'dbname',
  'user',
  'password',
  'service',
  'sslmode',
  'sslcert',
  'sslkey',
  'sslrootcert',
  'application_name',
  'fallback_application_name',
  'options',
  'client_encoding',
  'connect_timeout',
]);

/** libpq's compiled-in socket directories (Debian's first, upstream's second). */
const DEFAULT_SOCKET_DIRS = ['/var/run/postgresql', '/tmp'];

type Params = Record<string, string>;

/** The pg config for the command's `--url` value (or DATABASE_URL, or neither). */
export function connectionConfig(values: { url?: string | undefined }): pg.ClientConfig {
  const env = process.env;
  const source = values.url !== undefined ? '--url' : env.DATABASE_URL ? 'DATABASE_URL' : undefined;
  const text = values.url ?? (env.DATABASE_URL || undefined);
  const given: Params = text === undefined ? {} : parseConnectionString(text, source!);
  const service = given.service ?? (env.PGSERVICE || undefined);
  const params: Params = { ...(service === undefined ? {} : serviceParams(service)), ...given };
  delete params.service;
  if (params.hostaddr !== undefined && params.host === undefined) params.host = params.hostaddr;
  delete params.hostaddr;
  // libpq takes a comma-separated list of hosts (and ports) and tries each in turn;
  // node-postgres would take the list as one host name.
  for (const [keyword, variable] of [
    ['host', 'PGHOST'],
    ['port', 'PGPORT'],
  ] as const) {
    const value = params[keyword] ?? (env[variable] || undefined);
    if (value === undefined || !value.includes(',')) continue;
    const from =
      given[keyword] !== undefined
        ? source!
        : params[keyword] !== undefined
          ? `service "${service}"`
          : variable;
    throw severalHosts(`${from} names more than one ${keyword} (${JSON.stringify(value)})`);
  }
  if (params.host === undefined && !env.PGHOST) {
    const port = params.port ?? (env.PGPORT || '5432');
    const dir = DEFAULT_SOCKET_DIRS.find((d) => fs.existsSync(path.join(d, `.s.PGSQL.${port}`)));
    if (dir !== undefined) params.host = dir;
  }
  const config: pg.ClientConfig = { connectionString: toUrl(params) };
  // libpq's connect_timeout (seconds; 0 or less waits forever; at least 2) is not read by
  // node-postgres from a connection string.
  const timeout = Number.parseInt(params.connect_timeout ?? (env.PGCONNECT_TIMEOUT || '0'), 10);
  if (timeout > 0) config.connectionTimeoutMillis = Math.max(timeout, 2) * 1000;
  return config;
}

/** A connection string as libpq's keywords: a postgres:// URL or `keyword=value` pairs. */
export function parseConnectionString(text: string, source: string): Params {
  if (/^postgres(ql)?:\/\//i.test(text)) return parseUrl(text, source);
  if (/^\s*[A-Za-z_]+\s*=/.test(text)) return parseKeywordValue(text, source);
  throw notAConnectionString(
    source,
    text,
    'write postgresql://user@host:5432/dbname, or host=... dbname=... as psql takes it',
  );
}

/** A postgres:// URL as node-postgres reads it (pg-connection-string), as libpq's keywords. */
function parseUrl(text: string, source: string): Params {
  let parsed: ReturnType<typeof parseUrlAsPg>;
  try {
    parsed = parseUrlAsPg(text);
  } catch (error) {
    if ((error as { code?: unknown }).code !== 'ERR_INVALID_URL') throw error;
    // host1:123,host2:456 is no URL to WHATWG's parser (nor to node-postgres).
    const authority = /^[^:]*:\/\/([^/?#]*)/.exec(text)![1]!;
    if (authority.slice(authority.lastIndexOf('@') + 1).includes(','))
      throw severalHosts(`${source} ${JSON.stringify(redact(text))} names more than one host`);
    throw notAConnectionString(
      source,
      text,
      'write postgresql://user@host:5432/dbname; percent-encode @ : / in user and password',
    );
  }
  const params: Params = {};
  for (const [key, value] of Object.entries(parsed)) {
    if (value === null || value === undefined || value === '') continue;
    if (key === 'ssl') {
      // ssl=true/1/0 as given; an object is made from sslmode and the files, kept as given.
      if (typeof value !== 'object') params.ssl = value === false ? '0' : String(value);
    } else if (key === 'database') {
      // The path names the database unless the query does (libpq: the later wins).
      params.dbname ??= String(value);
    } else {
      params[key] = String(value);
    }
  }
  return params;
}

/** The usage error for a string that is no connection string (its password not shown). */
function notAConnectionString(source: string, text: string, hint: string): UsageError {
  return new UsageError(
    `${source} ${JSON.stringify(redact(text))} is not a valid postgres:// URL or connection string`,
    { hint },
  );
}

/** A usage error for a list of hosts, which libpq tries in turn and node-postgres cannot. */
function severalHosts(message: string): UsageError {
  return new UsageError(`${message}: libpq tries each in turn, node-postgres connects to one`, {
    hint: 'give one host (and one port); pg-lease does not choose among several',
  });
}

/** libpq's `keyword = value` form: values bare or single-quoted, with \\ escapes. */
function parseKeywordValue(text: string, source: string): Params {
  const params: Params = {};
  const pair = /\s*([A-Za-z_]+)\s*=\s*(?:'((?:[^'\\]|\\.)*)'|((?:[^\s'\\]|\\.)+))\s*/y;
  let at = 0;
  while (at < text.length) {
    pair.lastIndex = at;
    const match = pair.exec(text);
    if (!match) {
      throw notAConnectionString(
        source,
        text,
        'write keyword=value pairs separated by spaces, such as host=db1 dbname=app',
      );
    }
    const [, keyword, quoted, bare] = match;
    if (!KEYWORDS.has(keyword!))
      throw new UsageError(`${source} has an unknown connection option "${keyword}"`, {
        hint: `options are ${[...KEYWORDS].join(', ')}`,
      });
    params[keyword!] = (quoted ?? bare!).replace(/\\(.)/g, '$1');
    at = pair.lastIndex;
  }
  return params;
}

/**
 * The parameters of a connection service: the first file that defines it, of `PGSERVICEFILE`
 * (else `~/.pg_service.conf`) and `PGSYSCONFDIR/pg_service.conf`.
 */
export function serviceParams(service: string): Params {
  const env = process.env;
  const files = [
    env.PGSERVICEFILE || path.join(os.homedir(), '.pg_service.conf'),
    ...(env.PGSYSCONFDIR ? [path.join(env.PGSYSCONFDIR, 'pg_service.conf')] : []),
  ];
  for (const file of files) {
    let text: string;
    try {
      text = fs.readFileSync(file, 'utf8');
    } catch {
      continue;
    }
    const found = readServiceFile(text, service, file);
    if (found) return found;
  }
  throw new UsageError(`definition of service "${service}" not found`, {
    hint: `looked in ${files.join(' and ')}; set PGSERVICEFILE or PGSYSCONFDIR`,
  });
}

function readServiceFile(text: string, service: string, file: string): Params | undefined {
  let current: string | undefined;
  let found: Params | undefined;
  for (const [index, raw] of text.split(/\r?\n/).entries()) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) continue;
    const section = /^\[(.*)\]$/.exec(line);
    if (section) {
      if (found) return found;
      current = section[1]!;
      if (current === service) found = {};
      continue;
    }
    if (current !== service) continue;
    const eq = line.indexOf('=');
    const keyword = line.slice(0, eq).trim();
    if (eq <= 0 || !KEYWORDS.has(keyword) || keyword === 'service')
      throw new UsageError(`${file} line ${index + 1}: bad connection option "${line}"`, {
        hint: `service entries are keyword=value lines; keywords are ${[...KEYWORDS].filter((k) => k !== 'service').join(', ')}`,
      });
    found![keyword] = line.slice(eq + 1).trim();
  }
  return found;
}

/**
 * The keywords as a URL node-postgres reads (with pg-connection-string, as the CLI read the
 * one given): every one as a query parameter, dbname the path.
 */
function toUrl(params: Params): string {
  const { dbname, ...rest } = params;
  const query = new URLSearchParams(rest).toString();
  return `postgres:///${dbname === undefined ? '' : encodeURIComponent(dbname)}${query ? `?${query}` : ''}`;
}

/** The text with any password replaced, to name it in an error. */
function redact(text: string): string {
  return text
    .replace(/(:\/\/[^:/@]*:)[^@/]*@/, '$1***@')
    .replace(/(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)/gi, '$1***');
}
