package store

import (
	"context"
	"fmt"
	"net/url"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// What is specific to SQLite's file format lives here: the connection
// pragmas, giving freed pages back, and the write-ahead log. The rest of
// the store speaks SQL that other databases understand too.

// connectionPragmas are applied to every connection, in this order.
func connectionPragmas() string {
	pragmas := url.Values{}
	for _, p := range []string{
		"busy_timeout(10000)",
		// Before journal_mode: a new file only takes auto_vacuum before its
		// first page is written. Incremental mode lets ReclaimSpace give
		// the pages that purges free back to the file system, a few at a
		// time, instead of leaving them in the file for good.
		"auto_vacuum(INCREMENTAL)",
		"journal_mode(WAL)", "synchronous(NORMAL)", "foreign_keys(1)",
		// Overwrite deleted content instead of leaving it in free pages, so
		// purged prompts and outputs do not linger in the file.
		"secure_delete(1)",
	} {
		pragmas.Add("_pragma", p)
	}
	return pragmas.Encode()
}

// autoVacuumIncremental is PRAGMA auto_vacuum's number for INCREMENTAL.
const autoVacuumIncremental = 2

// useIncrementalVacuum converts a database created without incremental
// auto-vacuum (by daemons before it was turned on): only a VACUUM, which
// rewrites the whole file, can change the mode once tables exist. That
// happens once, at the first Open by a newer build; it takes about as long
// as copying the file and needs that much temporary space.
func (s *Store) useIncrementalVacuum(ctx context.Context) error {
	var mode int
	if err := s.write.QueryRowContext(ctx, `PRAGMA auto_vacuum`).Scan(&mode); err != nil {
		return fmt.Errorf("read auto_vacuum: %w", err)
	}
	if mode == autoVacuumIncremental {
		return nil
	}
	// The connection already asked for INCREMENTAL (connectionPragmas):
	// VACUUM applies it.
	if _, err := s.write.ExecContext(ctx, `VACUUM`); err != nil {
		return fmt.Errorf("vacuum to turn on incremental auto-vacuum: %w", err)
	}
	return nil
}

// afterJanitorStep follows each of the janitor's write steps (began when
// it began). It copies what the WAL holds into the database file from a
// reading connection, without waiting for anyone: SQLite's automatic
// checkpoint (every 1000 pages of WAL) runs on the committing connection,
// which here is the single writer that every request's write waits for,
// and the janitor must not leave it its pages to copy. Then it rests as
// long as the step took, so that the janitor holds the writer at most half
// the time and leaves the CPU to requests meanwhile.
func (s *Store) afterJanitorStep(ctx context.Context, began time.Time) error {
	// PostgreSQL has no single writer to spare, but the janitor still
	// rests there, leaving the CPU to requests.
	if s.dialect == sqlite {
		if _, err := s.read.ExecContext(ctx, `PRAGMA wal_checkpoint(PASSIVE)`); err != nil {
			return fmt.Errorf("store: wal checkpoint: %w", err)
		}
	}
	rest := time.NewTimer(time.Since(began))
	defer rest.Stop()
	select {
	case <-rest.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// vacuumStep is how many free pages (4 KiB each) one step of ReclaimSpace
// gives back: a write arriving meanwhile waits for at most one step.
const vacuumStep = 128

// ReclaimSpace shrinks the file by the pages that purges freed, one short
// step at a time, and reports how many it gave back. PostgreSQL's
// autovacuum does this for a shared database: nothing to do there.
func (s *Store) ReclaimSpace(ctx context.Context) (int, error) {
	if s.dialect != sqlite {
		return 0, nil
	}
	free, err := s.freePages(ctx)
	if err != nil {
		return 0, err
	}
	reclaimed := 0
	for free > 0 {
		began := time.Now()
		if _, err := s.write.ExecContext(ctx, fmt.Sprintf(`PRAGMA incremental_vacuum(%d)`, vacuumStep)); err != nil {
			return reclaimed, fmt.Errorf("store: incremental vacuum: %w", err)
		}
		if err := s.afterJanitorStep(ctx, began); err != nil {
			return reclaimed, err
		}
		left, err := s.freePages(ctx)
		if err != nil {
			return reclaimed, err
		}
		if left >= free {
			// Not in incremental mode (useIncrementalVacuum could not
			// convert the file), or writes freed pages meanwhile: the
			// next sweep goes on.
			break
		}
		reclaimed += free - left
		free = left
	}
	return reclaimed, nil
}

// freePages reads the count of free pages, without waiting for the writer.
func (s *Store) freePages(ctx context.Context) (int, error) {
	var n int
	if err := s.read.QueryRowContext(ctx, `PRAGMA freelist_count`).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count free pages: %w", err)
	}
	return n, nil
}

// Checkpoint copies the write-ahead log into the database file and truncates
// it, so purged content does not survive in old WAL frames. PostgreSQL
// recycles its own WAL: nothing to do there.
func (s *Store) Checkpoint(ctx context.Context) error {
	if s.dialect != sqlite {
		return nil
	}
	if _, err := s.write.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		return fmt.Errorf("store: wal checkpoint: %w", err)
	}
	return nil
}
