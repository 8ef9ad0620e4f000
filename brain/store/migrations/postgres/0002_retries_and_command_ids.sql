ALTER TABLE turns ADD COLUMN retries int NOT NULL DEFAULT 0;
ALTER TABLE executions ADD COLUMN command_message_id text;
