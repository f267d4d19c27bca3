-- W1-cycle, lease arm: acquire, renew and release a key private to this client, each call
-- its own autocommit transaction (three commits), as a worker that takes, heartbeats and
-- gives back a lease does. A call that does not succeed aborts the client (1/0), so a
-- broken run can never pass as a fast one.
SELECT acquired, epoch FROM lease.acquire('w1-' || :client_id::text, 'bench-' || :client_id::text, interval '5 minutes') \gset
\if NOT :acquired
\set failed 1/0
\endif
SELECT status = 'ok' AS ok FROM lease.renew('w1-' || :client_id::text, 'bench-' || :client_id::text, :epoch, interval '5 minutes') \gset
\if NOT :ok
\set failed 1/0
\endif
SELECT status = 'ok' AS ok FROM lease.release('w1-' || :client_id::text, 'bench-' || :client_id::text, :epoch) \gset
\if NOT :ok
\set failed 1/0
\endif
