/*
 * Update from 0.2.0: what 0.2.1 changes in the state (the table, domains and
 * epoch_floor), nothing yet.  The guard above has run; the shared
 * definitions of the objects directory follow and replace every function.
 * A database on 0.1.0 runs upgrade/0.1.0--0.2.0.sql, then this file, in one
 * script.
 */
