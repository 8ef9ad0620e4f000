-- Real agents: a turn counts the deaths of its Brains at one point of its work (the crash-loop
-- limit), as "phase#model call#tool step".
ALTER TABLE turns ADD COLUMN crashes int NOT NULL DEFAULT 0;
ALTER TABLE turns ADD COLUMN crash_at text;

-- A session holds several threads, each pinned to the agent version it started with; the main
-- one keeps the session's id. Threads and sessions can be closed once nothing in them is left
-- unfinished.
ALTER TABLE threads ADD COLUMN name text NOT NULL DEFAULT 'main';
ALTER TABLE threads ADD COLUMN closed_at timestamptz TEXT;
ALTER TABLE sessions ADD COLUMN closed_at timestamptz TEXT;

-- Controls: durable commands on a turn (steer, inject, withdraw, pause, resume, cancel, respond),
-- each with a receipt and, once decided, applied or rejected. ``pending`` counts those received
-- and not decided yet: a turn with any is handed to a claim (never woken straight into a run),
-- which applies them at the boundary.
ALTER TABLE turns ADD COLUMN pending int NOT NULL DEFAULT 0;
ALTER TABLE turns ADD COLUMN cancel_requested boolean NOT NULL DEFAULT false;
CREATE TABLE controls (
    id integer PRIMARY KEY AUTOINCREMENT,
    turn_id text NOT NULL,
    request_id text NOT NULL,
    kind text NOT NULL,
    input_digest text NOT NULL,
    body jsonb TEXT NOT NULL,
    status text NOT NULL DEFAULT 'received',
    reason text,
    created_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')),
    decided_at timestamptz TEXT,
    UNIQUE (turn_id, request_id));
CREATE INDEX controls_received ON controls (turn_id) WHERE status = 'received';
