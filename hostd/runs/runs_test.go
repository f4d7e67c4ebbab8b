package runs

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

func openStore(t *testing.T) (*store.Store, string) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "ephemeral.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	o, err := st.CreateOrg(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Credit(ctx, o.ID, 1_000_000); err != nil {
		t.Fatal(err)
	}
	return st, o.ID
}

func queue(t *testing.T, st *store.Store, orgID, key string) store.Run {
	t.Helper()
	id := NewRunID()
	run, created, err := st.CreateRun(context.Background(), store.NewRun{
		ID: id, OrgID: orgID, IdempotencyKey: key, RequestHash: []byte(id), Request: []byte(`{"prompt":"secret plan"}`),
		Model: "m", TimeoutSeconds: 120, Reserve: 40000, CreatedAt: time.Now(), MaxActive: 10,
		Queued: store.Event{Category: timeline.Queued, Message: timeline.Reserved(40000)},
	})
	if err != nil || !created {
		t.Fatalf("create run: %v (created %v)", err, created)
	}
	return run
}

// TestRecoverSettlesRunsLeftActive plays a daemon that died with one run
// queued and one running: the next daemon's Recover must fail both, charge
// what was metered, release the rest and hand the ids to Reconcile.
func TestRecoverSettlesRunsLeftActive(t *testing.T) {
	ctx := context.Background()
	st, orgID := openStore(t)
	queued := queue(t, st, orgID, "")
	running := queue(t, st, orgID, "")
	finished := queue(t, st, orgID, "")
	if ok, err := st.MarkRunning(ctx, running.ID, "", time.Now()); !ok || err != nil {
		t.Fatalf("mark running: %v %v", ok, err)
	}
	usage := ledger.Usage{ModelCalls: 2, InputTokens: 3000, ModelMicros: 700, VMTime: 4 * time.Second}
	if err := st.RecordUsage(ctx, running.ID, usage, ledger.DefaultRates.Price(usage)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.FinishRun(ctx, finished.ID, store.Finish{Status: store.Succeeded, At: time.Now(), RetentionUntil: time.Now()},
		func(int64, int64) []store.Event { return nil }); err != nil {
		t.Fatal(err)
	}

	var reconciled []string
	svc := New(st, timeline.NewHub(), Config{Rates: ledger.DefaultRates,
		Executor: executorFunc(func(ctx context.Context, spec Spec, rec *Recorder) (Result, error) {
			t.Error("recovery executed a run")
			return Result{}, nil
		}),
		Reconcile: func(ctx context.Context, ids []string) error { reconciled = ids; return nil }})
	ids, err := svc.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{queued.ID, running.ID}
	if !slices.Equal(ids, want) || !slices.Equal(reconciled, want) {
		t.Fatalf("recovered %v, reconciled %v, want %v", ids, reconciled, want)
	}
	r, err := st.GetRun(ctx, orgID, running.ID)
	if err != nil {
		t.Fatal(err)
	}
	metered := int64(700 + 4*240)
	if r.Status != store.Failed || r.ErrorCode != "daemon_restarted" || r.Charged != metered || r.Released != 40000-metered ||
		r.Usage.ModelCalls != 2 {
		t.Fatalf("running run after recovery: %+v", r)
	}
	q, _ := st.GetRun(ctx, orgID, queued.ID)
	if q.Status != store.Failed || q.Charged != 0 || q.Released != 40000 {
		t.Fatalf("queued run after recovery: %+v", q)
	}
	a, err := st.Balance(ctx, orgID)
	if err != nil {
		t.Fatal(err)
	}
	if a.Held != 0 || a.Charged != metered || a.Available+a.Held+a.Charged != a.Credited {
		t.Fatalf("account %+v", a)
	}
	// Recovering again finds nothing: holds are never settled twice.
	if again, err := svc.Recover(ctx); err != nil || len(again) != 0 {
		t.Fatalf("second recover: %v %v", again, err)
	}
}

// A daemon killed mid-command leaves the command's entry "running"; the
// next daemon's Recover closes it as interrupted, keeping what it said,
// together with the run's end, so the timeline shows no command running
// in a run that ended.
func TestRecoverClosesCommandsLeftRunning(t *testing.T) {
	ctx := context.Background()
	st, orgID := openStore(t)
	run := queue(t, st, orgID, "")
	if ok, err := st.MarkRunning(ctx, run.ID, "", time.Now()); !ok || err != nil {
		t.Fatalf("mark running: %v %v", ok, err)
	}
	appendEvent := func(e store.Event) store.Event {
		t.Helper()
		e, err := st.AppendEvent(ctx, run.ID, e)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	appendEvent(store.Event{Category: timeline.MicroVM, Message: timeline.MicroVMReady})
	done := appendEvent(store.Event{Category: timeline.Shell, Message: "$ true", Content: true,
		Data: []byte(`{"command":"true","state":"running"}`)})
	if _, err := st.AmendEventData(ctx, run.ID, done.Seq, []byte(`{"command":"true","state":"done","exit_code":0,"duration_ms":3}`), true); err != nil {
		t.Fatal(err)
	}
	sleeping := appendEvent(store.Event{Category: timeline.Shell, Message: "$ sleep 600", Content: true,
		Data: []byte(`{"command":"sleep 600","state":"running"}`)})
	// Under zero data retention only the state is kept.
	withheld := appendEvent(store.Event{Category: timeline.Shell, Message: Withheld, Content: true,
		Data: []byte(`{"state":"running"}`)})
	before, err := st.Events(ctx, run.ID, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	lastRev := before[len(before)-1].Rev

	svc := New(st, timeline.NewHub(), Config{Rates: ledger.DefaultRates,
		Executor: executorFunc(func(ctx context.Context, spec Spec, rec *Recorder) (Result, error) {
			t.Error("recovery executed a run")
			return Result{}, nil
		})})
	if ids, err := svc.Recover(ctx); err != nil || !slices.Equal(ids, []string{run.ID}) {
		t.Fatalf("recover: %v %v", ids, err)
	}
	after, err := st.Events(ctx, run.ID, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	bySeq := map[int64]store.Event{}
	for _, e := range after {
		bySeq[e.Seq] = e
	}
	type entry struct {
		Command  string         `json:"command"`
		State    timeline.State `json:"state"`
		Error    string         `json:"error"`
		ExitCode *int           `json:"exit_code"`
	}
	read := func(e store.Event) entry {
		t.Helper()
		var d entry
		if err := json.Unmarshal(e.Data, &d); err != nil {
			t.Fatalf("entry %d: %v: %s", e.Seq, err, e.Data)
		}
		return d
	}
	for _, e := range after {
		if e.Data == nil {
			continue
		}
		if d := read(e); d.State == timeline.Running {
			t.Errorf("entry %d %q is still running after recovery: %s", e.Seq, e.Message, e.Data)
		}
	}
	if d := read(bySeq[sleeping.Seq]); d.State != timeline.Interrupted || d.Command != "sleep 600" || !strings.Contains(d.Error, "daemon stopped") ||
		!bySeq[sleeping.Seq].Content || bySeq[sleeping.Seq].Message != "$ sleep 600" {
		t.Errorf("interrupted entry: %+v %s", bySeq[sleeping.Seq], bySeq[sleeping.Seq].Data)
	}
	if d := read(bySeq[withheld.Seq]); d.State != timeline.Interrupted || d.Command != "" {
		t.Errorf("interrupted withheld entry: %s", bySeq[withheld.Seq].Data)
	}
	if d := read(bySeq[done.Seq]); d.State != timeline.Done || d.ExitCode == nil || *d.ExitCode != 0 || bySeq[done.Seq].Rev > lastRev {
		t.Errorf("a finished command's entry was touched: %+v %s", bySeq[done.Seq], bySeq[done.Seq].Data)
	}
	// A live reader that had everything before the restart gets the closed
	// entries, then the run's end.
	since, err := st.EventsSince(ctx, run.ID, lastRev, 100)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range since {
		got = append(got, e.Category+": "+e.Message)
	}
	if want := []string{"Shell: $ sleep 600", "Shell: " + Withheld, "Failed: ", "Worker destroyed: "}; len(got) != len(want) ||
		got[0] != want[0] || got[1] != want[1] || !strings.HasPrefix(got[2], want[2]) || !strings.HasPrefix(got[3], want[3]) {
		t.Fatalf("events since revision %d: %q", lastRev, got)
	}
}

// The amendments of a run's end are made in its transaction: a run that is
// not active is neither finished nor amended.
func TestFinishRunAmendsOnlyWhenItEndsTheRun(t *testing.T) {
	ctx := context.Background()
	st, orgID := openStore(t)
	run := queue(t, st, orgID, "")
	open, err := st.AppendEvent(ctx, run.ID, store.Event{Category: timeline.Shell, Message: "$ sleep 1", Data: []byte(`{"state":"running"}`)})
	if err != nil {
		t.Fatal(err)
	}
	f := store.Finish{Status: store.Failed, At: time.Now(), RetentionUntil: time.Now(),
		Amend: []store.Amendment{{Seq: open.Seq, Data: []byte(`{"state":"interrupted"}`)}}}
	noEvents := func(int64, int64) []store.Event { return nil }
	if _, err := st.FinishRun(ctx, run.ID, f, noEvents); err != nil {
		t.Fatal(err)
	}
	f.Amend[0].Data = []byte(`{"state":"amended twice"}`)
	if _, err := st.FinishRun(ctx, run.ID, f, noEvents); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("finishing an ended run: %v", err)
	}
	events, err := st.Events(ctx, run.ID, open.Seq-1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if string(events[0].Data) != `{"state":"interrupted"}` {
		t.Fatalf("entry after a refused finish: %s", events[0].Data)
	}
}

func TestJanitorPurgesExpiredContentAndForgetsOldKeys(t *testing.T) {
	ctx := context.Background()
	st, orgID := openStore(t)
	run := queue(t, st, orgID, "key-1")
	if _, err := st.AppendEvent(ctx, run.ID, store.Event{Category: timeline.Shell, Message: "$ cat plan.txt", Content: true}); err != nil {
		t.Fatal(err)
	}
	output := "the plan is secret"
	now := time.Now()
	if _, err := st.FinishRun(ctx, run.ID, store.Finish{Status: store.Succeeded, Output: &output, At: now,
		RetentionUntil: now.Add(30 * 24 * time.Hour)}, func(int64, int64) []store.Event { return nil }); err != nil {
		t.Fatal(err)
	}
	// Within retention nothing is purged.
	if n, err := st.PurgeExpired(ctx, now.Add(29*24*time.Hour), 24*time.Hour); err != nil || n != 0 {
		t.Fatalf("purged %d (%v) within retention", n, err)
	}
	if n, err := st.PurgeExpired(ctx, now.Add(31*24*time.Hour), 24*time.Hour); err != nil || n != 1 {
		t.Fatalf("purged %d (%v) after retention", n, err)
	}
	r, err := st.GetRun(ctx, orgID, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r.Output != nil || r.Request != nil || r.PurgedAt == nil || r.Reserved != 40000 {
		t.Fatalf("after purge: %+v", r)
	}
	events, err := st.Events(ctx, run.ID, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if events[0].Message != "Budget $0.04 reserved" || events[1].Message != store.PurgedContent {
		t.Fatalf("events after purge: %+v", events)
	}
	// The idempotency key was forgotten after 24 h: it may start a new run.
	again := queue(t, st, orgID, "key-1")
	if again.ID == run.ID {
		t.Fatal("old idempotency key still returns the old run")
	}
}

func TestServiceSweepUsesConfiguredRetention(t *testing.T) {
	ctx := context.Background()
	st, orgID := openStore(t)
	done := make(chan struct{})
	svc := New(st, timeline.NewHub(), Config{Rates: ledger.DefaultRates, Retention: time.Nanosecond,
		Executor: executorFunc(func(ctx context.Context, spec Spec, rec *Recorder) (Result, error) {
			defer close(done)
			return Result{Output: "kept briefly"}, nil
		})})
	run, _, err := svc.Submit(ctx, Submission{Spec: Spec{OrgID: orgID, Prompt: "p", Model: "m", Timeout: time.Minute,
		MaxCostMicros: 1000}, Canonical: []byte(`{"prompt":"p"}`)})
	if err != nil {
		t.Fatal(err)
	}
	<-done
	// Wait for the run to be settled: a shutdown before that would end it
	// as failed.
	r, err := st.GetRun(ctx, orgID, run.ID)
	for err == nil && !r.Status.Terminal() {
		time.Sleep(5 * time.Millisecond)
		r, err = st.GetRun(ctx, orgID, run.ID)
	}
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != store.Succeeded {
		t.Fatalf("status %s", r.Status)
	}
	// Retention is kept in milliseconds: let the clock pass the run's.
	for !time.Now().After(r.RetentionUntil.Add(time.Millisecond)) {
		time.Sleep(time.Millisecond)
	}
	if _, err := svc.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	r, _ = st.GetRun(ctx, orgID, run.ID)
	if r.PurgedAt == nil || r.Output != nil {
		t.Fatalf("not purged with a 1 ns retention: %+v", r)
	}
}

type executorFunc func(ctx context.Context, spec Spec, rec *Recorder) (Result, error)

func (f executorFunc) Execute(ctx context.Context, spec Spec, rec *Recorder) (Result, error) {
	return f(ctx, spec, rec)
}
