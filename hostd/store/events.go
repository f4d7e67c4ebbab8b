package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// AppendEvent adds an entry to a run's timeline and returns it with its
// sequence number.
func (s *Store) AppendEvent(ctx context.Context, runID string, e Event) (Event, error) {
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		e, err = appendEvent(ctx, tx, runID, e)
		return err
	})
	return e, err
}

func appendEvent(ctx context.Context, tx *sql.Tx, runID string, e Event) (Event, error) {
	var data any
	if len(e.Data) > 0 {
		data = string(e.Data)
	}
	err := tx.QueryRowContext(ctx, `INSERT INTO events (run_id, seq, t_millis, category, message, data, content)
		VALUES (?1, (SELECT coalesce(max(seq), 0) + 1 FROM events WHERE run_id = ?1), ?2, ?3, ?4, ?5, ?6) RETURNING seq`,
		runID, e.T.Milliseconds(), e.Category, e.Message, data, e.Content).Scan(&e.Seq)
	if err != nil {
		return Event{}, fmt.Errorf("store: append event to %s: %w", runID, err)
	}
	return e, nil
}

// Events returns up to limit timeline entries of a run with a sequence
// number above after, in order.
func (s *Store) Events(ctx context.Context, runID string, after int64, limit int) ([]Event, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT seq, t_millis, category, message, data, content FROM events
		WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?`, runID, after, limit)
	if err != nil {
		return nil, fmt.Errorf("store: events of %s: %w", runID, err)
	}
	defer rows.Close()
	var events []Event
	for rows.Next() {
		var e Event
		var t int64
		var data sql.NullString
		if err := rows.Scan(&e.Seq, &t, &e.Category, &e.Message, &data, &e.Content); err != nil {
			return nil, fmt.Errorf("store: events of %s: %w", runID, err)
		}
		e.T = time.Duration(t) * time.Millisecond
		if data.Valid {
			e.Data = []byte(data.String)
		}
		events = append(events, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: events of %s: %w", runID, err)
	}
	return events, nil
}
