-- A run's output files: copied out of its microVM before the VM is
-- destroyed, run content like the recording (deleted when the run is
-- purged; never stored under zero data retention). The data column comes
-- last so that listing a run's outputs never reads the files' bytes.
CREATE TABLE run_outputs (
	run_id       TEXT NOT NULL REFERENCES runs (id),
	path         TEXT NOT NULL,
	size         BIGINT NOT NULL,
	sha256       BYTEA NOT NULL,
	content_type TEXT NOT NULL,
	data         BYTEA NOT NULL,
	PRIMARY KEY (run_id, path)
);

-- Each organisation's webhook signing secret, sealed like connection
-- headers; created when first asked for, replaced when rotated.
CREATE TABLE webhook_secrets (
	org_id     TEXT PRIMARY KEY REFERENCES orgs (id),
	sealed     BYTEA NOT NULL,
	created_at BIGINT NOT NULL
);

-- The webhook outbox: a run naming a webhook_url gets its row when it is
-- created ('waiting'), and the transaction that finishes the run makes it
-- due ('pending'), so neither a crash nor a restart loses a delivery. The
-- URL is kept only until the delivery has ended.
CREATE TABLE webhook_deliveries (
	run_id          TEXT PRIMARY KEY REFERENCES runs (id),
	org_id          TEXT NOT NULL REFERENCES orgs (id),
	url             TEXT,
	state           TEXT NOT NULL CHECK (state IN ('waiting', 'pending', 'delivered', 'failed')),
	attempts        BIGINT NOT NULL DEFAULT 0,
	next_attempt_at BIGINT
);
-- The deliverer looks for due deliveries; ended ones leave the index.
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE next_attempt_at IS NOT NULL;

-- Every attempt of a delivery, as the API shows it.
CREATE TABLE webhook_attempts (
	run_id      TEXT NOT NULL REFERENCES runs (id),
	attempt     BIGINT NOT NULL,
	started_at  BIGINT NOT NULL,
	duration_ms BIGINT NOT NULL,
	status_code BIGINT,
	error       TEXT,
	PRIMARY KEY (run_id, attempt)
);
