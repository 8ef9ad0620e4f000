ALTER TABLE executions ADD COLUMN stall_backoff int NOT NULL DEFAULT 1;
