-- See postgres/0006_reconcile_requests.sql: the same change here.
ALTER TABLE reconciliations ADD COLUMN request_id text;
