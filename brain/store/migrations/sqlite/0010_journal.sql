-- One record per fact: see postgres/0010_journal.sql for what and why; the same change here.
-- (ts_add is a function infra.sqlite registers on every connection.)

CREATE TABLE journal (
    session_id text NOT NULL,
    seq int NOT NULL,
    thread_id text,
    turn_id text,
    run int,
    status text,
    phase text,
    facts jsonb TEXT NOT NULL,
    created_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')),
    PRIMARY KEY (session_id, seq));

ALTER TABLE sessions RENAME COLUMN last_event_seq TO last_seq;

INSERT INTO journal (session_id, seq, thread_id, turn_id, facts, created_at)
    SELECT session_id, seq, session_id, turn_id, json_array(json_patch(json_object('kind', kind), data)),
           created_at
      FROM public_events;
INSERT INTO journal (session_id, seq, thread_id, turn_id, facts, created_at)
    SELECT th.session_id, s.last_seq + h.position, h.thread_id, h.turn_id,
           json_array(json_object('kind', 'history.message', 'role', h.role, 'content', json(h.content))),
           h.created_at
      FROM history h JOIN threads th ON th.id = h.thread_id JOIN sessions s ON s.id = th.session_id;
INSERT INTO journal (session_id, seq, thread_id, turn_id, facts)
    SELECT t.session_id,
           s.last_seq + coalesce((SELECT max(h.position) FROM history h WHERE h.thread_id = t.thread_id), 0)
             + row_number() OVER (PARTITION BY t.session_id ORDER BY t.seq),
           t.thread_id, t.id,
           json_array(json_object('kind', 'turn.accepted', 'request_id', t.request_id, 'input', json(t.input)))
      FROM turns t JOIN sessions s ON s.id = t.session_id
     WHERE t.phase = 'prepare' AND t.status NOT IN ('completed', 'failed', 'cancelled');
UPDATE sessions SET last_seq = coalesce((SELECT max(seq) FROM journal j WHERE j.session_id = sessions.id), 0);

ALTER TABLE executions ADD COLUMN command bytea BLOB;
ALTER TABLE executions ADD COLUMN created_by text;
ALTER TABLE executions ADD COLUMN journal_detail boolean NOT NULL DEFAULT false;
UPDATE executions SET command = (SELECT o.payload FROM outbox o WHERE o.message_id = executions.command_message_id)
 WHERE status = 'intended';
DELETE FROM outbox WHERE message_id IN (SELECT command_message_id FROM executions);
DROP INDEX outbox_message;

DROP TABLE public_events;
DROP TABLE steps;
DROP TABLE runs;
DROP TABLE model_calls;
DROP TABLE history;
ALTER TABLE turns DROP COLUMN input;
ALTER TABLE executions DROP COLUMN args;

DROP INDEX executions_open;
CREATE INDEX executions_holding ON executions (id) WHERE holding;
CREATE INDEX turns_waiting ON turns (wake_at) WHERE status = 'waiting';
UPDATE turns SET wake_at = (strftime('%Y-%m-%dT%H:%M:%f', 'now')) WHERE status = 'waiting';
