-- The answers a person gave to what an execution asked for (an MCP task in input_required), by
-- the key of each question: JSON text the input controls write and the worker following the
-- task reads, so an answer given while no worker ran it (or while it moved to another) is not lost.
ALTER TABLE executions ADD COLUMN inputs text;
