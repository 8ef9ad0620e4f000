ALTER TABLE executions ADD COLUMN holding boolean NOT NULL DEFAULT false;
UPDATE executions SET holding = true WHERE id IN (SELECT execution_id FROM held_events);
