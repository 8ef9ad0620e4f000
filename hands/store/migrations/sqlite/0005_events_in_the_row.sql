-- See postgres/0005_events_in_the_row.sql: the same change here.
ALTER TABLE executions ADD COLUMN events jsonb TEXT NOT NULL DEFAULT '[]';
ALTER TABLE executions ADD COLUMN open boolean NOT NULL DEFAULT true;
UPDATE executions SET events = coalesce(
    (SELECT json_group_array(json(CAST(ev.payload AS TEXT)))
       FROM (SELECT payload FROM events ev WHERE ev.execution_id = executions.execution_id ORDER BY seq) ev),
    '[]'),
    open = status IN ('accepted', 'running', 'querying');
DROP TABLE events;
DROP INDEX executions_open;
ALTER TABLE executions DROP COLUMN result;
ALTER TABLE output_chunks ADD COLUMN seq int;
CREATE INDEX executions_open ON executions (route, owner) WHERE open;

ALTER TABLE reconciliations ADD COLUMN sent_at timestamptz TEXT;
UPDATE reconciliations SET sent_at = at;
CREATE INDEX reconciliations_unsent ON reconciliations (id) WHERE sent_at IS NULL;
