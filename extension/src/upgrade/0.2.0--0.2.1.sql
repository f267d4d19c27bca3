/*
 * Update from 0.2.0.  The state (both tables, their rows) stays as it is.
 * 0.2.1 writes each rule of a key once (objects/10-rules.sql) and builds the
 * batches from the single calls, so the helpers that restated those rules
 * go; the definitions that follow replace every other function.  The owner
 * binding's trigger becomes a setting in objects/90-owner-binding.sql, which
 * carries its state over.  The table's one CHECK constraint goes: the write
 * core holds its rule (install.sql says why).
 */
ALTER TABLE lease.leases DROP CONSTRAINT leases_holder_complete;
-- CASCADE: creating a view or a SQL-standard function body that calls a
-- function needs no EXECUTE on it, so any role could otherwise pin one of
-- these private helpers and make the update fail (2BP01).  What depends on
-- them could never run for a role the extension did not let call them; it
-- goes with them.
DROP FUNCTION IF EXISTS lease._validate(text, text, text, bigint, interval, interval) CASCADE;
DROP FUNCTION IF EXISTS lease._validate_batch(text, text[], text, bigint[], interval) CASCADE;
DROP FUNCTION IF EXISTS lease._validate_operation(text, text, boolean, interval, bigint) CASCADE;
DROP FUNCTION IF EXISTS lease._refusal(text, text, bigint, timestamptz) CASCADE;
DROP FUNCTION IF EXISTS lease._renew_or_release_many(text[], text, bigint[], interval, boolean) CASCADE;
