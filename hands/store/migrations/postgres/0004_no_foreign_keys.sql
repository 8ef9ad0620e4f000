ALTER TABLE events DROP CONSTRAINT IF EXISTS events_execution_id_fkey;
ALTER TABLE output_chunks DROP CONSTRAINT IF EXISTS output_chunks_execution_id_fkey;
ALTER TABLE reconciliations DROP CONSTRAINT IF EXISTS reconciliations_execution_id_fkey;
