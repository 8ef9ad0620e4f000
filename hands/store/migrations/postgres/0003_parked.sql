CREATE TABLE parked (
    id bigserial PRIMARY KEY, queue text NOT NULL, message_id text, reason text NOT NULL,
    headers jsonb NOT NULL, body bytea NOT NULL, kind text, execution_id text, surfaced text NOT NULL,
    parked_at timestamptz NOT NULL DEFAULT now());
