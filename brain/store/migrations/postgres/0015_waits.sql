-- Durable waits (the built-in tools sleep, wait_for_signal and request_approval): a PENDING
-- execution the Brain answers itself. ``wait_key``: the signal it waits for; ``wait_until``: when
-- the clock answers it (its sleep's end, its signal's timeout), cleared once it is answered, so
-- that the scan's index holds only the waits to come (no column an event's apply writes is
-- indexed: those updates stay HOT).
ALTER TABLE executions ADD COLUMN wait_key text, ADD COLUMN wait_until timestamptz;
CREATE INDEX executions_wait_until ON executions (wait_until) WHERE wait_until IS NOT NULL;
