/*
 * Update from 0.1.0.  The guard above has closed schema lease and refused
 * any foreign object in it (0.1.0 kept the ACL of a schema made beforehand,
 * so one may have been planted).  The table is kept as it is, rows and all;
 * the shared definitions that follow replace every function and add what
 * 0.2.0 adds.  A function that a later version drops, or whose signature
 * changes, is dropped here first.
 */
