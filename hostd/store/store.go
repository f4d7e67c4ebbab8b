// Package store keeps the daemon's state in one embedded SQLite database
// (pure Go, WAL mode): organisations, members, API keys, runs, their
// timeline events and model recordings and, through package ledger, the
// accounts.
//
// SQLite allows one writer at a time. Rather than letting concurrent writers
// collide on SQLITE_BUSY, all writes go through a pool of exactly one
// connection and begin IMMEDIATE transactions (so a transaction that reads
// before it writes never has to upgrade its lock); reads use a separate pool
// and run concurrently thanks to WAL. A busy timeout still covers other
// processes (the admin CLI) writing to the same file.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// ErrNotFound means the row does not exist or belongs to another organisation.
var ErrNotFound = errors.New("not found")

// Store is the daemon's database.
type Store struct {
	write *sql.DB // one connection: the single writer
	read  *sql.DB
}

// Open opens (creating if needed) the database file at path and applies the
// schema.
func Open(ctx context.Context, path string) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("store: create directory for %s: %w", path, err)
	}
	pragmas := url.Values{}
	for _, p := range []string{"busy_timeout(10000)", "journal_mode(WAL)", "synchronous(NORMAL)", "foreign_keys(1)",
		// Overwrite deleted content instead of leaving it in free pages, so
		// purged prompts and outputs do not linger in the file.
		"secure_delete(1)"} {
		pragmas.Add("_pragma", p)
	}
	writeDSN := "file:" + path + "?" + pragmas.Encode() + "&_txlock=immediate"
	w, err := sql.Open("sqlite", writeDSN)
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	w.SetMaxOpenConns(1)
	w.SetConnMaxIdleTime(0)
	r, err := sql.Open("sqlite", "file:"+path+"?"+pragmas.Encode())
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("store: open %s for reading: %w", path, err)
	}
	s := &Store{write: w, read: r}
	if _, err := w.ExecContext(ctx, schema+connectionsSchema+recordingsSchema+ledger.Schema); err != nil {
		s.Close()
		return nil, fmt.Errorf("store: apply schema to %s: %w", path, err)
	}
	if err := s.migrate(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("store: migrate %s: %w", path, err)
	}
	return s, nil
}

// migrate brings a database created by an older daemon up to the schema:
// CREATE TABLE IF NOT EXISTS leaves an existing table as it was.
func (s *Store) migrate(ctx context.Context) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		var hasRev bool
		if err := tx.QueryRowContext(ctx, `SELECT count(*) > 0 FROM pragma_table_info('events') WHERE name = 'rev'`).Scan(&hasRev); err != nil {
			return fmt.Errorf("inspect events: %w", err)
		}
		if !hasRev {
			// Old events were never amended, so their revision is their
			// sequence number: resuming streams keep their place.
			if _, err := tx.ExecContext(ctx, `ALTER TABLE events ADD COLUMN rev INTEGER NOT NULL DEFAULT 0;
				UPDATE events SET rev = seq`); err != nil {
				return fmt.Errorf("add events.rev: %w", err)
			}
		}
		if _, err := tx.ExecContext(ctx, `CREATE INDEX IF NOT EXISTS events_run_rev ON events (run_id, rev)`); err != nil {
			return fmt.Errorf("index events.rev: %w", err)
		}
		return nil
	})
}

// Close closes both connection pools.
func (s *Store) Close() error {
	return errors.Join(s.read.Close(), s.write.Close())
}

// Checkpoint copies the write-ahead log into the database file and truncates
// it, so purged content does not survive in old WAL frames.
func (s *Store) Checkpoint(ctx context.Context) error {
	if _, err := s.write.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		return fmt.Errorf("store: wal checkpoint: %w", err)
	}
	return nil
}

// inTx runs fn in one write transaction, committing only if fn succeeds.
func (s *Store) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.write.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: begin: %w", err)
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: commit: %w", err)
	}
	return nil
}

func millis(t time.Time) int64 { return t.UnixMilli() }

func fromMillis(ms sql.NullInt64) *time.Time {
	if !ms.Valid {
		return nil
	}
	t := time.UnixMilli(ms.Int64).UTC()
	return &t
}

const schema = `
CREATE TABLE IF NOT EXISTS orgs (
	id         TEXT PRIMARY KEY,
	name       TEXT NOT NULL UNIQUE,
	created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS members (
	id         TEXT PRIMARY KEY,
	org_id     TEXT NOT NULL REFERENCES orgs (id),
	email      TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	UNIQUE (org_id, email)
);
CREATE TABLE IF NOT EXISTS api_keys (
	id         TEXT PRIMARY KEY,
	member_id  TEXT NOT NULL REFERENCES members (id),
	org_id     TEXT NOT NULL REFERENCES orgs (id),
	hash       BLOB NOT NULL,
	created_at INTEGER NOT NULL,
	revoked_at INTEGER
);
CREATE TABLE IF NOT EXISTS runs (
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
CREATE INDEX IF NOT EXISTS runs_org_seq ON runs (org_id, seq);
CREATE INDEX IF NOT EXISTS runs_status ON runs (status);
CREATE TABLE IF NOT EXISTS events (
	run_id   TEXT NOT NULL REFERENCES runs (id),
	seq      INTEGER NOT NULL,
	t_millis INTEGER NOT NULL,
	category TEXT NOT NULL,
	message  TEXT NOT NULL,
	data     TEXT,
	content  INTEGER NOT NULL DEFAULT 0, -- message/data hold user content: purged with the run
	rev      INTEGER NOT NULL DEFAULT 0, -- the run's revision that last wrote this event; see AmendEventData
	PRIMARY KEY (run_id, seq)
);
`
