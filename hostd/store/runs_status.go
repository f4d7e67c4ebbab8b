package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// ListRunsWithStatus is ListRuns limited to runs in one status; an empty
// status lists every run.
func (s *Store) ListRunsWithStatus(ctx context.Context, orgID string, status Status, startingAfter string, limit int) ([]Run, bool, error) {
	if status == "" {
		return s.ListRuns(ctx, orgID, startingAfter, limit)
	}
	var before int64 = 1<<63 - 1
	if startingAfter != "" {
		err := s.read.QueryRowContext(ctx, `SELECT seq FROM runs WHERE id = ? AND org_id = ?`, startingAfter, orgID).Scan(&before)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, false, fmt.Errorf("store: cursor %s: %w", startingAfter, ErrNotFound)
		}
		if err != nil {
			return nil, false, fmt.Errorf("store: cursor %s: %w", startingAfter, err)
		}
	}
	rows, err := s.read.QueryContext(ctx, `SELECT `+runColumns+` FROM runs WHERE org_id = ? AND status = ? AND seq < ?
		ORDER BY seq DESC LIMIT ?`, orgID, status, before, limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("store: list runs: %w", err)
	}
	defer rows.Close()
	var runs []Run
	for rows.Next() {
		r, err := scanRun(rows)
		if err != nil {
			return nil, false, fmt.Errorf("store: list runs: %w", err)
		}
		runs = append(runs, r)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("store: list runs: %w", err)
	}
	if len(runs) > limit {
		return runs[:limit], true, nil
	}
	return runs, false, nil
}
