ALTER TABLE workers ADD COLUMN lease_expires_at timestamptz TEXT;
ALTER TABLE workers ADD COLUMN lock_lost_at timestamptz TEXT;
ALTER TABLE workers ADD COLUMN dead_at timestamptz TEXT;
ALTER TABLE turns ADD COLUMN runs int NOT NULL DEFAULT 0;
UPDATE turns SET runs = (SELECT count(*) FROM runs r WHERE r.turn_id = turns.id);
ALTER TABLE executions ADD COLUMN nudges int NOT NULL DEFAULT 0;
