-- W3 inspect, lease arm: reads the state of a key the setup left held by this client.
SELECT held FROM lease.inspect('w3i-' || :client_id::text) \gset
\if NOT :held
\set failed 1/0
\endif
