CREATE TABLE workers (
    id text PRIMARY KEY,
    kind text NOT NULL,
    lock_key int NOT NULL,
    started_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now'))
);
CREATE TABLE executions (
    execution_id text PRIMARY KEY,
    route text NOT NULL,
    request_digest text NOT NULL,
    namespace text NOT NULL,
    session_id text NOT NULL,
    turn_id text,
    call_id text,
    tool text,
    binding_digest text,
    replay_policy text CHECK (replay_policy IN ('safe', 'unsafe')),
    args jsonb TEXT,
    status text NOT NULL CHECK (status IN ('accepted', 'running', 'querying', 'succeeded', 'failed', 'cancelled', 'unknown')),
    owner text NOT NULL,
    attempts int NOT NULL DEFAULT 0,
    last_seq int NOT NULL DEFAULT 0,
    result jsonb TEXT,
    error jsonb TEXT,
    output_bytes int NOT NULL DEFAULT 0,
    cancel_requested boolean NOT NULL DEFAULT false,
    created_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')),
    updated_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now'))
);
CREATE INDEX executions_open ON executions (route, updated_at)
    WHERE status IN ('accepted', 'running', 'querying');
CREATE TABLE output_chunks (
    execution_id text NOT NULL REFERENCES executions ON DELETE CASCADE,
    byte_offset int NOT NULL CHECK (byte_offset >= 0),
    data text NOT NULL,
    PRIMARY KEY (execution_id, byte_offset)
);
CREATE TABLE events (
    execution_id text NOT NULL REFERENCES executions ON DELETE CASCADE,
    seq int NOT NULL CHECK (seq >= 1),
    kind text NOT NULL,
    payload bytea BLOB NOT NULL,
    created_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')),
    pending_since timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')),
    published_at timestamptz TEXT,
    PRIMARY KEY (execution_id, seq)
);
CREATE INDEX events_unpublished ON events (pending_since) WHERE published_at IS NULL;
CREATE TABLE reconciliations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    execution_id text NOT NULL REFERENCES executions ON DELETE CASCADE,
    outcome text NOT NULL CHECK (outcome IN ('succeeded', 'failed')),
    result jsonb TEXT,
    error jsonb TEXT,
    evidence text NOT NULL CHECK (evidence <> ''),
    actor text NOT NULL,
    at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now'))
);
