package store

import (
	"context"
	"database/sql"
	"fmt"
)

// SQLite's single writer runs one write transaction at a time, so what a
// transaction read is still true when it writes. PostgreSQL runs writers
// side by side (READ COMMITTED): a transaction that decides on what it
// read (a cap of active runs, a name not taken, a run still active) first
// takes the lock that keeps it true, and concurrent writers queue for that
// lock instead of failing. Serialisable isolation would keep it true too,
// but would fail every writer but one of each organisation's account row,
// which every run's creation and end writes.

// lockRun holds the run's row until the transaction ends: the run's
// timeline, status and content change one transaction at a time.
func (s *Store) lockRun(ctx context.Context, tx *sql.Tx, runID string) error {
	if s.dialect != postgres {
		return nil
	}
	if _, err := tx.ExecContext(ctx, `SELECT 1 FROM runs WHERE id = ? FOR UPDATE`, runID); err != nil {
		return fmt.Errorf("store: lock run %s: %w", runID, err)
	}
	return nil
}

// lockOrg holds the organisation's account row: its runs are created, and
// its connections and members added, one transaction at a time.
func (s *Store) lockOrg(ctx context.Context, tx *sql.Tx, orgID string) error {
	if s.dialect != postgres {
		return nil
	}
	if _, err := tx.ExecContext(ctx, `SELECT 1 FROM accounts WHERE org_id = ? FOR UPDATE`, orgID); err != nil {
		return fmt.Errorf("store: lock organisation %s: %w", orgID, err)
	}
	return nil
}

// namesLock is the advisory lock key that serialises the creation of
// organisations and accounts, whose names and emails must be unique
// ("ephn").
const namesLock = "1701865582"

// lockNames holds the lock under which organisations and accounts are
// created (rarely: a queue costs nothing).
func (s *Store) lockNames(ctx context.Context, tx *sql.Tx) error {
	if s.dialect != postgres {
		return nil
	}
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(`+namesLock+`)`); err != nil {
		return fmt.Errorf("store: lock names: %w", err)
	}
	return nil
}
