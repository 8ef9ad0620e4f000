ALTER TABLE workers ADD COLUMN lease_expires_at timestamptz, ADD COLUMN lock_lost_at timestamptz,
    ADD COLUMN dead_at timestamptz;
ALTER TABLE turns ADD COLUMN runs int NOT NULL DEFAULT 0;
UPDATE turns SET runs = (SELECT count(*) FROM runs r WHERE r.turn_id = turns.id);
ALTER TABLE executions ADD COLUMN nudges int NOT NULL DEFAULT 0;
