-- A LangGraph run's webhook (brain.run.webhooks): committed with the run's row, delivered once its
-- turn ended or stopped at an interrupt, by any Brain, with a bounded number of attempts.
-- ``next_at`` is when it may be tried next (a Brain trying it moves it on first: a lease).
CREATE TABLE langgraph_webhooks (
    run_id text PRIMARY KEY,
    url text NOT NULL,
    status text NOT NULL DEFAULT 'pending',  -- pending, delivered, failed
    attempts int NOT NULL DEFAULT 0,
    next_at timestamptz NOT NULL DEFAULT now(),
    last_error text,
    delivered_at timestamptz);
CREATE INDEX langgraph_webhooks_due ON langgraph_webhooks (next_at) WHERE status = 'pending';
