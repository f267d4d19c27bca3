/*
 * Update from 0.2.1.  The state (both tables, their rows) stays as it is,
 * and so do the API and its signatures.  0.2.2 changes the guard that opens
 * this script (guard.sql), which runs before this step; the definitions that
 * follow replace every function as they do on every update, so nothing is
 * dropped or altered here.
 */
