ALTER TABLE workers ADD COLUMN lease_expires_at timestamptz TEXT;
ALTER TABLE workers ADD COLUMN lock_lost_at timestamptz TEXT;
ALTER TABLE workers ADD COLUMN dead_at timestamptz TEXT;
