/*
 * Update from 0.2.2.  The state (both tables, their rows) stays as it is,
 * and so do the API and its signatures.  The definitions that follow
 * replace every function as on every update, so nothing is dropped or
 * altered here.
 */
