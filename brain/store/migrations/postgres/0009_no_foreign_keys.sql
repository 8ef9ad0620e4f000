ALTER TABLE threads DROP CONSTRAINT IF EXISTS threads_session_id_fkey,
    DROP CONSTRAINT IF EXISTS threads_agent_name_agent_version_fkey;
ALTER TABLE turns DROP CONSTRAINT IF EXISTS turns_session_id_fkey,
    DROP CONSTRAINT IF EXISTS turns_thread_id_fkey, DROP CONSTRAINT IF EXISTS turns_seq_key;
ALTER TABLE runs DROP CONSTRAINT IF EXISTS runs_turn_id_fkey;
ALTER TABLE steps DROP CONSTRAINT IF EXISTS steps_turn_id_fkey;
ALTER TABLE history DROP CONSTRAINT IF EXISTS history_thread_id_fkey,
    DROP CONSTRAINT IF EXISTS history_turn_id_fkey;
ALTER TABLE model_calls DROP CONSTRAINT IF EXISTS model_calls_turn_id_fkey;
ALTER TABLE executions DROP CONSTRAINT IF EXISTS executions_turn_id_fkey;
ALTER TABLE held_events DROP CONSTRAINT IF EXISTS held_events_execution_id_fkey;
ALTER TABLE execution_output DROP CONSTRAINT IF EXISTS execution_output_execution_id_fkey;
ALTER TABLE public_events DROP CONSTRAINT IF EXISTS public_events_session_id_fkey;
DROP INDEX IF EXISTS executions_turn_step;
