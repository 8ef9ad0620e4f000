CREATE SEQUENCE worker_lock_seq;
CREATE TABLE workers (
    id text PRIMARY KEY, kind text NOT NULL, lock_key int NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now());

CREATE TABLE agents (
    name text NOT NULL, version text NOT NULL, digest text NOT NULL, definition jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (name, version));

CREATE TABLE bindings (
    route text NOT NULL, name text NOT NULL, digest text NOT NULL, binding jsonb NOT NULL,
    announced_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (route, name, digest));

CREATE TABLE sessions (
    id text PRIMARY KEY, namespace text NOT NULL, last_event_seq bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now());

CREATE TABLE threads (
    id text PRIMARY KEY, session_id text NOT NULL REFERENCES sessions(id),
    agent_name text NOT NULL, agent_version text NOT NULL,
    bindings jsonb,  -- frozen {tool name: binding} once the first turn prepared
    created_at timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (agent_name, agent_version) REFERENCES agents(name, version));

CREATE TABLE turns (
    id text PRIMARY KEY, seq bigserial UNIQUE, namespace text NOT NULL,
    session_id text NOT NULL REFERENCES sessions(id), thread_id text NOT NULL REFERENCES threads(id),
    request_id text NOT NULL, input_digest text NOT NULL, input jsonb NOT NULL,
    status text NOT NULL, phase text NOT NULL, revision int NOT NULL DEFAULT 0,
    lease_owner text, lease_epoch int NOT NULL DEFAULT 0, lease_expires_at timestamptz,
    wake_at timestamptz NOT NULL DEFAULT now(), waiting_for text,
    model_calls int NOT NULL DEFAULT 0, tool_step int NOT NULL DEFAULT 0,
    result jsonb, error jsonb,
    created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (namespace, session_id, request_id));
CREATE INDEX turns_claimable ON turns (wake_at) WHERE status IN ('queued', 'running');

CREATE TABLE runs (
    id bigserial PRIMARY KEY, turn_id text NOT NULL REFERENCES turns(id), owner text NOT NULL,
    epoch int NOT NULL, started_phase text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now());

CREATE TABLE steps (
    id bigserial PRIMARY KEY, turn_id text NOT NULL REFERENCES turns(id), run_id bigint NOT NULL,
    phase text NOT NULL, detail jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now());

CREATE TABLE history (
    thread_id text NOT NULL REFERENCES threads(id), position int NOT NULL,
    turn_id text NOT NULL REFERENCES turns(id), role text NOT NULL, content jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (thread_id, position));

CREATE TABLE model_calls (
    id bigserial PRIMARY KEY, turn_id text NOT NULL REFERENCES turns(id), run_id bigint NOT NULL,
    reply jsonb NOT NULL, usage jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now());

CREATE TABLE executions (
    id text PRIMARY KEY, turn_id text NOT NULL REFERENCES turns(id), tool_step int NOT NULL,
    call_id text NOT NULL, route text NOT NULL, tool text NOT NULL, binding_digest text NOT NULL,
    replay_policy text NOT NULL, args jsonb NOT NULL, request_digest text NOT NULL,
    status text NOT NULL, last_seq int NOT NULL DEFAULT 0, attempts int NOT NULL DEFAULT 0,
    result jsonb, error jsonb, how text, evidence text, output_bytes bigint NOT NULL DEFAULT 0,
    replay_requested_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (turn_id, call_id));

CREATE TABLE held_events (
    execution_id text NOT NULL REFERENCES executions(id), seq int NOT NULL, payload bytea NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (execution_id, seq));

CREATE TABLE execution_output (
    execution_id text NOT NULL REFERENCES executions(id), byte_offset bigint NOT NULL,
    data text NOT NULL, PRIMARY KEY (execution_id, byte_offset));

CREATE TABLE outbox (
    id bigserial PRIMARY KEY, queue text NOT NULL, message_id text NOT NULL, payload bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz);
CREATE INDEX outbox_unpublished ON outbox (id) WHERE published_at IS NULL;

CREATE TABLE public_events (
    session_id text NOT NULL REFERENCES sessions(id), seq bigint NOT NULL, turn_id text,
    kind text NOT NULL, data jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (session_id, seq));
