-- Schedules: a turn submitted into a thread on a cron expression, or once after a delay. The row
-- holds when it fires next (NULL: a once-schedule that fired); a Brain fires it in the commit that
-- accepts its turn and moves ``next_at`` on, so a time fires once whatever runs.
CREATE TABLE schedules (
    id text PRIMARY KEY,
    namespace text NOT NULL,
    request_id text NOT NULL,
    input_digest text NOT NULL,
    session_id text NOT NULL,
    thread text NOT NULL,
    agent jsonb TEXT NOT NULL,
    input text NOT NULL,
    cron text,
    next_at timestamptz TEXT,
    paused boolean NOT NULL DEFAULT false,
    fires int NOT NULL DEFAULT 0,
    last_due_at timestamptz TEXT,
    last_fired_at timestamptz TEXT,
    last_turn_id text,
    last_error text,
    created_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')),
    UNIQUE (namespace, request_id));
CREATE INDEX schedules_due ON schedules (next_at) WHERE next_at IS NOT NULL AND NOT paused;
