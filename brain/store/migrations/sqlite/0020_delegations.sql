-- Delegation to child turns (brain.rules.delegation): the parent's call (``execution_id``) and the
-- child it started, written in the commit that accepts the child turn (invariant 19), so that a
-- retry or another Brain finds it and never starts a second one. ``child_turn_id`` NULL: no child
-- was started (refused, or the parent's call ended first: the record that no child starts late).
-- ``chain``: the threads and agents from the root turn down to the child (cycles are refused).
CREATE TABLE delegations (
    execution_id text PRIMARY KEY,
    namespace text NOT NULL,
    session_id text NOT NULL,
    parent_turn_id text NOT NULL,
    parent_thread_id text NOT NULL,
    call_id text NOT NULL,
    tool text NOT NULL,
    agent_name text NOT NULL,
    agent_version text NOT NULL,
    child_thread_id text,
    child_turn_id text,
    chain jsonb TEXT NOT NULL,
    budget jsonb TEXT NOT NULL,
    on_budget text NOT NULL,
    deadline timestamptz TEXT,
    status text NOT NULL,
    reason text,
    cancel_control bigint,
    created_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')),
    settled_at timestamptz TEXT);
CREATE INDEX delegations_child ON delegations (child_turn_id);
CREATE INDEX delegations_parent ON delegations (parent_turn_id);
CREATE INDEX delegations_open ON delegations (created_at) WHERE status IN ('over_budget', 'running');
-- The delegated calls whose child is not accepted yet (their ``wait_key`` is cleared when it is):
-- no column an event's apply writes is in it, so those updates stay HOT.
CREATE INDEX executions_to_delegate ON executions (created_at) WHERE wait_key = 'delegate';
