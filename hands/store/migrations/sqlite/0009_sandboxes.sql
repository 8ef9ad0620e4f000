-- See postgres/0009_sandboxes.sql: the same tables here.
CREATE TABLE sandboxes (
    namespace text NOT NULL,
    binding_id text NOT NULL,
    owner_session text NOT NULL,
    definition text NOT NULL,
    definition_version text NOT NULL,
    config_ref text NOT NULL,
    identity text NOT NULL UNIQUE,
    nonce text NOT NULL,
    generation int NOT NULL,
    status text NOT NULL CHECK (status IN ('creating', 'ready', 'unknown', 'failed', 'deleting', 'deleted')),
    attempts int NOT NULL DEFAULT 0,
    error text,
    lease_owner text,
    lease_until timestamptz TEXT,
    due_at timestamptz TEXT,
    evidence text,
    actor text,
    created_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')),
    updated_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')),
    PRIMARY KEY (namespace, binding_id)
);
CREATE INDEX sandboxes_due ON sandboxes (due_at) WHERE due_at IS NOT NULL;
CREATE TABLE sandbox_uses (
    namespace text NOT NULL,
    binding_id text NOT NULL,
    execution_id text NOT NULL,
    at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')),
    PRIMARY KEY (namespace, binding_id, execution_id)
);
