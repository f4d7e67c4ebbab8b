-- The web app: people who sign in (each the member of the organisation
-- created when they registered), their sessions, attempts counted for
-- rate limits, when each API key was last used, and runs published
-- as public replay pages.
-- SQLite's NOCASE for emails: equal when they differ only in case.
CREATE COLLATION nocase (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
CREATE TABLE users (
	id                  TEXT PRIMARY KEY,
	-- Unique however it is capitalised: Ada@x.org and ada@x.org are one
	-- account.
	email               TEXT COLLATE nocase NOT NULL UNIQUE,
	-- An argon2id hash in PHC form, its parameters with it, so they can be
	-- raised later and old hashes still verify.
	password_hash       TEXT NOT NULL,
	org_id              TEXT NOT NULL REFERENCES orgs (id),
	member_id           TEXT NOT NULL UNIQUE REFERENCES members (id),
	created_at          BIGINT NOT NULL,
	password_changed_at BIGINT NOT NULL
);
-- A signed-in browser. Only the SHA-256 of the cookie's token is kept, so
-- a copy of the database signs nobody in.
CREATE TABLE sessions (
	token_hash   BYTEA PRIMARY KEY,
	user_id      TEXT NOT NULL REFERENCES users (id),
	created_at   BIGINT NOT NULL,
	last_seen_at BIGINT NOT NULL, -- idle expiry counts from here
	expires_at   BIGINT NOT NULL  -- absolute expiry
);
CREATE INDEX sessions_user ON sessions (user_id);
-- Expired sessions are deleted by either expiry.
CREATE INDEX sessions_expires ON sessions (expires_at);
CREATE INDEX sessions_last_seen ON sessions (last_seen_at);
-- Attempts counted in fixed windows for rate limits: failed sign-ins per
-- account and per client address, registrations per address. In the
-- database so that several daemons share the count.
CREATE TABLE auth_attempts (
	key          TEXT PRIMARY KEY, -- e.g. "sign-in-account:<email>"
	window_start BIGINT NOT NULL,
	attempts     BIGINT NOT NULL
);
-- Ended windows are deleted.
CREATE INDEX auth_attempts_window ON auth_attempts (window_start);
-- When each API key was last used, written at most once a minute per key;
-- its own small table so that authenticating never rewrites api_keys.
CREATE TABLE api_key_use (
	key_id       TEXT PRIMARY KEY REFERENCES api_keys (id),
	last_used_at BIGINT NOT NULL
);
-- A member lists the organisation's keys.
CREATE INDEX api_keys_org ON api_keys (org_id, created_at);
-- A run shown read-only to anyone with its link. The slug is random: the
-- link cannot be guessed from the run id.
CREATE TABLE published_runs (
	slug       TEXT PRIMARY KEY,
	run_id     TEXT NOT NULL UNIQUE REFERENCES runs (id),
	org_id     TEXT NOT NULL REFERENCES orgs (id),
	created_at BIGINT NOT NULL
);
