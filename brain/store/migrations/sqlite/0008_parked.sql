CREATE TABLE parked (
    id INTEGER PRIMARY KEY AUTOINCREMENT, queue text NOT NULL, message_id text, reason text NOT NULL,
    headers jsonb TEXT NOT NULL, body bytea BLOB NOT NULL, kind text, execution_id text,
    surfaced text NOT NULL,
    parked_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')));
