-- The batch executor (brain.rules.batches): the manifest a batch call freezes in the commit that
-- accepts it. Its id is the batch call's execution id; its children are executions whose ids are
-- derived from it. ``open`` until the batch call settled: the repair scan looks only at open ones.
CREATE TABLE batches (
    id text PRIMARY KEY,
    turn_id text NOT NULL,
    call_id text NOT NULL,
    tool text NOT NULL,
    mode text NOT NULL,
    at_once int NOT NULL,
    on_failure text NOT NULL,
    size int NOT NULL,
    items jsonb TEXT NOT NULL,
    binding jsonb TEXT NOT NULL,
    open boolean NOT NULL DEFAULT true,
    created_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')));
CREATE INDEX batches_open ON batches (created_at) WHERE open;
