-- W3 inspect, lease arm: reads the state of a key the setup left held by this client.
SELECT held FROM lease_cand2.inspect('w3i-k06-' || :client_id::text) \gset candidate2_
\if NOT :candidate2_held
\set candidate2_failed 1/0
\endif
