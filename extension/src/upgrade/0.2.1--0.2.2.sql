/*
 * Update from 0.2.1.  The state (both tables, their rows) stays as it is,
 * and so do the API and its signatures.  0.2.2 changes the guard that opens
 * this script (guard.sql, §10): a schema lease whose row this transaction
 * rewrote is no longer taken for one it made because its OID comes just
 * before an extension made in this transaction, and the guard's own
 * take-over is not counted as a rewrite.  The definitions that follow
 * replace every function as on every update, so nothing is dropped or
 * altered here.
 */
