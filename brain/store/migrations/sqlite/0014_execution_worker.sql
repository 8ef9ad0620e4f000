-- The worker an execution's Hands last started it on (its accepted and started events say
-- so): what the console and `brain show` name as the worker that ran it, beside its attempts.
ALTER TABLE executions ADD COLUMN worker text;
