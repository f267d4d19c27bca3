-- W2-contend, lease arm: one non-blocking acquire attempt on one of 4 keys shared by all
-- clients. The 20 ms TTL makes keys lapse and change hands all the time, so the mix holds
-- grants, same-owner re-acquires and denials; nobody releases.
\set lease_k random(1, 4)
SELECT acquired FROM lease.acquire('w2-k00-' || :lease_k::text, 'bench-' || :client_id::text, interval '20 milliseconds');
