// Package storebench fills a database with a history of finished runs, fast,
// so that a benchmark can measure how the daemon behaves as history grows
// (`ephemeral bench store`). The organisation, its member and API key go
// through the store; the runs, their timelines, recordings and ledger
// entries are written with direct SQL in large transactions, as the runs
// service would have left them, because creating 100,000 runs one request
// at a time would take longer than the measurement.
package storebench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/auth"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

// History describes the runs to write.
type History struct {
	Runs int // finished runs, all of one organisation
	// Expired is how many of them, the oldest, have reached the end of
	// their retention: the janitor's next sweep purges them.
	Expired        int
	EventsPerRun   int // timeline entries per run, at least 4
	RecordingBytes int // size of each run's recording
	Retention      time.Duration
	Now            time.Time
}

// Populated is what a benchmark needs to call the API on the history.
type Populated struct {
	OrgID  string
	APIKey string
	RunIDs []string // oldest first
}

// Money of every populated run: the product page's run.
const (
	reserved = 40_000
	charged  = 3_530
	credit   = 1 << 50 // enough for any benchmark's new runs
)

// runsPerTx is how many runs one transaction writes.
const runsPerTx = 5_000

// Populate creates the database at path (which must not exist) and
// writes h into it. Finished runs are spread over the retention period up
// to an hour before h.Now; runs created in the last day keep their
// idempotency key, older ones have had it forgotten, as the janitor does.
func Populate(ctx context.Context, path string, h History) (Populated, error) {
	if h.Expired > h.Runs || h.EventsPerRun < 4 || h.Retention <= 0 {
		return Populated{}, fmt.Errorf("storebench: bad history %+v", h)
	}
	p, err := createOrg(ctx, path)
	if err != nil {
		return Populated{}, err
	}
	// A connection of its own, without a journal while it fills the file:
	// the benchmark starts from the daemon's WAL mode again.
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(OFF)&_pragma=synchronous(OFF)&_pragma=cache_size(-65536)")
	if err != nil {
		return Populated{}, fmt.Errorf("storebench: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	defer db.Close()
	w := newWriter(h, p.OrgID)
	for first := 0; first < h.Runs; first += runsPerTx {
		ids, err := w.writeRuns(ctx, db, first, min(h.Runs, first+runsPerTx))
		if err != nil {
			return Populated{}, err
		}
		p.RunIDs = append(p.RunIDs, ids...)
	}
	if err := w.settle(ctx, db); err != nil {
		return Populated{}, err
	}
	if _, err := db.ExecContext(ctx, `PRAGMA journal_mode = WAL`); err != nil {
		return Populated{}, fmt.Errorf("storebench: back to WAL: %w", err)
	}
	// A history that had been there a while is on disk, not in dirty page
	// cache that the daemon's first fsync would have to write out.
	return p, syncFile(path)
}

// createOrg makes the database with the store (schema, organisation,
// member, key, credit).
func createOrg(ctx context.Context, path string) (Populated, error) {
	st, err := store.Open(ctx, path)
	if err != nil {
		return Populated{}, err
	}
	defer st.Close()
	org, err := st.CreateOrg(ctx, "busy")
	if err != nil {
		return Populated{}, err
	}
	m, err := st.AddMember(ctx, org.ID, "dev@busy.example")
	if err != nil {
		return Populated{}, err
	}
	k := auth.NewKey()
	if err := st.AddKey(ctx, m, k.ID, k.Hash); err != nil {
		return Populated{}, err
	}
	if _, err := st.Credit(ctx, org.ID, credit); err != nil {
		return Populated{}, err
	}
	return Populated{OrgID: org.ID, APIKey: k.Secret}, nil
}

// writer writes runs with the same content, apart from their ids and times.
type writer struct {
	h         History
	orgID     string
	exchanges []string // one recorded model turn per entry
	request   string
	span      time.Duration // from the oldest run's creation to the newest's
}

func newWriter(h History, orgID string) *writer {
	prompt := "This is a sandbox test. Do these steps with the shell and report the real output, never what you expect."
	// Recordings are stored a turn per row, each holding what the turn
	// added (see package recording); a few KB each, as a run with some
	// command output makes.
	turn := `{"turn":1,"kept_messages":1,"messages":[{"role":"tool","text":"` + strings.Repeat("primes 2 3 5 7 11 13 ", 200) +
		`"}],"response":{"text":"` + prompt + `"}}`
	var exchanges []string
	for size := 0; size < h.RecordingBytes; size += len(turn) {
		exchanges = append(exchanges, turn)
	}
	return &writer{
		h: h, orgID: orgID,
		exchanges: exchanges,
		request:   `{"prompt":"` + prompt + `","shell":true,"web":false,"timeout_seconds":120,"max_cost_micros":40000}`,
		span:      h.Retention - time.Hour,
	}
}

// times places run i: creation spread evenly over the span ending an hour
// before now; the retention of the first h.Expired ended before now, that
// of the others ends a day or more after it, however long the benchmark
// takes.
func (w *writer) times(i int) (created, finished, retentionUntil time.Time) {
	step := w.span / time.Duration(max(w.h.Runs, 1))
	created = w.h.Now.Add(-time.Hour - w.span + time.Duration(i)*step)
	finished = created.Add(16 * time.Second)
	retentionUntil = w.h.Now.Add(-time.Duration(w.h.Expired-i) * step)
	if i >= w.h.Expired {
		retentionUntil = w.h.Now.Add(24*time.Hour + time.Duration(i-w.h.Expired)*step)
	}
	return created, finished, retentionUntil
}

// event is one timeline entry of a populated run.
type event struct {
	category, message, data string
	content                 bool
}

// events is a run's timeline as the product page shows it, with as many
// shell commands as it takes to reach n entries.
func events(n int) []event {
	head := []event{
		{timeline.Queued, timeline.Reserved(reserved), `{"reserved_micros":40000}`, false},
		{timeline.MicroVM, timeline.MicroVMReady, "", false},
		{timeline.MicroVM, timeline.WorkerStarted(true, false), "", false},
	}
	tail := []event{
		{timeline.MicroVM, timeline.MicroVMDestroyed, "", false},
		{timeline.Successful, timeline.ModelSummary(3, 5214), `{"status":"succeeded","model_calls":3,"tokens":5214}`, false},
		{timeline.WorkerDestroyed, timeline.Settled(charged, reserved-charged), `{"charged_micros":3530,"released_micros":36470}`, false},
	}
	var out []event
	out = append(out, head[:min(len(head), n-1)]...)
	for len(out) < n-len(tail) {
		out = append(out, event{timeline.Shell, timeline.Command("python3 primes.py"),
			`{"state":"done","exit_code":0,"duration_ms":230,"output":"2 3 5 7 11 13 17 19 23 29 31 37 41 43 47\n"}`, true})
	}
	return append(out, tail[len(tail)-(n-len(out)):]...)
}

// writeRuns writes runs [from, to) in one transaction and returns their ids.
func (w *writer) writeRuns(ctx context.Context, db *sql.DB, from, to int) (_ []string, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("storebench: begin: %w", err)
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	var insertRun, insertEvent, insertRecording, insertLedgerEntry *sql.Stmt
	for stmt, q := range map[**sql.Stmt]string{
		&insertRun: `INSERT INTO runs (id, org_id, idempotency_key, request_hash, request, model, zero_retention, timeout_seconds,
			status, created_at, started_at, finished_at, reserved, charged, released, model_micros, compute_micros, model_calls,
			input_tokens, output_tokens, shell_commands, vm_millis, output, retention_until)
			VALUES (?, ?, ?, ?, ?, 'openai/gpt-6-luna', 0, 120, 'succeeded', ?, ?, ?, ?, ?, ?, 330, 3200, 3, 4800, 414, 4, 13333, ?, ?)`,
		&insertEvent:       `INSERT INTO events (run_id, seq, rev, t_millis, category, message, data, content) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		&insertRecording:   `INSERT INTO recording_exchanges (run_id, turn, data) VALUES (?, ?, ?)`,
		&insertLedgerEntry: `INSERT INTO ledger_entries (org_id, run_id, kind, micros, created_at) VALUES (?, ?, ?, ?, ?)`,
	} {
		if *stmt, err = tx.PrepareContext(ctx, q); err != nil {
			return nil, fmt.Errorf("storebench: prepare: %w", err)
		}
	}
	// Committing or rolling back the transaction closes its statements.
	entries := events(w.h.EventsPerRun)
	dayAgo := w.h.Now.Add(-24 * time.Hour)
	var ids []string
	for i := from; i < to; i++ {
		id := fmt.Sprintf("run_%032x", i)
		created, finished, until := w.times(i)
		var key any
		if created.After(dayAgo) {
			key = fmt.Sprintf("bench-%d", i)
		}
		_, err := insertRun.ExecContext(ctx, id, w.orgID, key, []byte(id), w.request, created.UnixMilli(), created.UnixMilli()+2420,
			finished.UnixMilli(), reserved, charged, reserved-charged, "2 3 5 7 11 13 17 19 23 29 31 37 41 43 47", until.UnixMilli())
		if err != nil {
			return nil, fmt.Errorf("storebench: insert run %d: %w", i, err)
		}
		for seq, e := range entries {
			var data any
			if e.data != "" {
				data = e.data
			}
			if _, err := insertEvent.ExecContext(ctx, id, seq+1, seq+1, seq*1300, e.category, e.message, data, e.content); err != nil {
				return nil, fmt.Errorf("storebench: insert event of run %d: %w", i, err)
			}
		}
		for turn, data := range w.exchanges {
			if _, err := insertRecording.ExecContext(ctx, id, turn+1, data); err != nil {
				return nil, fmt.Errorf("storebench: insert recording of run %d: %w", i, err)
			}
		}
		for _, e := range []struct {
			kind   string
			micros int64
			at     time.Time
		}{{"hold", reserved, created}, {"charge", charged, finished}, {"release", reserved - charged, finished}} {
			if _, err := insertLedgerEntry.ExecContext(ctx, w.orgID, id, e.kind, e.micros, e.at.UnixMilli()); err != nil {
				return nil, fmt.Errorf("storebench: insert ledger entry of run %d: %w", i, err)
			}
		}
		ids = append(ids, id)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("storebench: commit: %w", err)
	}
	return ids, nil
}

// settle books the runs' charges to the account and the finished-run
// totals, as FinishRun does run by run.
func (w *writer) settle(ctx context.Context, db *sql.DB) error {
	total := int64(w.h.Runs) * charged
	res, err := db.ExecContext(ctx, `UPDATE accounts SET available = available - ?1, charged = charged + ?1 WHERE org_id = ?2`,
		total, w.orgID)
	if err != nil {
		return fmt.Errorf("storebench: charge the account: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return errors.Join(errors.New("storebench: the organisation has no account"), err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO finished_run_totals (status, runs, charged_micros) VALUES ('succeeded', ?, ?)`,
		w.h.Runs, total); err != nil {
		return fmt.Errorf("storebench: count the runs: %w", err)
	}
	return nil
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("storebench: %w", err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("storebench: sync %s: %w", path, err)
	}
	return nil
}
