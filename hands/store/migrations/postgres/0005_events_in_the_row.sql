-- An execution's status events live in its own row (``events``: the packed envelopes, in seq
-- order), appended by the same UPDATE that changes its status: one row version per event, not an
-- execution update plus an event row plus a published mark. The relay publishes what a commit
-- hands it; a replay or a repeated command reads the row. Output pages keep their data in
-- ``output_chunks`` (their event items there carry only the offset), and a result lives in its
-- ``succeeded`` event only.
ALTER TABLE executions ADD COLUMN events jsonb NOT NULL DEFAULT '[]',
    ADD COLUMN open boolean NOT NULL DEFAULT true;
UPDATE executions e SET events = coalesce(
    (SELECT jsonb_agg(convert_from(ev.payload, 'UTF8')::jsonb ORDER BY ev.seq)
       FROM events ev WHERE ev.execution_id = e.execution_id), '[]'),
    open = status IN ('accepted', 'running', 'querying');
DROP TABLE events;
ALTER TABLE executions DROP COLUMN result;
ALTER TABLE output_chunks ADD COLUMN seq int;

-- Keyed by what does not change while an execution runs, and holding only open ones: a start
-- stays a HOT update; only the close, which flips ``open``, writes an index entry.
DROP INDEX executions_open;
CREATE INDEX executions_open ON executions (route, owner) WHERE open;

-- Reconciliations are made by the `hands reconcile` command, not by a worker: their event is
-- published by the command, and by the pool's relay if the command could not (sent_at NULL).
ALTER TABLE reconciliations ADD COLUMN sent_at timestamptz;
UPDATE reconciliations SET sent_at = at;
CREATE INDEX reconciliations_unsent ON reconciliations (id) WHERE sent_at IS NULL;

-- Time arithmetic both dialects spell the same way (SQLite has a function of the same name).
CREATE FUNCTION ts_add(t timestamptz, secs double precision) RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE RETURN t + make_interval(secs => secs);
