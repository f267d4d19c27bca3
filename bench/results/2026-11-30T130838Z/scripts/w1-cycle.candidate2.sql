-- W1-cycle, lease arm: acquire, renew and release a key private to this client, each call
-- its own autocommit transaction (three commits), as a worker that takes, heartbeats and
-- gives back a lease does. A call that does not succeed aborts the client (1/0), so a
-- broken run can never pass as a fast one.
SELECT acquired, epoch FROM lease_cand2.acquire('w1-k06-' || :client_id::text, 'bench-' || :client_id::text, interval '5 minutes') \gset candidate2_
\if NOT :candidate2_acquired
\set candidate2_failed 1/0
\endif
SELECT status = 'ok' AS ok FROM lease_cand2.renew('w1-k06-' || :client_id::text, 'bench-' || :client_id::text, :candidate2_epoch, interval '5 minutes') \gset candidate2_
\if NOT :candidate2_ok
\set candidate2_failed 1/0
\endif
SELECT status = 'ok' AS ok FROM lease_cand2.release('w1-k06-' || :client_id::text, 'bench-' || :client_id::text, :candidate2_epoch) \gset candidate2_
\if NOT :candidate2_ok
\set candidate2_failed 1/0
\endif
