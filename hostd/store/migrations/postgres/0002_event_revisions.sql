-- Events get the run's revision that last wrote them, so a shell command's
-- entry can be amended when the command ends and streams resume by
-- revision. Old events were never amended: their revision is their place.
ALTER TABLE events ADD COLUMN rev BIGINT NOT NULL DEFAULT 0;
UPDATE events SET rev = seq;
CREATE INDEX events_run_rev ON events (run_id, rev);
