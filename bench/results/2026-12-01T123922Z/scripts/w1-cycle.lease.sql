-- W1-cycle, lease arm: acquire, renew and release a key private to this client, each call
-- its own autocommit transaction (three commits), as a worker that takes, heartbeats and
-- gives back a lease does. A call that does not succeed aborts the client (1/0), so a
-- broken run can never pass as a fast one.
SELECT acquired, epoch FROM lease.acquire('w1-k00-' || :client_id::text, 'bench-' || :client_id::text, interval '5 minutes') \gset lease_
\if NOT :lease_acquired
\set lease_failed 1/0
\endif
SELECT status = 'ok' AS ok FROM lease.renew('w1-k00-' || :client_id::text, 'bench-' || :client_id::text, :lease_epoch, interval '5 minutes') \gset lease_
\if NOT :lease_ok
\set lease_failed 1/0
\endif
SELECT status = 'ok' AS ok FROM lease.release('w1-k00-' || :client_id::text, 'bench-' || :client_id::text, :lease_epoch) \gset lease_
\if NOT :lease_ok
\set lease_failed 1/0
\endif
