package store

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
)

// Status is where a run is in its life.
type Status string

// The statuses a run goes through; every run ends in exactly one terminal one.
const (
	Queued         Status = "queued"
	Running        Status = "running"
	Succeeded      Status = "succeeded"
	Failed         Status = "failed"
	TimedOut       Status = "timed_out"
	BudgetExceeded Status = "budget_exceeded"
	Canceled       Status = "canceled"
)

// Statuses lists every status, for metrics.
var Statuses = []Status{Queued, Running, Succeeded, Failed, TimedOut, BudgetExceeded, Canceled}

// Terminal reports whether the run has ended.
func (s Status) Terminal() bool { return s != Queued && s != Running }

var (
	// ErrIdempotencyMismatch means the Idempotency-Key was used before with a
	// different request body.
	ErrIdempotencyMismatch = errors.New("idempotency key reused with a different request")
	// ErrTooManyActive means the organisation already has its maximum of
	// queued and running runs.
	ErrTooManyActive = errors.New("too many active runs")
	// ErrActive means the operation needs a finished run.
	ErrActive = errors.New("run is still active")
)

// Run is a stored run.
type Run struct {
	ID             string
	OrgID          string
	Status         Status
	Request        json.RawMessage // nil under zero data retention and after purge
	Model          string
	ZeroRetention  bool
	TimeoutSeconds int
	CreatedAt      time.Time
	StartedAt      *time.Time
	FinishedAt     *time.Time
	Reserved       int64
	Charged        int64
	Released       int64
	Usage          ledger.Usage
	Cost           ledger.Cost
	Output         *string
	ErrorCode      string
	ErrorMessage   string
	RetentionUntil *time.Time
	PurgedAt       *time.Time
}

// Event is one timeline entry.
type Event struct {
	Seq      int64         // place on the timeline
	Rev      int64         // the run's revision that last appended or amended it
	T        time.Duration // since the run was queued
	Category string
	Message  string
	Data     json.RawMessage
	Content  bool // Message or Data carry user content: removed when the run is purged
}

// NewRun is what CreateRun stores.
type NewRun struct {
	ID             string
	OrgID          string
	IdempotencyKey string // empty: none
	RequestHash    []byte
	Request        json.RawMessage // nil under zero data retention
	Model          string
	ZeroRetention  bool
	TimeoutSeconds int
	Reserve        int64
	CreatedAt      time.Time
	MaxActive      int   // the organisation's cap on queued+running runs
	Queued         Event // the first timeline entry
	// WebhookURL, when set, queues a webhook delivery that FinishRun
	// makes due.
	WebhookURL string
	// Spec, when set, is kept (in run_specs) until the run finishes, for
	// the node that takes the run to read with RunSpec.
	Spec json.RawMessage
	// Enqueue, when set, is called in the transaction that creates the
	// run, after its row: a job queue shared by several nodes enqueues the
	// run's job there, so that a run exists exactly when its job does.
	Enqueue func(ctx context.Context, tx *sql.Tx) error
}

const runColumns = `id, org_id, status, request, model, zero_retention, timeout_seconds, created_at, started_at,
	finished_at, reserved, charged, released, model_micros, web_micros, compute_micros, model_calls, input_tokens,
	output_tokens, web_requests, shell_commands, vm_millis, output, error_code, error_message, retention_until, purged_at`

type scanner interface{ Scan(...any) error }

func scanRun(row scanner) (Run, error) {
	var r Run
	var request, output, errCode, errMsg sql.NullString
	var created, vmMillis int64
	var started, finished, retention, purged sql.NullInt64
	err := row.Scan(&r.ID, &r.OrgID, &r.Status, &request, &r.Model, &r.ZeroRetention, &r.TimeoutSeconds, &created,
		&started, &finished, &r.Reserved, &r.Charged, &r.Released, &r.Cost.Model, &r.Cost.Web, &r.Cost.Compute,
		&r.Usage.ModelCalls, &r.Usage.InputTokens, &r.Usage.OutputTokens, &r.Usage.WebRequests,
		&r.Usage.ShellCommands, &vmMillis, &output, &errCode, &errMsg, &retention, &purged)
	if err != nil {
		return Run{}, err
	}
	if request.Valid {
		r.Request = json.RawMessage(request.String)
	}
	if output.Valid {
		r.Output = &output.String
	}
	r.ErrorCode, r.ErrorMessage = errCode.String, errMsg.String
	r.Usage.ModelMicros = r.Cost.Model
	r.Usage.VMTime = time.Duration(vmMillis) * time.Millisecond
	r.CreatedAt = time.UnixMilli(created).UTC()
	r.StartedAt, r.FinishedAt = fromMillis(started), fromMillis(finished)
	r.RetentionUntil, r.PurgedAt = fromMillis(retention), fromMillis(purged)
	return r, nil
}

// CreateRun stores a queued run and reserves its budget in one transaction.
// With an idempotency key that was seen before it returns the earlier run
// (created false) when the request hash matches and ErrIdempotencyMismatch
// otherwise; it never reserves twice. It fails with ErrTooManyActive at the
// organisation's cap and ledger.ErrInsufficientFunds when the balance
// cannot cover the reservation.
func (s *Store) CreateRun(ctx context.Context, nr NewRun) (run Run, created bool, err error) {
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		if err := s.lockOrg(ctx, tx, nr.OrgID); err != nil {
			return err
		}
		if nr.IdempotencyKey != "" {
			var hash []byte
			var id string
			err := tx.QueryRowContext(ctx, `SELECT id, request_hash FROM runs WHERE org_id = ? AND idempotency_key = ?`,
				nr.OrgID, nr.IdempotencyKey).Scan(&id, &hash)
			switch {
			case err == nil && !bytes.Equal(hash, nr.RequestHash):
				return ErrIdempotencyMismatch
			case err == nil:
				run, err = scanRun(tx.QueryRowContext(ctx, `SELECT `+runColumns+` FROM runs WHERE id = ?`, id))
				return err
			case !errors.Is(err, sql.ErrNoRows):
				return fmt.Errorf("store: look up idempotency key: %w", err)
			}
		}
		// Through runs_org_status: only the organisation's active runs are
		// read, however many it has finished, while every write waits.
		var active int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM runs WHERE org_id = ? AND status IN ('queued', 'running')`,
			nr.OrgID).Scan(&active); err != nil {
			return fmt.Errorf("store: count active runs: %w", err)
		}
		if active >= nr.MaxActive {
			return ErrTooManyActive
		}
		if err := ledger.Reserve(ctx, tx, nr.OrgID, nr.ID, nr.Reserve); err != nil {
			return err
		}
		var key, request any
		if nr.IdempotencyKey != "" {
			key = nr.IdempotencyKey
		}
		if nr.Request != nil {
			request = string(nr.Request)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO runs (id, org_id, idempotency_key, request_hash, request, model,
			zero_retention, timeout_seconds, status, created_at, reserved) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			nr.ID, nr.OrgID, key, nr.RequestHash, request, nr.Model, boolInt(nr.ZeroRetention), nr.TimeoutSeconds, Queued,
			millis(nr.CreatedAt), nr.Reserve)
		if err != nil {
			return fmt.Errorf("store: insert run: %w", err)
		}
		if _, err := s.appendEvent(ctx, tx, nr.ID, nr.Queued); err != nil {
			return err
		}
		if nr.WebhookURL != "" {
			if err := insertWebhook(ctx, tx, nr.ID, nr.OrgID, nr.WebhookURL); err != nil {
				return err
			}
		}
		if nr.Spec != nil {
			if _, err := tx.ExecContext(ctx, `INSERT INTO run_specs (run_id, spec) VALUES (?, ?)`, nr.ID, string(nr.Spec)); err != nil {
				return fmt.Errorf("store: keep spec of %s: %w", nr.ID, err)
			}
		}
		if nr.Enqueue != nil {
			if err := nr.Enqueue(ctx, tx); err != nil {
				return fmt.Errorf("store: enqueue %s: %w", nr.ID, err)
			}
		}
		run, err = scanRun(tx.QueryRowContext(ctx, `SELECT `+runColumns+` FROM runs WHERE id = ?`, nr.ID))
		created = true
		return err
	})
	return run, created, err
}

// GetRun loads one of an organisation's runs; another organisation's run is
// ErrNotFound.
func (s *Store) GetRun(ctx context.Context, orgID, runID string) (Run, error) {
	r, err := scanRun(s.read.QueryRowContext(ctx, `SELECT `+runColumns+` FROM runs WHERE id = ? AND org_id = ?`, runID, orgID))
	if errors.Is(err, sql.ErrNoRows) {
		return Run{}, fmt.Errorf("store: run %s: %w", runID, ErrNotFound)
	}
	if err != nil {
		return Run{}, fmt.Errorf("store: run %s: %w", runID, err)
	}
	return r, nil
}

// ListRuns returns up to limit of an organisation's runs, newest first,
// starting after the run startingAfter (empty: from the newest), and whether
// more follow.
func (s *Store) ListRuns(ctx context.Context, orgID, startingAfter string, limit int) ([]Run, bool, error) {
	return s.ListRunsWithStatus(ctx, orgID, "", startingAfter, limit)
}

// ListRunsWithStatus is ListRuns limited to the runs in one status; an
// empty status lists every run. The cursor may name a run in any status.
// Each page is read from an index in order (runs_org_seq, or
// runs_org_status whose entries end with seq, the rowid), so it reads about
// limit rows however many runs the organisation has in other statuses.
func (s *Store) ListRunsWithStatus(ctx context.Context, orgID string, status Status, startingAfter string, limit int) ([]Run, bool, error) {
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
	query := `SELECT ` + runColumns + ` FROM runs WHERE org_id = ? AND seq < ? ORDER BY seq DESC LIMIT ?`
	args := []any{orgID, before, limit + 1}
	if status != "" {
		query = `SELECT ` + runColumns + ` FROM runs WHERE org_id = ? AND status = ? AND seq < ? ORDER BY seq DESC LIMIT ?`
		args = []any{orgID, status, before, limit + 1}
	}
	rows, err := s.read.QueryContext(ctx, query, args...)
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

// MarkRunning moves a queued run to running on node nodeID (empty: the
// one daemon of an SQLite database); it reports false when the run is no
// longer queued (canceled meanwhile, or taken by another node). This one
// conditional UPDATE is what makes a run execute at most once, however
// often its job is delivered.
func (s *Store) MarkRunning(ctx context.Context, runID, nodeID string, at time.Time) (bool, error) {
	var node any
	if nodeID != "" {
		node = nodeID
	}
	res, err := s.write.ExecContext(ctx, `UPDATE runs SET status = 'running', started_at = ?, node_id = ? WHERE id = ? AND status = 'queued'`,
		millis(at), node, runID)
	if err := oneRow(res, err); errors.Is(err, ErrNotFound) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("store: mark %s running: %w", runID, err)
	}
	return true, nil
}

// RecordUsage persists a running run's metered usage so that a crash cannot
// lose what it spent.
func (s *Store) RecordUsage(ctx context.Context, runID string, u ledger.Usage, c ledger.Cost) error {
	_, err := s.write.ExecContext(ctx, `UPDATE runs SET model_micros = ?, web_micros = ?, compute_micros = ?,
		model_calls = ?, input_tokens = ?, output_tokens = ?, web_requests = ?, shell_commands = ?, vm_millis = ?
		WHERE id = ?`, c.Model, c.Web, c.Compute, u.ModelCalls, u.InputTokens, u.OutputTokens, u.WebRequests,
		u.ShellCommands, u.VMTime.Milliseconds(), runID)
	if err != nil {
		return fmt.Errorf("store: record usage of %s: %w", runID, err)
	}
	return nil
}

// Finish is how a run ended.
type Finish struct {
	Status         Status
	Output         *string
	ErrorCode      string
	ErrorMessage   string
	Usage          ledger.Usage
	Cost           ledger.Cost
	At             time.Time
	RetentionUntil time.Time
	// Amend replaces the data of some of the run's timeline entries, in
	// order and before the final events are appended: how recovery closes
	// the entries of commands a dead daemon left open.
	Amend []Amendment
	// Expect, when set, finishes the run only in that state; otherwise
	// FinishRun changes nothing and returns ErrNotFound.
	Expect Expect
}

// Expect is what must still hold of a run for another node to finish it:
// its status, and that its node is one that stopped heartbeating. The
// check is in FinishRun's transaction, so it cannot race a node that
// takes the run or comes back.
type Expect struct {
	Status Status // "": queued or running
	// HeartbeatBefore, when set, requires the run's node to have last
	// beaten before it.
	HeartbeatBefore time.Time
}

// Amendment is new data for the run's timeline entry Seq.
type Amendment struct {
	Seq  int64
	Data json.RawMessage
}

// FinishRun ends an active run: it settles the hold (charging f.Cost, capped
// at the reservation), stores the outcome, amends the entries f.Amend names,
// appends the events built from the settled amounts and makes the run's
// webhook delivery due, if it has one, all in one transaction. Finishing a run that already
// ended returns ErrNotFound-wrapped error and changes nothing.
func (s *Store) FinishRun(ctx context.Context, runID string, f Finish, events func(charged, released int64) []Event) (Run, error) {
	var run Run
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if err := s.lockRun(ctx, tx, runID); err != nil {
			return err
		}
		query, args := `SELECT `+runColumns+` FROM runs WHERE id = ? AND status IN ('queued', 'running')`, []any{runID}
		if f.Expect.Status != "" {
			query, args = query+` AND status = ?`, append(args, f.Expect.Status)
		}
		if !f.Expect.HeartbeatBefore.IsZero() {
			query, args = query+` AND node_id IN (SELECT id FROM nodes WHERE heartbeat_at < ?)`, append(args, millis(f.Expect.HeartbeatBefore))
		}
		r, err := scanRun(tx.QueryRowContext(ctx, query, args...))
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("store: finish %s: no active run: %w", runID, ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("store: finish %s: %w", runID, err)
		}
		charged, released, err := ledger.Settle(ctx, tx, r.OrgID, runID, r.Reserved, f.Cost.Total())
		if err != nil {
			return err
		}
		if charged != f.Cost.Total() {
			return fmt.Errorf("store: finish %s: cost %d exceeds reservation %d", runID, f.Cost.Total(), r.Reserved)
		}
		var output, errCode, errMsg any
		if f.Output != nil {
			output = *f.Output
		}
		if f.ErrorCode != "" {
			errCode, errMsg = f.ErrorCode, f.ErrorMessage
		}
		u, c := f.Usage, f.Cost
		_, err = tx.ExecContext(ctx, `UPDATE runs SET status = ?, finished_at = ?, charged = ?, released = ?,
			model_micros = ?, web_micros = ?, compute_micros = ?, model_calls = ?, input_tokens = ?, output_tokens = ?,
			web_requests = ?, shell_commands = ?, vm_millis = ?, output = ?, error_code = ?, error_message = ?,
			retention_until = ? WHERE id = ?`,
			f.Status, millis(f.At), charged, released, c.Model, c.Web, c.Compute, u.ModelCalls, u.InputTokens,
			u.OutputTokens, u.WebRequests, u.ShellCommands, u.VMTime.Milliseconds(), output, errCode, errMsg,
			millis(f.RetentionUntil), runID)
		if err != nil {
			return fmt.Errorf("store: finish %s: %w", runID, err)
		}
		for _, a := range f.Amend {
			if _, err := s.amendEvent(ctx, tx, runID, a.Seq, a.Data, false); err != nil {
				return err
			}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO finished_run_totals (status, runs, charged_micros) VALUES (?, 1, ?)
			ON CONFLICT (status) DO UPDATE SET runs = finished_run_totals.runs + 1,
			charged_micros = finished_run_totals.charged_micros + excluded.charged_micros`, f.Status, charged); err != nil {
			return fmt.Errorf("store: finish %s: count it: %w", runID, err)
		}
		for _, e := range events(charged, released) {
			if _, err := s.appendEvent(ctx, tx, runID, e); err != nil {
				return err
			}
		}
		if err := webhookDue(ctx, tx, runID, f.At); err != nil {
			return err
		}
		// The spec held the prompt and files for the node that would take
		// the run: not kept past its end, whatever the retention.
		if _, err := tx.ExecContext(ctx, `DELETE FROM run_specs WHERE run_id = ?`, runID); err != nil {
			return fmt.Errorf("store: finish %s: drop its spec: %w", runID, err)
		}
		run, err = scanRun(tx.QueryRowContext(ctx, `SELECT `+runColumns+` FROM runs WHERE id = ?`, runID))
		return err
	})
	return run, err
}

// ActiveRuns lists every queued or running run: after a restart these are
// the runs a dead daemon left behind.
func (s *Store) ActiveRuns(ctx context.Context) ([]Run, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT `+runColumns+` FROM runs WHERE status IN ('queued', 'running') ORDER BY seq`)
	if err != nil {
		return nil, fmt.Errorf("store: active runs: %w", err)
	}
	defer rows.Close()
	var runs []Run
	for rows.Next() {
		r, err := scanRun(rows)
		if err != nil {
			return nil, fmt.Errorf("store: active runs: %w", err)
		}
		runs = append(runs, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: active runs: %w", err)
	}
	return runs, nil
}

// PurgeRun removes a finished run's content (request, output, error text,
// content events, recording, output files, webhook delivery), keeping its
// metering and the ledger intact.
func (s *Store) PurgeRun(ctx context.Context, orgID, runID string, at time.Time) (Run, error) {
	var run Run
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if err := s.lockRun(ctx, tx, runID); err != nil {
			return err
		}
		r, err := scanRun(tx.QueryRowContext(ctx, `SELECT `+runColumns+` FROM runs WHERE id = ? AND org_id = ?`, runID, orgID))
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("store: purge %s: %w", runID, ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("store: purge %s: %w", runID, err)
		}
		if !r.Status.Terminal() {
			return fmt.Errorf("store: purge %s: %w", runID, ErrActive)
		}
		if err := purge(ctx, tx, runID, at); err != nil {
			return err
		}
		run, err = scanRun(tx.QueryRowContext(ctx, `SELECT `+runColumns+` FROM runs WHERE id = ?`, runID))
		return err
	})
	return run, err
}

// PurgedContent replaces content in purged events.
const PurgedContent = "[purged]"

func purge(ctx context.Context, tx *sql.Tx, runID string, at time.Time) error {
	if _, err := tx.ExecContext(ctx, `UPDATE runs SET request = NULL, output = NULL,
		error_message = CASE WHEN error_message IS NULL THEN NULL ELSE ? END,
		purged_at = coalesce(purged_at, ?) WHERE id = ?`, PurgedContent, millis(at), runID); err != nil {
		return fmt.Errorf("store: purge %s: %w", runID, err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE events SET message = ?, data = NULL WHERE run_id = ? AND content = 1`,
		PurgedContent, runID); err != nil {
		return fmt.Errorf("store: purge events of %s: %w", runID, err)
	}
	// A webhook still pending is dropped with the rest: its URL is content.
	for _, table := range []string{"recordings", "recording_exchanges", "recording_truncations", "run_outputs",
		"webhook_deliveries", "webhook_attempts"} {
		if _, err := tx.ExecContext(ctx, `DELETE FROM `+table+` WHERE run_id = ?`, runID); err != nil {
			return fmt.Errorf("store: purge %s of %s: %w", table, runID, err)
		}
	}
	// A published replay of a purged run would show nothing: its link ends.
	if _, err := tx.ExecContext(ctx, `DELETE FROM published_runs WHERE run_id = ?`, runID); err != nil {
		return fmt.Errorf("store: unpublish %s: %w", runID, err)
	}
	return nil
}

// The janitor finds its work with reads, which wait for no one, and does
// it in batches, each its own short write transaction (a few
// milliseconds) followed by a rest as long (afterJanitorStep), so that a
// write arriving meanwhile (SQLite has one writer) waits for one batch at
// most, not for the whole sweep; a sweep with nothing to do takes the
// write lock not at all.
const (
	purgeBatch  = 25  // runs purged per transaction
	forgetBatch = 200 // idempotency keys forgotten per transaction
)

// PurgeExpired purges every finished run whose retention ended before now
// and forgets idempotency keys older than keyTTL. It returns how many runs
// were purged; ReclaimSpace then gives the freed pages back.
func (s *Store) PurgeExpired(ctx context.Context, now time.Time, keyTTL time.Duration) (int, error) {
	purged, err := s.purgeExpiredRuns(ctx, now)
	if err != nil {
		return purged, err
	}
	return purged, s.forgetIdempotencyKeys(ctx, now.Add(-keyTTL))
}

func (s *Store) purgeExpiredRuns(ctx context.Context, now time.Time) (int, error) {
	purged := 0
	for {
		ids, err := s.expiredRuns(ctx, now)
		if err != nil || len(ids) == 0 {
			return purged, err
		}
		// A run purged meanwhile (DELETE) is purged again: purge changes
		// nothing more.
		began := time.Now()
		err = s.inTx(ctx, func(tx *sql.Tx) error {
			for _, id := range ids {
				if err := purge(ctx, tx, id, now); err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil {
			err = s.afterJanitorStep(ctx, began)
		}
		if err != nil {
			return purged, err
		}
		purged += len(ids)
	}
}

// expiredRuns returns up to purgeBatch runs whose content is due for purging.
func (s *Store) expiredRuns(ctx context.Context, now time.Time) ([]string, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT id FROM runs WHERE purged_at IS NULL AND retention_until <= ? LIMIT ?`,
		millis(now), purgeBatch)
	if err != nil {
		return nil, fmt.Errorf("store: expired runs: %w", err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("store: expired runs: %w", err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: expired runs: %w", err)
	}
	return ids, nil
}

// forgetIdempotencyKeys forgets the idempotency keys of runs created at
// or before cutoff: a retry with such a key creates a new run.
func (s *Store) forgetIdempotencyKeys(ctx context.Context, cutoff time.Time) error {
	for {
		var due bool
		if err := s.read.QueryRowContext(ctx, `SELECT EXISTS (
			SELECT 1 FROM runs WHERE idempotency_key IS NOT NULL AND created_at <= ?)`, millis(cutoff)).Scan(&due); err != nil {
			return fmt.Errorf("store: old idempotency keys: %w", err)
		}
		if !due {
			return nil
		}
		began := time.Now()
		_, err := s.write.ExecContext(ctx, `UPDATE runs SET idempotency_key = NULL WHERE seq IN (
			SELECT seq FROM runs WHERE idempotency_key IS NOT NULL AND created_at <= ? LIMIT ?)`, millis(cutoff), forgetBatch)
		if err != nil {
			return fmt.Errorf("store: forget idempotency keys: %w", err)
		}
		if err := s.afterJanitorStep(ctx, began); err != nil {
			return err
		}
	}
}

// Totals are daemon-wide figures for metrics.
type Totals struct {
	RunsByStatus map[Status]int64
	Held         int64 // reserved for queued and running runs
	Charged      int64 // charged for finished runs
}

// Totals counts runs by status and the money held and charged. Active runs
// are counted through the status index (they are few); finished runs come
// from the totals FinishRun keeps, so the cost does not grow with history.
// Every hold is an active run's reservation until FinishRun settles it, so
// the reservations of active runs are the money held.
func (s *Store) Totals(ctx context.Context) (Totals, error) {
	t := Totals{RunsByStatus: map[Status]int64{}}
	// One read transaction: both halves from the same snapshot.
	tx, err := s.read.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return t, fmt.Errorf("store: totals: %w", err)
	}
	defer tx.Rollback()
	err = scanTotals(ctx, tx, `SELECT status, count(*), coalesce(sum(reserved), 0) FROM runs
		WHERE status IN ('queued', 'running') GROUP BY status`, t.RunsByStatus, &t.Held)
	if err != nil {
		return t, fmt.Errorf("store: count active runs: %w", err)
	}
	err = scanTotals(ctx, tx, `SELECT status, runs, charged_micros FROM finished_run_totals`, t.RunsByStatus, &t.Charged)
	if err != nil {
		return t, fmt.Errorf("store: read finished run totals: %w", err)
	}
	return t, nil
}

// scanTotals reads rows of (status, runs, micros) into byStatus and sums
// the micros into sum.
func scanTotals(ctx context.Context, tx *sql.Tx, query string, byStatus map[Status]int64, sum *int64) error {
	rows, err := tx.QueryContext(ctx, query)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var st Status
		var n, micros int64
		if err := rows.Scan(&st, &n, &micros); err != nil {
			return err
		}
		byStatus[st] += n
		*sum += micros
	}
	return rows.Err()
}
