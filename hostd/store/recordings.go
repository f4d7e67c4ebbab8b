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
// lives in tables of its own, keyed by run, so that purging a run deletes
// it and listing runs never loads it. It is written while the run is
// active, one entry per model exchange, so a crash loses no turn already
// made; the store treats entries and the truncation mark as opaque JSON
// (package recording defines them).

// StoredRecording is a run's recording as stored.
type StoredRecording struct {
	// Document is a whole recording file, as daemons before per-exchange
	// storage saved one when the run ended. Exchanges and Truncation are
	// empty when it is set.
	Document []byte
	// Exchanges are the run's exchange entries in turn order.
	Exchanges [][]byte
	// Truncation is the mark of a recording cut at its size cap; nil
	// when it was not.
	Truncation []byte
}

// AppendRecordingExchange stores the entry of one model exchange of a run.
// Only a run that is still active may be given one, because a finished
// run's content may already be purged and must not come back; a
// zero-data-retention run is refused with ErrZeroRetention.
func (s *Store) AppendRecordingExchange(ctx context.Context, runID string, turn int, entry []byte) error {
	if !json.Valid(entry) {
		return fmt.Errorf("store: record turn %d of %s: not JSON", turn, runID)
	}
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if err := s.checkRecordable(ctx, tx, runID); err != nil {
			return fmt.Errorf("store: record turn %d of %s: %w", turn, runID, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO recording_exchanges (run_id, turn, data) VALUES (?, ?, ?)`,
			runID, turn, string(entry)); err != nil {
			return fmt.Errorf("store: record turn %d of %s: %w", turn, runID, err)
		}
		return nil
	})
}

// SetRecordingTruncation stores, or replaces, the mark of an active run's
// recording that was cut at its size cap, under the rules of
// AppendRecordingExchange.
func (s *Store) SetRecordingTruncation(ctx context.Context, runID string, mark []byte) error {
	if !json.Valid(mark) {
		return fmt.Errorf("store: mark recording of %s truncated: not JSON", runID)
	}
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if err := s.checkRecordable(ctx, tx, runID); err != nil {
			return fmt.Errorf("store: mark recording of %s truncated: %w", runID, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO recording_truncations (run_id, data) VALUES (?, ?)
			ON CONFLICT (run_id) DO UPDATE SET data = excluded.data`, runID, string(mark)); err != nil {
			return fmt.Errorf("store: mark recording of %s truncated: %w", runID, err)
		}
		return nil
	})
}

// checkRecordable refuses a run that may not be given recording content:
// unknown, ended, or with zero data retention.
func (s *Store) checkRecordable(ctx context.Context, tx *sql.Tx, runID string) error {
	// Held until the content is written: the run cannot end in between.
	if err := s.lockRun(ctx, tx, runID); err != nil {
		return err
	}
	var zeroRetention bool
	var status Status
	err := tx.QueryRowContext(ctx, `SELECT zero_retention, status FROM runs WHERE id = ?`, runID).Scan(&zeroRetention, &status)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return ErrNotFound
	case err != nil:
		return err
	case zeroRetention:
		return ErrZeroRetention
	case status.Terminal():
		return fmt.Errorf("run has ended: %w", ErrNotFound)
	}
	return nil
}

// Recording returns the stored recording of one of an organisation's runs,
// read in one snapshot. A run that has none (no model call yet, zero data
// retention, purged) and another organisation's run are ErrNotFound.
func (s *Store) Recording(ctx context.Context, orgID, runID string) (StoredRecording, error) {
	var rec StoredRecording
	tx, err := s.read.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return rec, fmt.Errorf("store: recording of %s: %w", runID, err)
	}
	defer tx.Rollback()
	var found bool
	err = tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM runs WHERE id = ? AND org_id = ?)`, runID, orgID).Scan(&found)
	if err != nil {
		return rec, fmt.Errorf("store: recording of %s: %w", runID, err)
	}
	if !found {
		return rec, fmt.Errorf("store: recording of %s: %w", runID, ErrNotFound)
	}
	var doc, mark sql.NullString
	if err := tx.QueryRowContext(ctx, `SELECT (SELECT data FROM recordings WHERE run_id = ?1),
		(SELECT data FROM recording_truncations WHERE run_id = ?1)`, runID).Scan(&doc, &mark); err != nil {
		return rec, fmt.Errorf("store: recording of %s: %w", runID, err)
	}
	if doc.Valid {
		return StoredRecording{Document: []byte(doc.String)}, nil
	}
	if mark.Valid {
		rec.Truncation = []byte(mark.String)
	}
	rows, err := tx.QueryContext(ctx, `SELECT data FROM recording_exchanges WHERE run_id = ? ORDER BY turn`, runID)
	if err != nil {
		return rec, fmt.Errorf("store: recording of %s: %w", runID, err)
	}
	defer rows.Close()
	for rows.Next() {
		var entry []byte
		if err := rows.Scan(&entry); err != nil {
			return rec, fmt.Errorf("store: recording of %s: %w", runID, err)
		}
		rec.Exchanges = append(rec.Exchanges, entry)
	}
	if err := rows.Err(); err != nil {
		return rec, fmt.Errorf("store: recording of %s: %w", runID, err)
	}
	if len(rec.Exchanges) == 0 && rec.Truncation == nil {
		return StoredRecording{}, fmt.Errorf("store: recording of %s: %w", runID, ErrNotFound)
	}
	return rec, nil
}
