-- W3 inspect, lease arm: reads the state of a key the setup left held by this client.
SELECT held FROM lease_noset.inspect('w3i-k03-' || :client_id::text) \gset lease_noset_
\if NOT :lease_noset_held
\set lease_noset_failed 1/0
\endif
