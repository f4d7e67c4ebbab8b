-- Requests and janitor sweeps must not slow down as finished runs pile up
-- (plan_test.go fails on any statement that reads in proportion to history):
-- indexes for the queries that used to read every run, and running totals
-- of finished runs, so /metrics needs no count over all of them.

-- CreateRun counts the organisation's queued and running runs.
CREATE INDEX runs_org_status ON runs (org_id, status);
-- The janitor looks for runs whose retention has ended; purged runs leave
-- the index.
CREATE INDEX runs_unpurged_retention ON runs (retention_until) WHERE purged_at IS NULL;
-- ... and for idempotency keys older than their window; forgotten keys
-- leave the index.
CREATE INDEX runs_live_idempotency_keys ON runs (created_at) WHERE idempotency_key IS NOT NULL;

-- One row per terminal status, updated in FinishRun's transaction.
CREATE TABLE finished_run_totals (
	status         TEXT PRIMARY KEY,
	runs           BIGINT NOT NULL,
	charged_micros BIGINT NOT NULL
);
INSERT INTO finished_run_totals (status, runs, charged_micros)
	SELECT status, count(*), coalesce(sum(charged), 0) FROM runs
	WHERE status NOT IN ('queued', 'running') GROUP BY status;
