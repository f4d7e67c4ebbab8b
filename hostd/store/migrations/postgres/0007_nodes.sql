-- Daemons that share one PostgreSQL database are nodes: each records its
-- heartbeat, and a run records the node that executes it, so that another
-- node can tell a run whose node died (node_lost) from one still running.
-- A queued run's spec waits in run_specs until a node takes it; a cancel
-- asked on one node reaches the executing node through cancel_requested_at.
CREATE TABLE nodes (
	id           TEXT PRIMARY KEY,
	hostname     TEXT NOT NULL,
	capacity     BIGINT NOT NULL,
	started_at   BIGINT NOT NULL,
	heartbeat_at BIGINT NOT NULL,
	stopped_at   BIGINT
);
ALTER TABLE runs ADD COLUMN node_id TEXT;
ALTER TABLE runs ADD COLUMN cancel_requested_at BIGINT;
-- The node sweeps look at running runs only.
CREATE INDEX runs_running_node ON runs (node_id) WHERE status = 'running';
CREATE TABLE run_specs (
	run_id TEXT PRIMARY KEY REFERENCES runs (id),
	spec   TEXT NOT NULL
);

-- Live streams on every node: a change to a run's timeline or status is
-- announced on ephemeral_timeline (payload: the run id) when its
-- transaction commits; a cancel asked for on ephemeral_cancel. Each node
-- LISTENs and wakes its own streams, or stops its own run.
CREATE FUNCTION ephemeral_notify_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_notify('ephemeral_timeline', NEW.run_id);
	RETURN NULL;
END
$$;
CREATE TRIGGER events_notify AFTER INSERT OR UPDATE ON events
	FOR EACH ROW EXECUTE FUNCTION ephemeral_notify_event();

CREATE FUNCTION ephemeral_notify_run() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.status IS DISTINCT FROM OLD.status THEN
		PERFORM pg_notify('ephemeral_timeline', NEW.id);
	END IF;
	IF NEW.cancel_requested_at IS NOT NULL AND OLD.cancel_requested_at IS NULL THEN
		PERFORM pg_notify('ephemeral_cancel', NEW.id);
	END IF;
	RETURN NULL;
END
$$;
CREATE TRIGGER runs_notify AFTER UPDATE OF status, cancel_requested_at ON runs
	FOR EACH ROW EXECUTE FUNCTION ephemeral_notify_run();
