-- See postgres/0026_langgraph_webhooks.sql: the same table here.
CREATE TABLE langgraph_webhooks (
    run_id text PRIMARY KEY,
    url text NOT NULL,
    status text NOT NULL DEFAULT 'pending',
    attempts int NOT NULL DEFAULT 0,
    next_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')),
    last_error text,
    delivered_at timestamptz TEXT);
CREATE INDEX langgraph_webhooks_due ON langgraph_webhooks (next_at) WHERE status = 'pending';
