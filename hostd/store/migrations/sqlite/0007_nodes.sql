-- Daemons that share one PostgreSQL database are nodes: each records its
-- heartbeat, and a run records the node that executes it, so that another
-- node can tell a run whose node died (node_lost) from one still running.
-- A queued run's spec waits in run_specs until a node takes it; a cancel
-- asked on one node reaches the executing node through cancel_requested_at.
-- (SQLite serves one daemon: it keeps the same tables, and its one node.)
CREATE TABLE nodes (
	id           TEXT PRIMARY KEY,
	hostname     TEXT NOT NULL,
	capacity     INTEGER NOT NULL,
	started_at   INTEGER NOT NULL,
	heartbeat_at INTEGER NOT NULL,
	stopped_at   INTEGER
);
ALTER TABLE runs ADD COLUMN node_id TEXT;
ALTER TABLE runs ADD COLUMN cancel_requested_at INTEGER;
-- The node sweeps look at running runs only.
CREATE INDEX runs_running_node ON runs (node_id) WHERE status = 'running';
CREATE TABLE run_specs (
	run_id TEXT PRIMARY KEY REFERENCES runs (id),
	spec   TEXT NOT NULL
);
