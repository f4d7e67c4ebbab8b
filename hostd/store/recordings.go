package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
)

// ErrZeroRetention means the run keeps no content (zero data retention), so
// there is nothing the store may write for it.
var ErrZeroRetention = errors.New("run has zero data retention")

// A recording is run content (prompts, model answers, command output): it
// lives in its own table, keyed by run, so that purging a run deletes it
// and listing runs never loads it.
// SaveRecording stores, or replaces, the recording of a run's model
// exchanges: the JSON document package recording encodes. Only a run that
// is still active may be given one, because a finished run's content may
// already be purged and must not come back; a zero-data-retention run is
// refused with ErrZeroRetention.
func (s *Store) SaveRecording(ctx context.Context, runID string, data []byte) error {
	if !json.Valid(data) {
		return fmt.Errorf("store: save recording of %s: not JSON", runID)
	}
	return s.inTx(ctx, func(tx *sql.Tx) error {
		var zeroRetention bool
		var status Status
		err := tx.QueryRowContext(ctx, `SELECT zero_retention, status FROM runs WHERE id = ?`, runID).Scan(&zeroRetention, &status)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("store: save recording of %s: %w", runID, ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("store: save recording of %s: %w", runID, err)
		}
		if zeroRetention {
			return fmt.Errorf("store: save recording of %s: %w", runID, ErrZeroRetention)
		}
		if status.Terminal() {
			return fmt.Errorf("store: save recording of %s: run has ended: %w", runID, ErrNotFound)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO recordings (run_id, data) VALUES (?, ?)
			ON CONFLICT (run_id) DO UPDATE SET data = excluded.data`, runID, string(data)); err != nil {
			return fmt.Errorf("store: save recording of %s: %w", runID, err)
		}
		return nil
	})
}

// Recording returns the stored recording of one of an organisation's runs.
// A run that has none (not saved yet, zero data retention, purged) and
// another organisation's run are ErrNotFound.
func (s *Store) Recording(ctx context.Context, orgID, runID string) ([]byte, error) {
	var data string
	err := s.read.QueryRowContext(ctx, `SELECT r.data FROM recordings r JOIN runs ON runs.id = r.run_id
		WHERE r.run_id = ? AND runs.org_id = ?`, runID, orgID).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("store: recording of %s: %w", runID, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("store: recording of %s: %w", runID, err)
	}
	return []byte(data), nil
}
