-- W3 renew, lease arm: heartbeats of a lease the client holds. The client's first
-- transaction takes the lease (position 0, left out of the statistics); every later one is
-- a renew. Needs -D epoch=-1.
\if :lease_noset_epoch < 0
SELECT acquired, epoch FROM lease_noset.acquire('w3r-k03-' || :client_id::text, 'bench-' || :client_id::text, interval '5 minutes') \gset lease_noset_
\if NOT :lease_noset_acquired
\set lease_noset_failed 1/0
\endif
\else
SELECT status = 'ok' AS ok FROM lease_noset.renew('w3r-k03-' || :client_id::text, 'bench-' || :client_id::text, :lease_noset_epoch, interval '5 minutes') \gset lease_noset_
\if NOT :lease_noset_ok
\set lease_noset_failed 1/0
\endif
\endif
