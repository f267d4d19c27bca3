-- W2-contend, in-memory ceiling: a transaction-scoped advisory lock attempt on one of the 4
-- shared keys (one statement; the lock ends with the statement's transaction).
\set advisory_k random(1, 4)
SELECT pg_try_advisory_xact_lock(2, :advisory_k);
