-- The schema of the first daemon: organisations and their keys, runs with
-- their timeline, model recordings, connections and the ledger.
CREATE TABLE orgs (
	id         TEXT PRIMARY KEY,
	name       TEXT NOT NULL UNIQUE,
	created_at INTEGER NOT NULL
);
CREATE TABLE members (
	id         TEXT PRIMARY KEY,
	org_id     TEXT NOT NULL REFERENCES orgs (id),
	email      TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	UNIQUE (org_id, email)
);
CREATE TABLE api_keys (
	id         TEXT PRIMARY KEY,
	member_id  TEXT NOT NULL REFERENCES members (id),
	org_id     TEXT NOT NULL REFERENCES orgs (id),
	hash       BLOB NOT NULL,
	created_at INTEGER NOT NULL,
	revoked_at INTEGER
);
CREATE TABLE runs (
	seq             INTEGER PRIMARY KEY AUTOINCREMENT,
	id              TEXT NOT NULL UNIQUE,
	org_id          TEXT NOT NULL REFERENCES orgs (id),
	idempotency_key TEXT,
	request_hash    BLOB NOT NULL,
	request         TEXT,
	model           TEXT NOT NULL,
	zero_retention  INTEGER NOT NULL,
	timeout_seconds INTEGER NOT NULL,
	status          TEXT NOT NULL,
	created_at      INTEGER NOT NULL,
	started_at      INTEGER,
	finished_at     INTEGER,
	reserved        INTEGER NOT NULL,
	charged         INTEGER NOT NULL DEFAULT 0,
	released        INTEGER NOT NULL DEFAULT 0,
	model_micros    INTEGER NOT NULL DEFAULT 0,
	web_micros      INTEGER NOT NULL DEFAULT 0,
	compute_micros  INTEGER NOT NULL DEFAULT 0,
	model_calls     INTEGER NOT NULL DEFAULT 0,
	input_tokens    INTEGER NOT NULL DEFAULT 0,
	output_tokens   INTEGER NOT NULL DEFAULT 0,
	web_requests    INTEGER NOT NULL DEFAULT 0,
	shell_commands  INTEGER NOT NULL DEFAULT 0,
	vm_millis       INTEGER NOT NULL DEFAULT 0,
	output          TEXT,
	error_code      TEXT,
	error_message   TEXT,
	retention_until INTEGER,
	purged_at       INTEGER,
	-- Concurrent requests with one Idempotency-Key can create only one run.
	UNIQUE (org_id, idempotency_key)
);
CREATE INDEX runs_org_seq ON runs (org_id, seq);
CREATE INDEX runs_status ON runs (status);
CREATE TABLE events (
	run_id   TEXT NOT NULL REFERENCES runs (id),
	seq      INTEGER NOT NULL,
	t_millis INTEGER NOT NULL,
	category TEXT NOT NULL,
	message  TEXT NOT NULL,
	data     TEXT,
	content  INTEGER NOT NULL DEFAULT 0, -- message/data hold user content: purged with the run
	PRIMARY KEY (run_id, seq)
);
CREATE TABLE recordings (
	run_id TEXT PRIMARY KEY REFERENCES runs (id),
	data   TEXT NOT NULL
);
CREATE TABLE connections (
	org_id         TEXT NOT NULL REFERENCES orgs (id),
	name           TEXT NOT NULL,
	base_url       TEXT NOT NULL,
	methods        TEXT NOT NULL, -- comma-separated
	sealed_headers BLOB NOT NULL,
	created_at     INTEGER NOT NULL,
	PRIMARY KEY (org_id, name)
);
-- The ledger (package ledger moves the money): for every account
-- available + held + charged = credited, and no column goes negative.
CREATE TABLE accounts (
	org_id    TEXT PRIMARY KEY,
	available INTEGER NOT NULL DEFAULT 0 CHECK (available >= 0),
	held      INTEGER NOT NULL DEFAULT 0 CHECK (held >= 0),
	charged   INTEGER NOT NULL DEFAULT 0 CHECK (charged >= 0),
	credited  INTEGER NOT NULL DEFAULT 0 CHECK (credited >= 0),
	CHECK (available + held + charged = credited)
);
CREATE TABLE ledger_entries (
	id         INTEGER PRIMARY KEY,
	org_id     TEXT NOT NULL,
	run_id     TEXT,
	kind       TEXT NOT NULL CHECK (kind IN ('credit', 'hold', 'charge', 'release')),
	micros     INTEGER NOT NULL CHECK (micros >= 0),
	created_at INTEGER NOT NULL
);
CREATE INDEX ledger_entries_org ON ledger_entries (org_id, id);
