-- See postgres/0025_input_requests.sql: the same change here.
ALTER TABLE executions ADD COLUMN input_request jsonb TEXT;
