package runs

import (
	"context"
	"path/filepath"
	"slices"
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
	if ok, err := st.MarkRunning(ctx, running.ID, time.Now()); !ok || err != nil {
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
	serveCtx, stop := context.WithCancel(ctx)
	stop()
	svc.Serve(serveCtx, time.Hour) // one sweep, then shutdown waits for the run
	r, err := st.GetRun(ctx, orgID, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != store.Succeeded {
		t.Fatalf("status %s", r.Status)
	}
	// The run may have finished after the sweep; sweep again to be sure.
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
