-- W1-cycle, lease arm: acquire, renew and release a key private to this client, each call
-- its own autocommit transaction (three commits), as a worker that takes, heartbeats and
-- gives back a lease does. A call that does not succeed aborts the client (1/0), so a
-- broken run can never pass as a fast one.
SELECT acquired, epoch FROM lease_plain.acquire('w1-k04-' || :client_id::text, 'bench-' || :client_id::text, interval '5 minutes') \gset lease_plain_
\if NOT :lease_plain_acquired
\set lease_plain_failed 1/0
\endif
SELECT status = 'ok' AS ok FROM lease_plain.renew('w1-k04-' || :client_id::text, 'bench-' || :client_id::text, :lease_plain_epoch, interval '5 minutes') \gset lease_plain_
\if NOT :lease_plain_ok
\set lease_plain_failed 1/0
\endif
SELECT status = 'ok' AS ok FROM lease_plain.release('w1-k04-' || :client_id::text, 'bench-' || :client_id::text, :lease_plain_epoch) \gset lease_plain_
\if NOT :lease_plain_ok
\set lease_plain_failed 1/0
\endif
