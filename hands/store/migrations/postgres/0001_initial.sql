CREATE SEQUENCE worker_lock_seq;
CREATE TABLE workers (
    id text PRIMARY KEY,
    kind text NOT NULL,
    lock_key int NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now()
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
    args jsonb,
    status text NOT NULL CHECK (status IN ('accepted', 'running', 'querying', 'succeeded', 'failed', 'cancelled', 'unknown')),
    owner text NOT NULL,
    attempts int NOT NULL DEFAULT 0,
    last_seq int NOT NULL DEFAULT 0,
    result jsonb,
    error jsonb,
    output_bytes bigint NOT NULL DEFAULT 0,
    cancel_requested boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX executions_open ON executions (route, updated_at)
    WHERE status IN ('accepted', 'running', 'querying');
CREATE TABLE output_chunks (
    execution_id text NOT NULL REFERENCES executions ON DELETE CASCADE,
    byte_offset bigint NOT NULL CHECK (byte_offset >= 0),
    data text NOT NULL,
    PRIMARY KEY (execution_id, byte_offset)
);
CREATE TABLE events (
    execution_id text NOT NULL REFERENCES executions ON DELETE CASCADE,
    seq int NOT NULL CHECK (seq >= 1),
    kind text NOT NULL,
    payload bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    -- when it (last) became due for publishing; a replay request resets it
    pending_since timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz,
    PRIMARY KEY (execution_id, seq)
);
CREATE INDEX events_unpublished ON events (pending_since) WHERE published_at IS NULL;
CREATE TABLE reconciliations (
    id bigserial PRIMARY KEY,
    execution_id text NOT NULL REFERENCES executions ON DELETE CASCADE,
    outcome text NOT NULL CHECK (outcome IN ('succeeded', 'failed')),
    result jsonb,
    error jsonb,
    evidence text NOT NULL CHECK (evidence <> ''),
    actor text NOT NULL,
    at timestamptz NOT NULL DEFAULT now()
);
