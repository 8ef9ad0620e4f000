-- Honest messages: the attempts of a turn's current model call that ended without a committed
-- reply (a run lost mid-call, a failed call retried), so that the next attempt knows its number
-- and says which one it supersedes; back to 0 when a reply commits.
ALTER TABLE turns ADD COLUMN model_attempt int NOT NULL DEFAULT 0;
-- Forks: the thread a thread was forked from and the journal seq of that thread's history it
-- starts from (the copy itself is the fork's first journal entry).
ALTER TABLE threads ADD COLUMN forked_from text;
ALTER TABLE threads ADD COLUMN forked_at bigint;
