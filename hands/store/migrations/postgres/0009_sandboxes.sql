-- Sandbox bindings (hands/sandbox): one row per (namespace, binding id) with its lifecycle. The
-- identity and nonce are committed before the provider is asked to create anything; a lease
-- (owner, until) guards a creation and a deletion; due_at is when the chore scan looks at it next
-- (a deletion waiting for its users, a keep-alive). config_ref is the frozen configuration (JSON:
-- backend, image, names of variables; never a value).
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
    lease_until timestamptz,
    due_at timestamptz,
    evidence text,
    actor text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, binding_id)
);
CREATE INDEX sandboxes_due ON sandboxes (due_at) WHERE due_at IS NOT NULL;
-- The executions that use a binding: a deletion waits until none of them is open in the ledger.
CREATE TABLE sandbox_uses (
    namespace text NOT NULL,
    binding_id text NOT NULL,
    execution_id text NOT NULL,
    at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, binding_id, execution_id)
);
