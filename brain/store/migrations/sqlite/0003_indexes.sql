CREATE INDEX outbox_message ON outbox (message_id);
CREATE INDEX turns_thread_open ON turns (thread_id, seq)
    WHERE status NOT IN ('completed', 'failed', 'cancelled');
CREATE INDEX executions_turn_step ON executions (turn_id, tool_step);
CREATE INDEX executions_open ON executions (updated_at) WHERE status IN ('intended', 'accepted', 'running');
