-- A reconcile can come as a control from a Brain, for an operator's request through its HTTP API:
-- the request id is that operator's idempotency key, so that the same request delivered twice
-- (a repeated request, a redelivery) is told from a second reconcile of the same execution.
-- NULL for one made with `hands reconcile`.
ALTER TABLE reconciliations ADD COLUMN request_id text;
