package store

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"time"
)

// The schema is a numbered list of migrations, one SQL file each, kept
// per SQL dialect under migrations/<dialect>/NNNN_name.sql (sqlite,
// postgres), the same numbers meaning the same change on both. A database
// records in schema_migrations which ones it has; Open applies the rest in
// order, each in its own transaction with its record.
//
//go:embed migrations
var migrationFiles embed.FS

// migration is one numbered schema change.
type migration struct {
	version int
	name    string
	sql     string
}

// migrations lists a dialect's migrations in order, checking that they
// are numbered 1, 2, 3... without gaps.
func migrations(dialect string) ([]migration, error) {
	dir := path.Join("migrations", dialect)
	entries, err := fs.ReadDir(migrationFiles, dir)
	if err != nil {
		return nil, fmt.Errorf("store: migrations of %s: %w", dialect, err)
	}
	var out []migration
	for _, e := range entries {
		num, name, ok := strings.Cut(strings.TrimSuffix(e.Name(), ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || !strings.HasSuffix(e.Name(), ".sql") {
			return nil, fmt.Errorf("store: migration file %s: want NNNN_name.sql", e.Name())
		}
		if v != len(out)+1 {
			return nil, fmt.Errorf("store: migration file %s: want number %d next", e.Name(), len(out)+1)
		}
		b, err := fs.ReadFile(migrationFiles, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("store: read migration %s: %w", e.Name(), err)
		}
		out = append(out, migration{version: v, name: name, sql: string(b)})
	}
	return out, nil
}

// migrate brings the database up to this build's schema. A database written
// by a newer build is refused rather than used with a schema this code does
// not know. Daemons starting together on one PostgreSQL database take
// turns: each migration's transaction first takes an advisory lock and
// reads the version again.
func (s *Store) migrate(ctx context.Context) error {
	ms, err := migrations(string(s.dialect))
	if err != nil {
		return err
	}
	if s.dialect == sqlite {
		if _, err := s.write.ExecContext(ctx, schemaMigrationsTable); err != nil {
			return fmt.Errorf("store: create schema_migrations: %w", err)
		}
		if err := s.adoptUnversioned(ctx); err != nil {
			return err
		}
	}
	for {
		done := false
		err := s.inTx(ctx, func(tx *sql.Tx) error {
			if s.dialect == postgres {
				if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(`+migrationLock+`)`); err != nil {
					return fmt.Errorf("store: lock for migrations: %w", err)
				}
				if _, err := tx.ExecContext(ctx, schemaMigrationsTable); err != nil {
					return fmt.Errorf("store: create schema_migrations: %w", err)
				}
			}
			var have int
			if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&have); err != nil {
				return fmt.Errorf("store: read schema version: %w", err)
			}
			if have > len(ms) {
				return fmt.Errorf("store: the database has schema version %d, newer than this build's %d: run a newer ephemeral", have, len(ms))
			}
			if have == len(ms) {
				done = true
				return nil
			}
			m := ms[have]
			if _, err := tx.ExecContext(ctx, m.sql); err != nil {
				return fmt.Errorf("store: migration %04d_%s: %w", m.version, m.name, err)
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`,
				m.version, m.name, millis(time.Now())); err != nil {
				return fmt.Errorf("store: record migration %04d_%s: %w", m.version, m.name, err)
			}
			return nil
		})
		if err != nil || done {
			return err
		}
	}
}

// schemaMigrationsTable records which migrations a database has; the same
// SQL serves both dialects.
const schemaMigrationsTable = `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER PRIMARY KEY,
		name       TEXT NOT NULL,
		applied_at BIGINT NOT NULL)`

// migrationLock is the PostgreSQL advisory lock key that serialises
// migrations (an arbitrary constant: "ephm" in ASCII).
const migrationLock = "1701865581"

// adoptUnversioned records the migrations a database made before schema
// versions existed already has: daemons then created the first schema
// directly and added events.rev in place.
func (s *Store) adoptUnversioned(ctx context.Context) error {
	var recorded, hasOrgs, hasRev bool
	err := s.write.QueryRowContext(ctx, `SELECT
		EXISTS (SELECT 1 FROM schema_migrations),
		EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name IN ('orgs', 'events')),
		EXISTS (SELECT 1 FROM pragma_table_info('events') WHERE name = 'rev')`).Scan(&recorded, &hasOrgs, &hasRev)
	if err != nil {
		return fmt.Errorf("store: inspect schema: %w", err)
	}
	if recorded || !hasOrgs {
		return nil
	}
	have := 1
	if hasRev {
		have = 2
	}
	return s.inTx(ctx, func(tx *sql.Tx) error {
		for v := 1; v <= have; v++ {
			if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, 'adopted', ?)`,
				v, millis(time.Now())); err != nil {
				return fmt.Errorf("store: adopt schema version %d: %w", v, err)
			}
		}
		return nil
	})
}
