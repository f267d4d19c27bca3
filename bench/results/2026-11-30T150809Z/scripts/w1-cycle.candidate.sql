-- W1-cycle, lease arm: acquire, renew and release a key private to this client, each call
-- its own autocommit transaction (three commits), as a worker that takes, heartbeats and
-- gives back a lease does. A call that does not succeed aborts the client (1/0), so a
-- broken run can never pass as a fast one.
SELECT acquired, epoch FROM lease_cand1.acquire('w1-k05-' || :client_id::text, 'bench-' || :client_id::text, interval '5 minutes') \gset candidate_
\if NOT :candidate_acquired
\set candidate_failed 1/0
\endif
SELECT status = 'ok' AS ok FROM lease_cand1.renew('w1-k05-' || :client_id::text, 'bench-' || :client_id::text, :candidate_epoch, interval '5 minutes') \gset candidate_
\if NOT :candidate_ok
\set candidate_failed 1/0
\endif
SELECT status = 'ok' AS ok FROM lease_cand1.release('w1-k05-' || :client_id::text, 'bench-' || :client_id::text, :candidate_epoch) \gset candidate_
\if NOT :candidate_ok
\set candidate_failed 1/0
\endif
