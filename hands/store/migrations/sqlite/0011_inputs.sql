-- See postgres/0011_inputs.sql: the same change here.
ALTER TABLE executions ADD COLUMN inputs text;
