/**
 * The CLI's JSON: what `--json` prints and what error reports carry. A module of its own, so
 * that both the commands' shared code (common.ts) and the error reports (errors.ts) use it
 * without importing each other.
 */

/** JSON with bigints as strings (exact) and dates as ISO strings. */
export function toJson(value: unknown): string {
  return JSON.stringify(value, (_key, item: unknown) =>
    typeof item === 'bigint' ? item.toString() : item,
  );
}
