package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// WebhookState is where a run's webhook delivery stands.
type WebhookState string

// The states of a delivery: waiting for its run to end, pending (due at
// NextAttemptAt), and the two ends.
const (
	WebhookWaiting   WebhookState = "waiting"
	WebhookPending   WebhookState = "pending"
	WebhookDelivered WebhookState = "delivered"
	WebhookFailed    WebhookState = "failed"
)

// WebhookDelivery is the outbox row of a run that named a webhook_url.
type WebhookDelivery struct {
	RunID string
	OrgID string
	// RunCreatedAt places the outcome on the run's timeline.
	RunCreatedAt time.Time
	// URL is empty once the delivery has ended.
	URL           string
	State         WebhookState
	Attempts      int
	NextAttemptAt *time.Time
}

// WebhookAttempt is one POST of a delivery: the status the receiver
// answered (0 when none came) or why it failed.
type WebhookAttempt struct {
	Attempt    int
	StartedAt  time.Time
	Duration   time.Duration
	StatusCode int
	Error      string
}

// WebhookOutcome is what an attempt leads to: another attempt at
// RetryAt, or the end in State (delivered or failed) with an entry for
// the run's timeline.
type WebhookOutcome struct {
	RetryAt *time.Time
	State   WebhookState
	Event   *Event
}

// SetWebhookSecret stores (or replaces) an organisation's sealed webhook
// secret.
func (s *Store) SetWebhookSecret(ctx context.Context, orgID string, sealed []byte, at time.Time) error {
	_, err := s.write.ExecContext(ctx, `INSERT INTO webhook_secrets (org_id, sealed, created_at) VALUES (?, ?, ?)
		ON CONFLICT (org_id) DO UPDATE SET sealed = excluded.sealed, created_at = excluded.created_at`, orgID, sealed, millis(at))
	if err != nil {
		return fmt.Errorf("store: set webhook secret of %s: %w", orgID, err)
	}
	return nil
}

// WebhookSecret returns an organisation's sealed webhook secret and when
// it was made; ErrNotFound when it has none yet.
func (s *Store) WebhookSecret(ctx context.Context, orgID string) (sealed []byte, createdAt time.Time, err error) {
	var at int64
	err = s.read.QueryRowContext(ctx, `SELECT sealed, created_at FROM webhook_secrets WHERE org_id = ?`, orgID).Scan(&sealed, &at)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, time.Time{}, fmt.Errorf("store: webhook secret of %s: %w", orgID, ErrNotFound)
	}
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("store: webhook secret of %s: %w", orgID, err)
	}
	return sealed, time.UnixMilli(at).UTC(), nil
}

// insertWebhook queues a new run's delivery, to wait for the run's end.
func insertWebhook(ctx context.Context, tx *sql.Tx, runID, orgID, url string) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO webhook_deliveries (run_id, org_id, url, state) VALUES (?, ?, ?, 'waiting')`,
		runID, orgID, url); err != nil {
		return fmt.Errorf("store: queue webhook of %s: %w", runID, err)
	}
	return nil
}

// webhookDue makes a finished run's delivery due at once, if it has one.
func webhookDue(ctx context.Context, tx *sql.Tx, runID string, at time.Time) error {
	if _, err := tx.ExecContext(ctx, `UPDATE webhook_deliveries SET state = 'pending', next_attempt_at = ?
		WHERE run_id = ? AND state = 'waiting'`, millis(at), runID); err != nil {
		return fmt.Errorf("store: schedule webhook of %s: %w", runID, err)
	}
	return nil
}

// ClaimDueWebhooks returns up to limit pending deliveries whose next
// attempt is due at now, the longest due first, and claims them until
// until: for that long no other caller (another node's deliverer) gets
// them, so each attempt is made once; a deliverer that dies mid-attempt
// leaves the delivery due again when its claim ends.
func (s *Store) ClaimDueWebhooks(ctx context.Context, now, until time.Time, limit int) ([]WebhookDelivery, error) {
	var out []WebhookDelivery
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		out = out[:0]
		// On PostgreSQL, deliveries another node is claiming are skipped,
		// not waited for.
		skipClaimed := ""
		if s.dialect == postgres {
			skipClaimed = " FOR UPDATE OF w SKIP LOCKED"
		}
		rows, err := tx.QueryContext(ctx, `SELECT `+webhookColumns+` FROM webhook_deliveries w
			WHERE next_attempt_at IS NOT NULL AND next_attempt_at <= ? ORDER BY next_attempt_at LIMIT ?`+skipClaimed, millis(now), limit)
		if err != nil {
			return fmt.Errorf("store: due webhooks: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			d, err := scanWebhook(rows)
			if err != nil {
				return fmt.Errorf("store: due webhooks: %w", err)
			}
			out = append(out, d)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("store: due webhooks: %w", err)
		}
		rows.Close()
		for _, d := range out {
			if _, err := tx.ExecContext(ctx, `UPDATE webhook_deliveries SET next_attempt_at = ? WHERE run_id = ?`,
				millis(until), d.RunID); err != nil {
				return fmt.Errorf("store: claim webhook of %s: %w", d.RunID, err)
			}
		}
		return nil
	})
	return out, err
}

// NextWebhookAt is when the next pending delivery is due; ok is false when
// none is pending.
func (s *Store) NextWebhookAt(ctx context.Context) (at time.Time, ok bool, err error) {
	var next sql.NullInt64
	if err := s.read.QueryRowContext(ctx, `SELECT min(next_attempt_at) FROM webhook_deliveries WHERE next_attempt_at IS NOT NULL`).Scan(&next); err != nil {
		return time.Time{}, false, fmt.Errorf("store: next webhook: %w", err)
	}
	if !next.Valid {
		return time.Time{}, false, nil
	}
	return time.UnixMilli(next.Int64).UTC(), true, nil
}

// RecordWebhookAttempt stores an attempt of a pending delivery and what it
// leads to, in one transaction: the next attempt's time, or the end (the
// URL forgotten, the outcome on the run's timeline). A delivery that is no
// longer pending (its run purged meanwhile) is ErrNotFound and nothing is
// stored.
func (s *Store) RecordWebhookAttempt(ctx context.Context, runID string, a WebhookAttempt, o WebhookOutcome) error {
	var statusCode, errText any
	if a.StatusCode != 0 {
		statusCode = a.StatusCode
	}
	if a.Error != "" {
		errText = a.Error
	}
	return s.inTx(ctx, func(tx *sql.Tx) error {
		var res sql.Result
		var err error
		if o.RetryAt != nil {
			res, err = tx.ExecContext(ctx, `UPDATE webhook_deliveries SET attempts = ?, next_attempt_at = ?
				WHERE run_id = ? AND state = 'pending'`, a.Attempt, millis(*o.RetryAt), runID)
		} else {
			res, err = tx.ExecContext(ctx, `UPDATE webhook_deliveries SET attempts = ?, state = ?, next_attempt_at = NULL, url = NULL
				WHERE run_id = ? AND state = 'pending'`, a.Attempt, o.State, runID)
		}
		if err := oneRow(res, err); err != nil {
			return fmt.Errorf("store: webhook attempt %d of %s: %w", a.Attempt, runID, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO webhook_attempts (run_id, attempt, started_at, duration_ms, status_code, error)
			VALUES (?, ?, ?, ?, ?, ?)`, runID, a.Attempt, millis(a.StartedAt), a.Duration.Milliseconds(), statusCode, errText); err != nil {
			return fmt.Errorf("store: webhook attempt %d of %s: %w", a.Attempt, runID, err)
		}
		if o.Event != nil {
			if _, err := s.appendEvent(ctx, tx, runID, *o.Event); err != nil {
				return err
			}
		}
		return nil
	})
}

// Webhook returns a run's delivery and its attempts in order; ErrNotFound
// when the run named no webhook_url or its content was purged.
func (s *Store) Webhook(ctx context.Context, runID string) (WebhookDelivery, []WebhookAttempt, error) {
	tx, err := s.read.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return WebhookDelivery{}, nil, fmt.Errorf("store: webhook of %s: %w", runID, err)
	}
	defer tx.Rollback()
	d, err := scanWebhook(tx.QueryRowContext(ctx, `SELECT `+webhookColumns+` FROM webhook_deliveries w WHERE run_id = ?`, runID))
	if errors.Is(err, sql.ErrNoRows) {
		return d, nil, fmt.Errorf("store: webhook of %s: %w", runID, ErrNotFound)
	}
	if err != nil {
		return d, nil, fmt.Errorf("store: webhook of %s: %w", runID, err)
	}
	rows, err := tx.QueryContext(ctx, `SELECT attempt, started_at, duration_ms, status_code, error FROM webhook_attempts
		WHERE run_id = ? ORDER BY attempt`, runID)
	if err != nil {
		return d, nil, fmt.Errorf("store: webhook attempts of %s: %w", runID, err)
	}
	defer rows.Close()
	var attempts []WebhookAttempt
	for rows.Next() {
		var a WebhookAttempt
		var started, ms int64
		var code sql.NullInt64
		var errText sql.NullString
		if err := rows.Scan(&a.Attempt, &started, &ms, &code, &errText); err != nil {
			return d, nil, fmt.Errorf("store: webhook attempts of %s: %w", runID, err)
		}
		a.StartedAt, a.Duration = time.UnixMilli(started).UTC(), time.Duration(ms)*time.Millisecond
		a.StatusCode, a.Error = int(code.Int64), errText.String
		attempts = append(attempts, a)
	}
	if err := rows.Err(); err != nil {
		return d, nil, fmt.Errorf("store: webhook attempts of %s: %w", runID, err)
	}
	return d, attempts, nil
}

const webhookColumns = `run_id, org_id, (SELECT created_at FROM runs WHERE id = w.run_id), url, state, attempts, next_attempt_at`

func scanWebhook(row scanner) (WebhookDelivery, error) {
	var d WebhookDelivery
	var url sql.NullString
	var created int64
	var next sql.NullInt64
	if err := row.Scan(&d.RunID, &d.OrgID, &created, &url, &d.State, &d.Attempts, &next); err != nil {
		return WebhookDelivery{}, err
	}
	d.RunCreatedAt = time.UnixMilli(created).UTC()
	d.URL, d.NextAttemptAt = url.String, fromMillis(next)
	return d, nil
}
