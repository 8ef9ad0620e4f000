-- A served submit locks its thread and then counts the thread's unfinished turns, all in one
-- statement (one round trip, no BEGIN and COMMIT around it). The count cannot be a subquery of
-- that statement: its snapshot is taken when the statement starts, before the lock is granted,
-- so it would miss the turn that a racing submit, the one it waited for, started. A VOLATILE
-- function takes a fresh snapshot for each query it runs: called after the lock, it sees that
-- turn. (SQLite runs one transaction at a time: this migration is PostgreSQL's alone.)
CREATE FUNCTION thread_open_turns(thread text, terminal text[]) RETURNS bigint
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN (SELECT count(*) FROM turns WHERE thread_id = thread AND status <> ALL (terminal));
END
$$;
