-- When each API key was last used, written at most once a minute per key
-- (see auth.Authenticate); a small table of its own, so that authenticating
-- never rewrites api_keys.
CREATE TABLE api_key_use (
	key_id       TEXT PRIMARY KEY REFERENCES api_keys (id),
	last_used_at INTEGER NOT NULL
);
-- ephemeral admin key list reads one organisation's keys, newest first.
CREATE INDEX api_keys_org ON api_keys (org_id, created_at);
