DROP INDEX turns_claimable;
CREATE INDEX turns_claimable ON turns (wake_at, seq) WHERE status IN ('queued', 'running');
