package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// Output is one file a run kept. Data is nil when only the listing was
// read.
type Output struct {
	Path        string
	Size        int64
	SHA256      []byte
	ContentType string
	Data        []byte
}

// AddOutput stores a file of an active run. A run that has ended, is
// unknown or has zero data retention is refused (ErrNotFound,
// ErrZeroRetention): its content may already be purged, or must never be
// stored.
func (s *Store) AddOutput(ctx context.Context, runID string, o Output) error {
	if int64(len(o.Data)) != o.Size {
		return fmt.Errorf("store: output %s of %s: size %d but %d bytes", o.Path, runID, o.Size, len(o.Data))
	}
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if err := s.checkRecordable(ctx, tx, runID); err != nil {
			return fmt.Errorf("store: output %s of %s: %w", o.Path, runID, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO run_outputs (run_id, path, size, sha256, content_type, data)
			VALUES (?, ?, ?, ?, ?, ?)`, runID, o.Path, o.Size, o.SHA256, o.ContentType, o.Data); err != nil {
			return fmt.Errorf("store: output %s of %s: %w", o.Path, runID, err)
		}
		return nil
	})
}

// OutputsOf lists the outputs of each of runIDs (without their data), by
// run, each run's in path order.
func (s *Store) OutputsOf(ctx context.Context, runIDs []string) (map[string][]Output, error) {
	out := map[string][]Output{}
	if len(runIDs) == 0 {
		return out, nil
	}
	args := make([]any, len(runIDs))
	for i, id := range runIDs {
		args[i] = id
	}
	rows, err := s.read.QueryContext(ctx, `SELECT run_id, path, size, sha256, content_type FROM run_outputs
		WHERE run_id IN (?`+strings.Repeat(", ?", len(runIDs)-1)+`) ORDER BY run_id, path`, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list outputs: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var runID string
		var o Output
		if err := rows.Scan(&runID, &o.Path, &o.Size, &o.SHA256, &o.ContentType); err != nil {
			return nil, fmt.Errorf("store: list outputs: %w", err)
		}
		out[runID] = append(out[runID], o)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list outputs: %w", err)
	}
	return out, nil
}

// Output loads one output of a run with its data; ErrNotFound when the run
// has none by that path (or its content was purged).
func (s *Store) Output(ctx context.Context, runID, path string) (Output, error) {
	o := Output{Path: path}
	err := s.read.QueryRowContext(ctx, `SELECT size, sha256, content_type, data FROM run_outputs WHERE run_id = ? AND path = ?`,
		runID, path).Scan(&o.Size, &o.SHA256, &o.ContentType, &o.Data)
	if errors.Is(err, sql.ErrNoRows) {
		return Output{}, fmt.Errorf("store: output %s of %s: %w", path, runID, ErrNotFound)
	}
	if err != nil {
		return Output{}, fmt.Errorf("store: output %s of %s: %w", path, runID, err)
	}
	return o, nil
}
