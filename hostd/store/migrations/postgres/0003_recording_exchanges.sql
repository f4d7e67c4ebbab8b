-- A run's recording is written as it happens, one row per model exchange
-- holding what changed since the previous request (an entry of package
-- recording), instead of one document of every whole request when the run
-- ends: that grew with the square of the turns and was lost with a crash.
-- recordings keeps the documents earlier daemons wrote; they are still
-- served.
CREATE TABLE recording_exchanges (
	run_id TEXT NOT NULL REFERENCES runs (id),
	turn   BIGINT NOT NULL,
	data   TEXT NOT NULL,
	PRIMARY KEY (run_id, turn)
);
-- A recording cut at its run's size cap says where, and what it dropped.
CREATE TABLE recording_truncations (
	run_id TEXT PRIMARY KEY REFERENCES runs (id),
	data   TEXT NOT NULL
);
