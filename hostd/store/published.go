package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// ErrPurged means the run's content was purged (deleted, or its retention
// ended): there is nothing left to show.
var ErrPurged = errors.New("run content was purged")

// Publication is a run shown read-only to anyone with its link.
type Publication struct {
	Slug      string
	RunID     string
	OrgID     string
	CreatedAt time.Time
}

// PublishRun publishes one of an organisation's finished runs under slug,
// or returns the publication it already has. It fails with ErrNotFound
// for another organisation's run, ErrActive for a run still going, and
// ErrZeroRetention or ErrPurged for a run with no content to show.
func (s *Store) PublishRun(ctx context.Context, orgID, runID, slug string, at time.Time) (Publication, error) {
	var p Publication
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if err := s.lockRun(ctx, tx, runID); err != nil {
			return err
		}
		r, err := scanRun(tx.QueryRowContext(ctx, `SELECT `+runColumns+` FROM runs WHERE id = ? AND org_id = ?`, runID, orgID))
		if errors.Is(err, sql.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		switch {
		case !r.Status.Terminal():
			return ErrActive
		case r.ZeroRetention:
			return ErrZeroRetention
		case r.PurgedAt != nil:
			return ErrPurged
		}
		p, err = scanPublication(tx.QueryRowContext(ctx, `SELECT slug, run_id, org_id, created_at FROM published_runs WHERE run_id = ?`, runID))
		if err == nil || !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		p = Publication{Slug: slug, RunID: runID, OrgID: orgID, CreatedAt: at.UTC().Truncate(time.Millisecond)}
		_, err = tx.ExecContext(ctx, `INSERT INTO published_runs (slug, run_id, org_id, created_at) VALUES (?, ?, ?, ?)`,
			slug, runID, orgID, millis(at))
		return err
	})
	if err != nil {
		return Publication{}, fmt.Errorf("store: publish %s: %w", runID, err)
	}
	return p, nil
}

func scanPublication(row scanner) (Publication, error) {
	var p Publication
	var created int64
	if err := row.Scan(&p.Slug, &p.RunID, &p.OrgID, &created); err != nil {
		return Publication{}, err
	}
	p.CreatedAt = time.UnixMilli(created).UTC()
	return p, nil
}

// PublicationOf returns the publication of one of an organisation's runs,
// or ErrNotFound when it has none.
func (s *Store) PublicationOf(ctx context.Context, orgID, runID string) (Publication, error) {
	p, err := scanPublication(s.read.QueryRowContext(ctx,
		`SELECT slug, run_id, org_id, created_at FROM published_runs WHERE run_id = ? AND org_id = ?`, runID, orgID))
	if errors.Is(err, sql.ErrNoRows) {
		return Publication{}, fmt.Errorf("store: publication of %s: %w", runID, ErrNotFound)
	}
	if err != nil {
		return Publication{}, fmt.Errorf("store: publication of %s: %w", runID, err)
	}
	return p, nil
}

// UnpublishRun removes a run's publication: its link stops working. A run
// that is not published (or is another organisation's) is ErrNotFound.
func (s *Store) UnpublishRun(ctx context.Context, orgID, runID string) error {
	res, err := s.write.ExecContext(ctx, `DELETE FROM published_runs WHERE run_id = ? AND org_id = ?`, runID, orgID)
	if err := oneRow(res, err); err != nil {
		return fmt.Errorf("store: unpublish %s: %w", runID, err)
	}
	return nil
}

// PublishedRun loads the run published under slug; an unknown slug is
// ErrNotFound.
func (s *Store) PublishedRun(ctx context.Context, slug string) (Run, error) {
	r, err := scanRun(s.read.QueryRowContext(ctx, `SELECT `+runColumns+` FROM runs
		WHERE id = (SELECT run_id FROM published_runs WHERE slug = ?) AND purged_at IS NULL`, slug))
	if errors.Is(err, sql.ErrNoRows) {
		return Run{}, fmt.Errorf("store: published run: %w", ErrNotFound)
	}
	if err != nil {
		return Run{}, fmt.Errorf("store: published run: %w", err)
	}
	return r, nil
}
