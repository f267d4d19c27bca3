/**
 * Every help text of the `pg-lease` command, in one table: `pg-lease --help`, each
 * `pg-lease <command> --help` and the reference section of docs/cli.md are all rendered from
 * it (`node dist/scripts/cli-doc.js` rewrites the docs; a test fails when they differ).
 */
import { BUNDLED_VERSION } from '../generated/sql.js';

/** One command's help. */
export interface CommandHelp {
  /** The command's name, as typed after `pg-lease`. */
  readonly name: string;
  /** Its own options, after the name (the common ones are added by {@link synopsisLine}). */
  readonly synopsis: string;
  /** One line for the list of commands. */
  readonly summary: string;
  /** What it does, in lines of at most 90 characters. */
  readonly description: string;
  /** Its exit statuses. */
  readonly exit: string;
}

export const COMMAND_HELP: readonly CommandHelp[] = [
  {
    name: 'acquire',
    synopsis: '--key K --ttl D [--wait D] [--owner O]',
    summary: 'take a lease once, print its owner and epoch',
    description: `Takes a lease once and prints its owner and epoch; nothing renews it afterwards (use
\`pg-lease renew\`, or \`pg-lease exec\` to hold a lease while a command runs). The owner is
generated unless --owner is given; renew and release need it. --wait D waits for a held key.`,
    exit: '0 acquired; 75 held by another owner, or --wait ran out.',
  },
  {
    name: 'renew',
    synopsis: '--key K --owner O --epoch E --ttl D',
    summary: 'extend a lease to server time + ttl',
    description: `Extends a lease to server time + ttl and prints the new expiry, or the status that
refused it (not_owner, lapsed, epoch_mismatch).`,
    exit: '0 ok; 76 any other status.',
  },
  {
    name: 'release',
    synopsis: '--key K --owner O --epoch E',
    summary: 'end a lease',
    description: 'Ends a lease: the key becomes free and its epoch moves on.',
    exit: '0 ok; 76 any other status.',
  },
  {
    name: 'inspect',
    synopsis: '--key K',
    summary: "show a key's holder, epoch and expiry",
    description: `Shows whether a key is held, by whom, its epoch and its expiry. The state is held, free
(released or lapsed: the epoch is the fencing watermark) or never (never leased).`,
    exit: '0.',
  },
  {
    name: 'list',
    synopsis: '[--prefix P] [--all]',
    summary: 'list the held keys (--all: every key) with owner, epoch, time left',
    description: `Lists held keys in key order (byte order) with owner, epoch and time left, as
lease.list reports them. --prefix P keeps the keys that start with P; --all adds free and
lapsed keys (their epoch is the fencing watermark). A lapsed grant is not held, as in
inspect. A key held by many (the permits of a counted key, or shared grants) has a line
per holder, each with its owner, epoch and time left (lease.holders; in --json, the key's
"holders"), in watch too. Control characters in keys and owners are printed as escapes.`,
    exit: '0.',
  },
  {
    name: 'watch',
    synopsis: '[--prefix P] [--all] [--interval D] [--count N]',
    summary: 'a live table of the keys, refreshed until Ctrl-C',
    description: `Shows the table of list and refreshes it every --interval (default 1s): on a terminal
in place, with the cursor hidden until it ends; into a pipe or file as frames separated by
a blank line; with --json as one JSON object per refresh and line. Ctrl-C or SIGTERM ends
it; --count N stops after N refreshes. A refresh that fails is shown and the next one tries
again; only a failing first refresh ends the command.`,
    exit: '0 ended by Ctrl-C, SIGTERM or --count; 1 the first refresh failed.',
  },
  {
    name: 'purge',
    synopsis: '--older-than D [--batch N]',
    summary: 'delete keys free or lapsed for at least D',
    description: `Deletes the keys that were released, or whose grant lapsed, at least D ago (7d, 12h;
0 takes every dead key) and prints how many. Held keys are never touched, and a purged
key's next grant still gets a greater epoch than any it had. --batch N deletes at most N
keys per transaction, repeating until a round deletes fewer. Needs EXECUTE on
lease.purge: the role that created the extension has it and may grant it.`,
    exit: '0 purged (also none); 1 no EXECUTE on lease.purge, or another failure.',
  },
  {
    name: 'exec',
    synopsis:
      '--key K --ttl D [--limit N | --shared] [--wait D] [--owner O] [--grace D] [--verbose] -- command [args...]',
    summary: 'run a command while holding a lease',
    description: `Runs the command while holding the lease on K, renewing it every ttl/3. With --wait it
first waits up to D for the key, outside any transaction, woken by the holder's release or
at its expiry; a signal (INT, TERM, HUP, QUIT, USR1, USR2) during the wait stops it with
nothing acquired. The command gets PG_LEASE_KEY, PG_LEASE_OWNER and PG_LEASE_EPOCH (the
fencing epoch) in its environment, and runs in a process group of its own: signals sent to
pg-lease are passed on to the whole group. If the lease is lost, the group gets SIGTERM,
and SIGKILL after --grace (default 10s). When the command exits, what is left of its group
gets SIGTERM and the lease is released. In a loop, exec --wait is the leader pattern.
--limit N makes K a counted key of N permits (as consul lock -n; the last caller's N
stands) and runs the command holding one of them: up to N runners at once, each with a
PG_LEASE_EPOCH of its own. --shared runs it holding K shared (a reader): beside other
--shared runners, never beside an exclusive one (exec without either). --limit and --shared
do not combine; a key held exclusively refuses --limit, a counted key refuses --shared.
--verbose tells on stderr, a line per event, what happens: the grant and its time left,
each renewal, a renewal that failed and when it is tried again, a broken connection and
the renewal that got through again, the loss, signals passed on, the command's exit, the
release. With --json each line is a JSON object with an "event" name (docs/cli.md lists
them); the outcome stays on stdout.`,
    exit: `the command's own (128 + N if signal N ended it); 75 not acquired; 76 lease lost while
the command ran; 128 + N signal N stopped --wait; 126/127 the command could not be run /
was not found.`,
  },
  {
    name: 'install',
    synopsis: '[--from-bundle]',
    summary: 'install pg_lease into the database, or update it',
    description: `Installs pg_lease into the database, or updates the pg_lease it has (keeping every
lease), and prints the version; a newer installed version is refused.
Default: CREATE EXTENSION pg_lease, which needs the extension's files on the server
(make install in extension/). With --from-bundle: runs the install script bundled in
this package (pg_lease ${BUNDLED_VERSION}) in one transaction, for managed PostgreSQL
where extension files cannot be added; the objects then belong to your role, not to an
extension (remove them with DROP SCHEMA lease CASCADE).`,
    exit: '0 installed, updated, or installed already; 1 the server lacks the extension files, or a newer version is installed.',
  },
  {
    name: 'demo',
    synopsis: '',
    summary: 'watch leases at work on a throwaway server',
    description: `Shows pg_lease at work, as a timeline: workers race for a job, the winner heartbeats and
then hangs, its lease lapses, another worker takes over with a greater epoch, and the
database itself refuses the old holder's late write (a lease.fence_row trigger). Without --url it starts a throwaway PostgreSQL server
with pg-lease-testing (npm install --save-dev pg-lease-testing, which brings the server
binaries) and removes it afterwards. With --url it uses that database instead (installing
pg_lease if missing) and drops the table it creates; the lease rows stay.`,
    exit: '0 the story ran to its end.',
  },
];

/** Options every command takes. */
export const COMMON_OPTIONS_HELP: readonly { flags: string; text: string }[] = [
  {
    flags: '--url URL',
    text:
      'postgres:// URL or connection string (default: $DATABASE_URL, else PGHOST,\n' +
      'PGPORT, PGUSER, PGDATABASE, PGPASSWORD, PGSERVICE as psql reads them)',
  },
  { flags: '--json', text: 'print JSON instead of text, errors included ({"error": {...}})' },
  { flags: '-h, --help', text: 'help for the command' },
];

/** The one duration rule, as the CLI states it (docs/client.md has the library's side). */
export const DURATIONS_HELP = `Durations (D) are PostgreSQL interval text with a unit: 30s, 500ms, 1min, 1h30m,
00:01:30, PT30S. A bare number other than 0 is refused (it has no unit), and so is a
fraction of a millisecond.`;

/** Exit codes shared by the commands (exec adds its command's own). */
export const EXIT_CODES_HELP: readonly { code: string; meaning: string }[] = [
  { code: '0', meaning: 'done (renew/release: status ok)' },
  { code: '1', meaning: 'anything unexpected: database unreachable, SQL error' },
  { code: '64', meaning: 'usage error or invalid input; the message names the bad value' },
  { code: '75', meaning: 'lease not acquired: held by another owner, or --wait ran out' },
  { code: '76', meaning: 'lease lost while exec ran its command; renew/release status not ok' },
  { code: '126, 127', meaning: 'exec: the command could not be run / was not found' },
];

function commandNamed(name: string): CommandHelp {
  const command = COMMAND_HELP.find((entry) => entry.name === name);
  if (!command) throw new Error(`no help for command ${name}`);
  return command;
}

/** `pg-lease --help`. */
export function usage(): string {
  const width = Math.max(...COMMAND_HELP.map((command) => command.name.length));
  const flagWidth = Math.max(...COMMON_OPTIONS_HELP.map((option) => option.flags.length));
  return [
    'Usage: pg-lease <command> [options]',
    '       pg-lease --version',
    '',
    'Commands:',
    ...COMMAND_HELP.map((command) => `  ${command.name.padEnd(width)}  ${command.summary}`),
    '',
    'Options for every command:',
    ...COMMON_OPTIONS_HELP.map(
      (option) =>
        `  ${option.flags.padEnd(flagWidth)}  ${option.text.replace(/\n/g, `\n${' '.repeat(flagWidth + 4)}`)}`,
    ),
    '',
    DURATIONS_HELP,
    '',
    'Exit codes:',
    ...EXIT_CODES_HELP.map((exit) => `  ${exit.code.padEnd(8)}  ${exit.meaning}`),
    '',
    'Run pg-lease <command> --help for a command and its options.',
  ].join('\n');
}

/** The options every command takes, as its usage line shows them. */
const COMMON_SYNOPSIS = '[--url URL] [--json]';

/**
 * A command's usage line: its options, then the common ones, before any `-- command` (what
 * follows `--` belongs to the command exec runs).
 */
export function synopsisLine(name: string): string {
  const { synopsis } = commandNamed(name);
  const separator = synopsis.indexOf(' -- ');
  const own = separator === -1 ? synopsis : synopsis.slice(0, separator);
  const rest = separator === -1 ? '' : synopsis.slice(separator);
  return ['pg-lease', name, own, COMMON_SYNOPSIS].filter((part) => part !== '').join(' ') + rest;
}

/** `pg-lease <command> --help`. */
export function commandHelp(name: string): string {
  const command = commandNamed(name);
  return [
    synopsisLine(command.name),
    '',
    command.description,
    '',
    `Exit status: ${command.exit}`,
  ].join('\n');
}

/** The reference section of docs/cli.md: the same text as markdown. */
export function referenceMarkdown(): string {
  return [
    '```',
    usage(),
    '```',
    '',
    ...COMMAND_HELP.flatMap((command) => [
      `### ${command.name}`,
      '',
      '```',
      commandHelp(command.name),
      '```',
      '',
    ]),
  ]
    .join('\n')
    .trimEnd();
}
