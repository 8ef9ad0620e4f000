CREATE TABLE workers (
    id text PRIMARY KEY, kind text NOT NULL, lock_key int NOT NULL,
    started_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')));

CREATE TABLE agents (
    name text NOT NULL, version text NOT NULL, digest text NOT NULL, definition jsonb TEXT NOT NULL,
    created_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')), PRIMARY KEY (name, version));

CREATE TABLE bindings (
    route text NOT NULL, name text NOT NULL, digest text NOT NULL, binding jsonb TEXT NOT NULL,
    announced_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')), PRIMARY KEY (route, name, digest));

CREATE TABLE sessions (
    id text PRIMARY KEY, namespace text NOT NULL, last_event_seq int NOT NULL DEFAULT 0,
    created_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')));

CREATE TABLE threads (
    id text PRIMARY KEY, session_id text NOT NULL REFERENCES sessions(id),
    agent_name text NOT NULL, agent_version text NOT NULL, bindings jsonb TEXT,
    created_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')),
    FOREIGN KEY (agent_name, agent_version) REFERENCES agents(name, version));

CREATE TABLE turns (
    id text PRIMARY KEY, seq int UNIQUE, namespace text NOT NULL,
    session_id text NOT NULL REFERENCES sessions(id), thread_id text NOT NULL REFERENCES threads(id),
    request_id text NOT NULL, input_digest text NOT NULL, input jsonb TEXT NOT NULL,
    status text NOT NULL, phase text NOT NULL, revision int NOT NULL DEFAULT 0,
    lease_owner text, lease_epoch int NOT NULL DEFAULT 0, lease_expires_at timestamptz TEXT,
    wake_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')), waiting_for text,
    model_calls int NOT NULL DEFAULT 0, tool_step int NOT NULL DEFAULT 0,
    result jsonb TEXT, error jsonb TEXT,
    created_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')),
    updated_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')),
    UNIQUE (namespace, session_id, request_id));
-- PostgreSQL fills seq from a sequence; here the rowid gives the same order.
CREATE TRIGGER turns_seq AFTER INSERT ON turns BEGIN
    UPDATE turns SET seq = NEW.rowid WHERE rowid = NEW.rowid; END;
CREATE INDEX turns_claimable ON turns (wake_at) WHERE status IN ('queued', 'running');

CREATE TABLE runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, turn_id text NOT NULL REFERENCES turns(id),
    owner text NOT NULL, epoch int NOT NULL, started_phase text NOT NULL,
    started_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')));

CREATE TABLE steps (
    id INTEGER PRIMARY KEY AUTOINCREMENT, turn_id text NOT NULL REFERENCES turns(id),
    run_id int NOT NULL, phase text NOT NULL, detail jsonb TEXT NOT NULL DEFAULT '{}',
    created_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')));

CREATE TABLE history (
    thread_id text NOT NULL REFERENCES threads(id), position int NOT NULL,
    turn_id text NOT NULL REFERENCES turns(id), role text NOT NULL, content jsonb TEXT NOT NULL,
    created_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')), PRIMARY KEY (thread_id, position));

CREATE TABLE model_calls (
    id INTEGER PRIMARY KEY AUTOINCREMENT, turn_id text NOT NULL REFERENCES turns(id),
    run_id int NOT NULL, reply jsonb TEXT NOT NULL, usage jsonb TEXT NOT NULL DEFAULT '{}',
    created_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')));

CREATE TABLE executions (
    id text PRIMARY KEY, turn_id text NOT NULL REFERENCES turns(id), tool_step int NOT NULL,
    call_id text NOT NULL, route text NOT NULL, tool text NOT NULL, binding_digest text NOT NULL,
    replay_policy text NOT NULL, args jsonb TEXT NOT NULL, request_digest text NOT NULL,
    status text NOT NULL, last_seq int NOT NULL DEFAULT 0, attempts int NOT NULL DEFAULT 0,
    result jsonb TEXT, error jsonb TEXT, how text, evidence text, output_bytes int NOT NULL DEFAULT 0,
    replay_requested_at timestamptz TEXT, command_message_id text,
    created_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')),
    updated_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')),
    UNIQUE (turn_id, call_id));

CREATE TABLE held_events (
    execution_id text NOT NULL REFERENCES executions(id), seq int NOT NULL, payload bytea BLOB NOT NULL,
    received_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')), PRIMARY KEY (execution_id, seq));

CREATE TABLE execution_output (
    execution_id text NOT NULL REFERENCES executions(id), byte_offset int NOT NULL,
    data text NOT NULL, PRIMARY KEY (execution_id, byte_offset));

CREATE TABLE outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, queue text NOT NULL, message_id text NOT NULL,
    payload bytea BLOB NOT NULL, created_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')),
    published_at timestamptz TEXT);
CREATE INDEX outbox_unpublished ON outbox (id) WHERE published_at IS NULL;

CREATE TABLE public_events (
    session_id text NOT NULL REFERENCES sessions(id), seq int NOT NULL, turn_id text,
    kind text NOT NULL, data jsonb TEXT NOT NULL DEFAULT '{}',
    created_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')), PRIMARY KEY (session_id, seq));
