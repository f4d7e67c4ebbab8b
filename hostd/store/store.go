// Package store keeps the daemon's state: organisations, members, API keys,
// runs, their timeline events and model recordings and, through package
// ledger, the accounts. One machine keeps it in an embedded SQLite database
// (pure Go, WAL mode); several daemons share a PostgreSQL database
// (postgres.go). The same SQL and the same numbered migrations, written per
// dialect where they must differ, serve both.
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
	"io/fs"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"time"
)

var (
	// ErrNotFound means the row does not exist or belongs to another
	// organisation.
	ErrNotFound = errors.New("not found")
	// ErrExists means a row with the same unique name exists already.
	ErrExists = errors.New("already exists")
)

// PostgreSQL has many writers: a write transaction that decides on what it
// read takes a lock first (locks.go), so that every check-then-write (an
// organisation's cap of active runs, a name not taken yet, a run still
// active) is as correct as under SQLite's single writer.

// Store is the daemon's database.
type Store struct {
	write   *sql.DB // SQLite: one connection, the single writer; PostgreSQL: the pool
	read    *sql.DB
	dialect dialect
	url     string // PostgreSQL's connection URL; empty for SQLite
}

// dialect names the SQL a database speaks; it is also the directory of its
// migrations.
type dialect string

const (
	sqlite   dialect = "sqlite"
	postgres dialect = "postgres"
)

// Postgres reports whether the store is a shared PostgreSQL database.
func (s *Store) Postgres() bool { return s.dialect == postgres }

// DB returns the pool that writes, for the job queue that must share its
// transactions (package runs enqueues a run's job in the transaction that
// creates it).
func (s *Store) DB() *sql.DB { return s.write }

// URL returns the PostgreSQL connection URL the store was opened with
// (empty for SQLite): LISTEN needs a connection of its own.
func (s *Store) URL() string { return s.url }

// driverName is the database/sql driver Open uses. The store's tests swap
// in a wrapper that records every statement, to check its query plan.
var driverName = "sqlite"

// Open opens (creating if needed) the database file at path, makes it give
// freed pages back (see sqlite.go) and brings its schema up to date (see
// migrate.go).
func Open(ctx context.Context, path string) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("store: create directory for %s: %w", path, err)
	}
	if err := ownerOnly(path); err != nil {
		return nil, err
	}
	pragmas := connectionPragmas()
	w, err := sql.Open(driverName, "file:"+path+"?"+pragmas+"&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	w.SetMaxOpenConns(1)
	w.SetConnMaxIdleTime(0)
	r, err := sql.Open(driverName, "file:"+path+"?"+pragmas)
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("store: open %s for reading: %w", path, err)
	}
	s := &Store{write: w, read: r, dialect: sqlite}
	if err := s.useIncrementalVacuum(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("store: %s: %w", path, err)
	}
	if err := s.migrate(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("store: migrate %s: %w", path, err)
	}
	return s, nil
}

// ownerOnly makes the database file, and its write-ahead log and shared
// memory where they exist, readable and writable by their owner only: they
// hold every organisation's prompts, outputs and timelines. The file is
// created here with mode 0600 (whatever the umask: open(2) only removes
// bits), and SQLite gives the -wal and -shm files it creates the mode of
// the database file; files an older version left readable by others are
// tightened.
func ownerOnly(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("store: create %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("store: create %s: %w", path, err)
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		info, err := os.Stat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("store: check mode of %s: %w", p, err)
		}
		if info.Mode().Perm()&0o077 != 0 {
			if err := os.Chmod(p, info.Mode().Perm()&0o700); err != nil {
				return fmt.Errorf("store: make %s private: %w", p, err)
			}
		}
	}
	return nil
}

// Close closes the connection pools.
func (s *Store) Close() error {
	if s.read == s.write {
		return s.write.Close()
	}
	return errors.Join(s.read.Close(), s.write.Close())
}

// Ping reports whether the database answers a read, without touching any
// table that grows: what a liveness probe needs.
func (s *Store) Ping(ctx context.Context) error {
	var version int
	if err := s.read.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&version); err != nil {
		return fmt.Errorf("store: ping: %w", err)
	}
	return nil
}

// maxTxAttempts bounds how often a PostgreSQL transaction chosen as a
// deadlock's victim is run again.
const maxTxAttempts = 30

// inTx runs fn in one write transaction, committing only if fn succeeds.
// On PostgreSQL fn may run more than once (a deadlock's victim is run
// again): it must not act outside the transaction except to set what it
// returns.
func (s *Store) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	for attempt := 1; ; attempt++ {
		err := s.tryTx(ctx, fn)
		if err == nil || s.dialect != postgres || !retryable(err) || attempt == maxTxAttempts {
			return err
		}
		// Back off a little, longer with every loss, so that writers
		// contending for one row take turns instead of colliding again.
		backoff := time.NewTimer(time.Duration(attempt) * time.Duration(1+mrand.IntN(4)) * time.Millisecond)
		select {
		case <-backoff.C:
		case <-ctx.Done():
			backoff.Stop()
			return err
		}
	}
}

func (s *Store) tryTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
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

// boolInt stores a flag as the 0 or 1 both dialects keep in an integer
// column (pgx will not put a Go bool into one).
func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
