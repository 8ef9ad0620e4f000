-- A parked execution: its body follows a remote operation by a durable handle (an MCP task that
-- waits for a person, or runs long) and stopped following it for now, freeing its worker's slot.
-- The row keeps the handle; wake_at is when a recovery scan of any worker of the pool takes it up
-- again (an answer or a cancel brings it forward to now). NULL for a row that is not parked.
ALTER TABLE executions ADD COLUMN wake_at timestamptz;
CREATE INDEX executions_parked ON executions (route, wake_at) WHERE open AND wake_at IS NOT NULL;
