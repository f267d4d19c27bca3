/**
 * Durations: milliseconds, or PostgreSQL interval text, reduced to whole microseconds.
 *
 * The client sends every ttl and wait to the server as an exact number of microseconds, never
 * as the caller's text. PostgreSQL adds `'1 day'` or `'1 mon'` to a timestamptz as calendar
 * units (23 or 25 hours across a DST change, 28 to 31 days), so passing the text through would
 * let the server's expiry differ from the duration the client measures its own deadline with.
 * With microseconds both sides use the same length.
 *
 * Units convert the way PostgreSQL compares intervals (and so the way pg_lease validates them):
 * a day is 24 hours, a month 30 days, a year 12 months. A ttl the server accepts as text is
 * therefore accepted as the microseconds the client sends, and vice versa.
 */

/**
 * A duration: a whole number of milliseconds, or PostgreSQL interval text with a unit such as
 * `'30s'`, `'500ms'`, `'1 min 30 sec'`, `'00:01:30'` or `'PT1M30S'`. Text that is only a number
 * (`'30'`, which PostgreSQL reads as seconds) and fractions of a millisecond are refused; see
 * docs/client.md, "Durations".
 *
 * @example
 * import type { Duration } from 'pg-lease';
 * const ttl: Duration = '30s';
 * const wait: Duration = 5_000;
 */
export type Duration = number | string;

const US_PER_MS = 1_000;
const US_PER_SECOND = 1_000_000;
const US_PER_MINUTE = 60 * US_PER_SECOND;
const US_PER_HOUR = 60 * US_PER_MINUTE;
const US_PER_DAY = 24 * US_PER_HOUR;
const DAYS_PER_MONTH = 30;

/**
 * A parsed interval in PostgreSQL's three fields (months, days, time), which pg_lease's rule
 * "no negative field" looks at separately.
 */
export interface IntervalFields {
  months: number;
  days: number;
  microseconds: number;
}

type UnitField = 'months' | 'days' | 'microseconds';

/** Interval units PostgreSQL accepts, with their field and size in that field. */
const UNITS: Record<string, { field: UnitField; size: number; group: string }> = {};
function unit(names: string[], field: UnitField, size: number): void {
  for (const name of names) UNITS[name] = { field, size, group: names[0]! };
}
unit(['microsecond', 'microseconds', 'us', 'usec', 'usecs', 'useconds'], 'microseconds', 1);
unit(['millisecond', 'milliseconds', 'ms', 'msec', 'msecs', 'mseconds'], 'microseconds', US_PER_MS);
unit(['second', 'seconds', 's', 'sec', 'secs'], 'microseconds', US_PER_SECOND);
unit(['minute', 'minutes', 'm', 'min', 'mins'], 'microseconds', US_PER_MINUTE);
unit(['hour', 'hours', 'h', 'hr', 'hrs'], 'microseconds', US_PER_HOUR);
unit(['day', 'days', 'd'], 'days', 1);
unit(['week', 'weeks', 'w'], 'days', 7);
unit(['month', 'months', 'mon', 'mons'], 'months', 1);
unit(['year', 'years', 'y', 'yr', 'yrs'], 'months', 12);
unit(['decade', 'decades', 'dec', 'decs'], 'months', 120);
unit(['century', 'centuries', 'c', 'cent'], 'months', 1_200);
unit(['millennium', 'millennia', 'mil', 'mils', 'millenniums'], 'months', 12_000);

const NUMBER = String.raw`[+-]?(?:\d+\.?\d*|\.\d+)`;
const NUMBER_WITH_UNIT = new RegExp(`^(${NUMBER})\\s*([a-z]+)`);
const BARE_NUMBER = new RegExp(`^(${NUMBER})(?=\\s|$)`);
const TIME = /^([+-])?(\d+):(\d+)(?::(\d+(?:\.\d*)?))?(?=\s|$)/;
const ISO_8601 =
  /^P(?:(\d+(?:\.\d+)?)Y)?(?:(\d+(?:\.\d+)?)M)?(?:(\d+(?:\.\d+)?)W)?(?:(\d+(?:\.\d+)?)D)?(?:T(?:(\d+(?:\.\d+)?)H)?(?:(\d+(?:\.\d+)?)M)?(?:(\d+(?:\.\d+)?)S)?)?$/;

/**
 * Parses PostgreSQL interval text into microseconds (an integer), a month counting 30 days.
 * Returns `Infinity` or `-Infinity` for `'infinity'` and `'-infinity'` and `undefined` for
 * text it does not understand.
 *
 * Understood: unit lists (`'1 hour 30 min'`, `'1h30m'`, `'-5 s'`, `'@ 1 day'`, `'2 days ago'`),
 * a time field with or without a leading day count (`'90:00'`, `'1 02:03:04.5'`), a bare number
 * of seconds (`'30'`) and ISO 8601 durations (`'P1DT2H'`, `'PT0.5S'`). Not understood: the SQL
 * standard year-month form (`'1-2'`) and ISO 8601's alternative form (`'P0001-02-03'`).
 *
 * @example
 * import { parseInterval } from 'pg-lease';
 * parseInterval('1 min 30 s'); // 90_000_000
 * parseInterval('PT0.5S');     // 500_000
 * parseInterval('soon');       // undefined
 */
export function parseInterval(text: string): number | undefined {
  const fields = parseIntervalFields(text);
  return typeof fields === 'object' ? toMicroseconds(fields) : fields;
}

/**
 * Parses PostgreSQL interval text into its fields, keeping them apart so that a negative field
 * can be seen (`'1 day -1 s'`). Returns `Infinity` or `-Infinity` for infinite intervals and
 * `undefined` for text it does not understand; see {@link parseInterval} for the forms.
 *
 * Internal (not exported by the package): the validation reads the fields through it.
 *
 * @internal
 * @example
 * parseIntervalFields('1 day -1 s'); // { months: 0, days: 1, microseconds: -1_000_000 }
 */
export function parseIntervalFields(text: string): IntervalFields | number | undefined {
  let rest = text.trim().toLowerCase();
  if (rest.startsWith('@')) rest = rest.slice(1).trim();
  if (rest === 'infinity' || rest === '+infinity') return Infinity;
  if (rest === '-infinity') return -Infinity;

  const iso = ISO_8601.exec(text.trim());
  if (iso) return iso[0] === 'P' ? undefined : parseIso8601(iso);

  let negate = false;
  if (/(^|\s)ago$/.test(rest)) {
    negate = true;
    rest = rest.slice(0, -3).trim();
  }
  if (rest === '') return undefined;

  const fields: IntervalFields = { months: 0, days: 0, microseconds: 0 };
  const seen = new Set<string>();
  let tokens = 0;
  let pendingDays: number | undefined;
  while (rest !== '') {
    tokens += 1;
    const time = TIME.exec(rest);
    if (time) {
      // A number right before a time field counts days: '1 02:03:04'.
      if (seen.has('time') || seen.has('hour') || seen.has('minute') || seen.has('second'))
        return undefined;
      seen.add('time');
      const [, sign, hours, minutes, seconds] = time;
      if (Number(minutes) > 59 || Number(seconds ?? 0) >= 60) return undefined;
      const size =
        Number(hours) * US_PER_HOUR +
        Number(minutes) * US_PER_MINUTE +
        Number(seconds ?? 0) * US_PER_SECOND;
      fields.microseconds += sign === '-' ? -size : size;
      if (pendingDays !== undefined) {
        addFractional(fields, 'days', pendingDays);
        pendingDays = undefined;
      }
      rest = rest.slice(time[0].length).trimStart();
      continue;
    }
    if (pendingDays !== undefined) return undefined;
    const withUnit = NUMBER_WITH_UNIT.exec(rest);
    if (withUnit) {
      const described = UNITS[withUnit[2]!];
      if (!described || seen.has(described.group)) return undefined;
      if (
        described.group === 'hour' ||
        described.group === 'minute' ||
        described.group === 'second'
      )
        if (seen.has('time')) return undefined;
      seen.add(described.group);
      addFractional(fields, described.field, Number(withUnit[1]) * described.size);
      rest = rest.slice(withUnit[0].length).trimStart();
      continue;
    }
    const bare = BARE_NUMBER.exec(rest);
    if (bare) {
      // Alone it counts seconds ('30'); before a time field it counts days.
      pendingDays = Number(bare[1]);
      rest = rest.slice(bare[0].length).trimStart();
      continue;
    }
    return undefined;
  }
  if (pendingDays !== undefined) {
    if (tokens !== 1 || negate) return undefined;
    fields.microseconds += pendingDays * US_PER_SECOND;
  }
  return negate ? negated(fields) : rounded(fields);
}

function parseIso8601(match: RegExpExecArray): IntervalFields {
  const [, years, months, weeks, days, hours, minutes, seconds] = match.map((part) =>
    part === undefined ? 0 : Number(part),
  ) as number[];
  const fields: IntervalFields = { months: 0, days: 0, microseconds: 0 };
  addFractional(fields, 'months', years! * 12);
  addFractional(fields, 'months', months!);
  addFractional(fields, 'days', weeks! * 7);
  addFractional(fields, 'days', days!);
  fields.microseconds += hours! * US_PER_HOUR + minutes! * US_PER_MINUTE + seconds! * US_PER_SECOND;
  return rounded(fields);
}

function rounded(fields: IntervalFields): IntervalFields {
  return { ...fields, microseconds: roundHalfEven(fields.microseconds) };
}

function negated(fields: IntervalFields): IntervalFields {
  const { months, days, microseconds } = rounded(fields);
  return { months: -months, days: -days, microseconds: -microseconds };
}

/** Adds a value to a field, carrying a fraction down the way PostgreSQL does (months to days to time). */
function addFractional(fields: IntervalFields, field: UnitField, value: number): void {
  if (field === 'microseconds') {
    fields.microseconds += value;
    return;
  }
  const whole = Math.trunc(value);
  const fraction = value - whole;
  fields[field] += whole;
  if (fraction === 0) return;
  if (field === 'months') addFractional(fields, 'days', fraction * DAYS_PER_MONTH);
  else fields.microseconds += fraction * US_PER_DAY;
}

/** The interval's length as PostgreSQL compares intervals: a month is 30 days, a day 24 hours. */
export function toMicroseconds({ months, days, microseconds }: IntervalFields): number {
  return (months * DAYS_PER_MONTH + days) * US_PER_DAY + microseconds;
}

/** C's rint(): PostgreSQL rounds interval microseconds half to even. */
function roundHalfEven(value: number): number {
  const floor = Math.floor(value);
  const fraction = value - floor;
  if (fraction > 0.5) return floor + 1;
  if (fraction < 0.5) return floor;
  return floor % 2 === 0 ? floor : floor + 1;
}

/**
 * A {@link Duration}'s fields: milliseconds become time, text is parsed with
 * {@link parseIntervalFields}. Returns `undefined` when the duration is not a finite interval
 * (infinite, NaN, or text that is not an interval).
 */
export function durationFields(duration: Duration): IntervalFields | undefined {
  if (typeof duration === 'number') {
    if (!Number.isFinite(duration)) return undefined;
    return { months: 0, days: 0, microseconds: roundHalfEven(duration * US_PER_MS) };
  }
  if (typeof duration !== 'string') return undefined;
  const fields = parseIntervalFields(duration);
  return typeof fields === 'object' ? fields : undefined;
}

/** A {@link Duration}'s length in microseconds, or `undefined` when it is not a finite interval. */
export function durationMicroseconds(duration: Duration): number | undefined {
  const fields = durationFields(duration);
  return fields && toMicroseconds(fields);
}
