-- See postgres/0012_parked.sql: the same change here.
ALTER TABLE executions ADD COLUMN wake_at timestamptz TEXT;
CREATE INDEX executions_parked ON executions (route, wake_at) WHERE open AND wake_at IS NOT NULL;
