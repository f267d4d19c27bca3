-- W3 inspect, lease arm: reads the state of a key the setup left held by this client.
SELECT held FROM lease_plain.inspect('w3i-k04-' || :client_id::text) \gset lease_plain_
\if NOT :lease_plain_held
\set lease_plain_failed 1/0
\endif
