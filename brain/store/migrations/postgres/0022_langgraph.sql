-- The LangGraph-compatible API (brain.api.langgraph). An assistant is an agent of the namespace
-- under an id of its own, with numbered versions, each naming an agent definition's version (the
-- definition itself is the agents row); ``version`` is the one runs use (``set latest`` moves it).
CREATE TABLE langgraph_assistants (
    namespace text NOT NULL,
    id text NOT NULL,
    graph_id text NOT NULL,
    version int NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, id));
CREATE TABLE langgraph_assistant_versions (
    namespace text NOT NULL,
    assistant_id text NOT NULL,
    version int NOT NULL,
    agent_version text NOT NULL,
    body jsonb NOT NULL,  -- name, description, config, context, metadata as the client gave them
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, assistant_id, version));
-- A run is a turn (or, after an interrupt, the same turn resumed by an answer): what the client
-- asked of it that the turn does not keep (its assistant, stream modes, metadata), and the
-- journal seq its stream starts after. A turn's first run has the turn's request id as its id.
CREATE TABLE langgraph_runs (
    id text PRIMARY KEY,
    namespace text NOT NULL,
    session_id text NOT NULL,
    turn_id text,
    schedule_id text,
    start_seq bigint NOT NULL DEFAULT 0,
    body jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX langgraph_runs_session ON langgraph_runs (session_id, created_at);
CREATE INDEX langgraph_runs_turn ON langgraph_runs (turn_id);
