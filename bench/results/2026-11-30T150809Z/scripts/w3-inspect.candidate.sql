-- W3 inspect, lease arm: reads the state of a key the setup left held by this client.
SELECT held FROM lease_cand1.inspect('w3i-k05-' || :client_id::text) \gset candidate_
\if NOT :candidate_held
\set candidate_failed 1/0
\endif
