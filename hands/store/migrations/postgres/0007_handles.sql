-- A durable handle an execution's body got from the external system (an MCP task id) and
-- committed before it waited on it: after a crash another worker re-attaches to the operation
-- by it instead of calling again. Text the tool wrote (JSON), NULL for most executions.
ALTER TABLE executions ADD COLUMN handle text;
