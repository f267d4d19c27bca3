-- W3 inspect, lease arm: reads the state of a key the setup left held by this client.
SELECT held FROM lease.inspect('w3i-k00-' || :client_id::text) \gset lease_
\if NOT :lease_held
\set lease_failed 1/0
\endif
