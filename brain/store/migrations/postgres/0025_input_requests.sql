-- What a running execution asks a person (an MCP task in input_required: its key, message and the
-- server's requests), and, once answered, the answer's control (``brain.store.inputs``).
ALTER TABLE executions ADD COLUMN input_request jsonb;
