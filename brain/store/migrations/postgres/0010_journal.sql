-- One record per fact. Each commit that changes a turn writes one journal entry carrying the
-- facts of that commit; runs, steps, model calls, the conversation history and the public events
-- are read from it and are no longer kept beside it. A command lives in its execution's row
-- (published from memory after the commit; the repair scan sends it again from there), so the
-- outbox keeps only controls.

-- Time arithmetic both dialects spell the same way (SQLite has a function of the same name).
CREATE FUNCTION ts_add(t timestamptz, secs double precision) RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE RETURN t + make_interval(secs => secs);

CREATE TABLE journal (
    session_id text NOT NULL,
    seq bigint NOT NULL,            -- per session, in commit order: the observers' cursor
    thread_id text,
    turn_id text,
    run int,                        -- the lease epoch of the run that committed it, if a run did
    status text,                    -- where the commit left the turn
    phase text,
    facts jsonb NOT NULL,           -- [{"kind": ..., ...}, ...]
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, seq));

ALTER TABLE sessions RENAME COLUMN last_event_seq TO last_seq;

-- What was kept beside the journal becomes journal entries: public events one fact each, in
-- their order; then each session's history, one message per entry, so that a thread's
-- conversation reads the same as before.
INSERT INTO journal (session_id, seq, thread_id, turn_id, facts, created_at)
    SELECT session_id, seq, session_id, turn_id, jsonb_build_array(jsonb_build_object('kind', kind) || data),
           created_at
      FROM public_events;
INSERT INTO journal (session_id, seq, thread_id, turn_id, facts, created_at)
    SELECT th.session_id, s.last_seq + h.position, h.thread_id, h.turn_id,
           jsonb_build_array(jsonb_build_object('kind', 'history.message', 'role', h.role,
                                                'content', h.content)),
           h.created_at
      FROM history h JOIN threads th ON th.id = h.thread_id JOIN sessions s ON s.id = th.session_id;
-- Turns not prepared yet carry their input into the journal (it leaves the turns row).
INSERT INTO journal (session_id, seq, thread_id, turn_id, facts)
    SELECT t.session_id,
           s.last_seq + coalesce((SELECT max(h.position) FROM history h WHERE h.thread_id = t.thread_id), 0)
             + row_number() OVER (PARTITION BY t.session_id ORDER BY t.seq),
           t.thread_id, t.id,
           jsonb_build_array(jsonb_build_object('kind', 'turn.accepted', 'request_id', t.request_id,
                                                'input', t.input))
      FROM turns t JOIN sessions s ON s.id = t.session_id
     WHERE t.phase = 'prepare' AND t.status NOT IN ('completed', 'failed', 'cancelled');
UPDATE sessions s SET last_seq = coalesce((SELECT max(seq) FROM journal j WHERE j.session_id = s.id), 0);

ALTER TABLE executions ADD COLUMN command bytea, ADD COLUMN created_by text,
    ADD COLUMN journal_detail boolean NOT NULL DEFAULT false;
UPDATE executions e SET command = o.payload
  FROM outbox o WHERE o.message_id = e.command_message_id AND e.status = 'intended';
DELETE FROM outbox o USING executions e WHERE o.message_id = e.command_message_id;
DROP INDEX outbox_message;

DROP TABLE public_events, steps, runs, model_calls, history;
ALTER TABLE turns DROP COLUMN input;
ALTER TABLE executions DROP COLUMN args;

-- Applying an event changes an execution's status, seq and times: an index on any of them would
-- make every such update write a new index entry everywhere (no HOT update). The repair scan
-- starts from the turns that wait instead (their wake_at is when to look at them next), and
-- the gap scan from the few executions that hold events back.
DROP INDEX executions_open;
CREATE INDEX executions_holding ON executions (id) WHERE holding;
CREATE INDEX turns_waiting ON turns (wake_at) WHERE status = 'waiting';
UPDATE turns SET wake_at = now() WHERE status = 'waiting';
