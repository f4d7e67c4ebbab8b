package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// A run's events have two numbers. Seq is the event's place on the
// timeline, fixed when it is appended. Rev is the run's revision that last
// wrote the event: every append and every amendment takes the run's next
// revision, so a reader that remembers the highest revision it has seen
// finds both new events and amended ones (a shell command's entry is
// appended when it starts and amended with its result when it ends).

// eventColumns are the columns scanEvent reads.
const eventColumns = `seq, rev, t_millis, category, message, data, content`

// nextRev is the run's next revision (run id is ?1).
const nextRev = `(SELECT coalesce(max(rev), 0) + 1 FROM events WHERE run_id = ?1)`

// AppendEvent adds an entry to a run's timeline and returns it with its
// sequence number and revision.
func (s *Store) AppendEvent(ctx context.Context, runID string, e Event) (Event, error) {
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		e, err = s.appendEvent(ctx, tx, runID, e)
		return err
	})
	return e, err
}

func (s *Store) appendEvent(ctx context.Context, tx *sql.Tx, runID string, e Event) (Event, error) {
	if err := s.lockRun(ctx, tx, runID); err != nil {
		return Event{}, err
	}
	err := tx.QueryRowContext(ctx, `INSERT INTO events (run_id, seq, rev, t_millis, category, message, data, content)
		VALUES (?1, (SELECT coalesce(max(seq), 0) + 1 FROM events WHERE run_id = ?1), `+nextRev+`, ?2, ?3, ?4, ?5, ?6)
		RETURNING seq, rev`,
		runID, e.T.Milliseconds(), e.Category, e.Message, nullableData(e.Data), boolInt(e.Content)).Scan(&e.Seq, &e.Rev)
	if err != nil {
		return Event{}, fmt.Errorf("store: append event to %s: %w", runID, err)
	}
	return e, nil
}

// AmendEventData replaces the data of the run's event seq and gives it the
// run's next revision, so live streams send it again. content marks data
// that holds user content: the event is then purged with the run's content
// (an event that already held content stays marked). Only an event of
// runID can be amended, and not once the run's content has been purged:
// anything else is ErrNotFound.
func (s *Store) AmendEventData(ctx context.Context, runID string, seq int64, data json.RawMessage, content bool) (Event, error) {
	var e Event
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		e, err = s.amendEvent(ctx, tx, runID, seq, data, content)
		return err
	})
	return e, err
}

func (s *Store) amendEvent(ctx context.Context, tx *sql.Tx, runID string, seq int64, data json.RawMessage, content bool) (Event, error) {
	if err := s.lockRun(ctx, tx, runID); err != nil {
		return Event{}, err
	}
	e, err := scanEvent(tx.QueryRowContext(ctx, `UPDATE events SET data = ?3, rev = `+nextRev+`, content = CASE WHEN ?4 = 1 THEN 1 ELSE content END
		WHERE run_id = ?1 AND seq = ?2 AND EXISTS (SELECT 1 FROM runs WHERE id = ?1 AND purged_at IS NULL)
		RETURNING `+eventColumns, runID, seq, nullableData(data), boolInt(content)))
	if errors.Is(err, sql.ErrNoRows) {
		return Event{}, fmt.Errorf("store: amend event %d of %s: %w", seq, runID, ErrNotFound)
	}
	if err != nil {
		return Event{}, fmt.Errorf("store: amend event %d of %s: %w", seq, runID, err)
	}
	return e, nil
}

func nullableData(data json.RawMessage) any {
	if len(data) == 0 {
		return nil
	}
	return string(data)
}

// Events returns up to limit timeline entries of a run with a sequence
// number above after, in timeline order, each as last amended.
func (s *Store) Events(ctx context.Context, runID string, after int64, limit int) ([]Event, error) {
	return s.events(ctx, `SELECT `+eventColumns+` FROM events WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?`, runID, after, limit)
}

// EventsSince returns up to limit timeline entries of a run appended or
// amended after revision rev, in revision order: what a live reader that
// has seen up to rev is missing.
func (s *Store) EventsSince(ctx context.Context, runID string, rev int64, limit int) ([]Event, error) {
	return s.events(ctx, `SELECT `+eventColumns+` FROM events WHERE run_id = ? AND rev > ? ORDER BY rev LIMIT ?`, runID, rev, limit)
}

func (s *Store) events(ctx context.Context, query, runID string, cursor int64, limit int) ([]Event, error) {
	rows, err := s.read.QueryContext(ctx, query, runID, cursor, limit)
	if err != nil {
		return nil, fmt.Errorf("store: events of %s: %w", runID, err)
	}
	defer rows.Close()
	var events []Event
	for rows.Next() {
		e, err := scanEvent(rows)
		if err != nil {
			return nil, fmt.Errorf("store: events of %s: %w", runID, err)
		}
		events = append(events, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: events of %s: %w", runID, err)
	}
	return events, nil
}

func scanEvent(row scanner) (Event, error) {
	var e Event
	var t int64
	var data sql.NullString
	if err := row.Scan(&e.Seq, &e.Rev, &t, &e.Category, &e.Message, &data, &e.Content); err != nil {
		return Event{}, err
	}
	e.T = time.Duration(t) * time.Millisecond
	if data.Valid {
		e.Data = []byte(data.String)
	}
	return e, nil
}
