/**
 * Where the CLI connects, by libpq's rules (as psql would): `--url`, else `DATABASE_URL`, else
 * nothing; a connection service (the `service` parameter, else `PGSERVICE`) fills what the
 * string left unset, from `PGSERVICEFILE` (default `~/.pg_service.conf`), else
 * `PGSYSCONFDIR/pg_service.conf`; node-postgres then takes what is still unset from `PGHOST`,
 * `PGPORT`, `PGUSER`, `PGDATABASE`, `PGPASSWORD` (and `~/.pgpass`), `PGSSLMODE`, `PGAPPNAME`,
 * `PGOPTIONS`, and its defaults. With no host anywhere, libpq's default Unix socket directory
 * is used when it has the server's socket, else localhost.
 *
 * A string that is neither a postgres:// URL nor a `keyword=value` connection string is a
 * usage error, named with where it came from.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import type pg from 'pg';
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
  const isUrl = text !== undefined && /^postgres(ql)?:\/\//i.test(text);
  const given: Params = text === undefined ? {} : parseConnectionString(text, source!);
  const service = given.service ?? (env.PGSERVICE || undefined);
  const params: Params = { ...(service === undefined ? {} : serviceParams(service)), ...given };
  delete params.service;
  if (params.hostaddr !== undefined && params.host === undefined) params.host = params.hostaddr;
  delete params.hostaddr;
  if (params.host === undefined && !env.PGHOST) {
    const port = params.port ?? (env.PGPORT || '5432');
    const dir = DEFAULT_SOCKET_DIRS.find((d) => fs.existsSync(path.join(d, `.s.PGSQL.${port}`)));
    if (dir !== undefined) params.host = dir;
  }
  // A URL as given goes to node-postgres unchanged unless a service or the socket default
  // added to it; everything else is rebuilt as a URL node-postgres reads.
  if (isUrl && Object.keys(params).length === Object.keys(given).length && !given.service)
    return { connectionString: text };
  return { connectionString: toUrl(params) };
}

/** A connection string as libpq's keywords: a postgres:// URL or `keyword=value` pairs. */
export function parseConnectionString(text: string, source: string): Params {
  if (/^postgres(ql)?:\/\//i.test(text)) return parseUrl(text, source);
  if (/^\s*[A-Za-z_]+\s*=/.test(text)) return parseKeywordValue(text, source);
  throw new UsageError(
    `${source} ${JSON.stringify(redact(text))} is not a valid postgres:// URL or connection string`,
    { hint: 'write postgresql://user@host:5432/dbname, or host=... dbname=... as psql takes it' },
  );
}

function parseUrl(text: string, source: string): Params {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw new UsageError(
      `${source} ${JSON.stringify(redact(text))} is not a valid postgres:// URL or connection string`,
      {
        hint: 'write postgresql://user@host:5432/dbname; percent-encode @ : / in user and password',
      },
    );
  }
  const params: Params = {};
  const host = decodeURIComponent(url.hostname).replace(/^\[(.+)\]$/, '$1');
  if (host) params.host = host;
  if (url.port) params.port = url.port;
  if (url.username) params.user = decodeURIComponent(url.username);
  if (url.password) params.password = decodeURIComponent(url.password);
  const dbname = decodeURIComponent(url.pathname.slice(1));
  if (dbname) params.dbname = dbname;
  for (const [key, value] of url.searchParams) params[key] = value;
  return params;
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
      throw new UsageError(
        `${source} ${JSON.stringify(redact(text))} is not a valid postgres:// URL or connection string`,
        { hint: `write keyword=value pairs separated by spaces, such as host=db1 dbname=app` },
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

/** The keywords as a URL node-postgres reads: every one as a query parameter, dbname the path. */
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
