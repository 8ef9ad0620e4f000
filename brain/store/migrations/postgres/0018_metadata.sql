-- Metadata of sessions and threads, set at a submit (``metadata``, ``thread_metadata``) and
-- searched by the sessions list: string pairs, one row each, apart from the rows a submit writes
-- on its hot path (a submit without metadata writes none). ``scope``: ``session`` (``id`` is the
-- session's key) or ``thread`` (the thread's id: a main thread's id is its session's key, hence
-- the scope in the key).
CREATE TABLE metadata (
    scope text NOT NULL,
    id text NOT NULL,
    key text NOT NULL,
    value text NOT NULL,
    PRIMARY KEY (scope, id, key));
