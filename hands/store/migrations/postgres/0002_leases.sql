ALTER TABLE workers ADD COLUMN lease_expires_at timestamptz,
    ADD COLUMN lock_lost_at timestamptz, ADD COLUMN dead_at timestamptz;
