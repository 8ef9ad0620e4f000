-- See postgres/0007_handles.sql: the same change here.
ALTER TABLE executions ADD COLUMN handle text;
