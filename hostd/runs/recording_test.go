package runs

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/model"
	"github.com/ephemeralhq/ephemeral/hostd/model/recording"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

// waitEnded waits until the run has finished and its money is settled.
func waitEnded(t *testing.T, st *store.Store, hub *timeline.Hub, orgID, runID string) store.Run {
	t.Helper()
	giveUp := time.After(time.Minute)
	for {
		changed := hub.Changed(runID)
		r, err := st.GetRun(context.Background(), orgID, runID)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status.Terminal() {
			return r
		}
		select {
		case <-changed:
		case <-giveUp:
			t.Fatalf("run %s still %s after a minute", runID, r.Status)
		}
	}
}

// A run's recording is stored with it, readable as the document
// recording.Decode reads, kept none of under zero retention, and removed by
// the retention janitor.
func TestRecorderStoresTheRecordingWithTheRun(t *testing.T) {
	ctx := context.Background()
	st, orgID := openStore(t)
	hub := timeline.NewHub()
	exchanges := []recording.Exchange{{
		Turn:      1,
		Request:   model.Request{Model: "m", Messages: []model.Message{{Role: model.RoleUser, Text: "secret plan"}}},
		Response:  &model.Response{Text: "the plan is done", StopReason: model.StopEndTurn},
		StartedAt: time.Date(2026, 11, 30, 4, 0, 0, 0, time.UTC),
		Duration:  time.Second,
	}}
	svc := New(st, hub, Config{Rates: ledger.DefaultRates, Retention: time.Nanosecond,
		Executor: executorFunc(func(ctx context.Context, spec Spec, rec *Recorder) (Result, error) {
			rec.Recording().Record(exchanges[0])
			return Result{Output: "done"}, rec.Recording().Err()
		})})
	t.Cleanup(func() {
		stopped, stop := context.WithCancel(ctx)
		stop()
		svc.Serve(stopped, time.Hour) // waits for the runs' goroutines
	})
	submit := func(zeroRetention bool) store.Run {
		spec := Spec{OrgID: orgID, Prompt: "secret plan", Model: "m", Timeout: time.Minute, MaxCostMicros: 1000,
			ZeroDataRetention: zeroRetention}
		run, _, err := svc.Submit(ctx, Submission{Spec: spec, Canonical: []byte(`{"prompt":"secret plan"}`)})
		if err != nil {
			t.Fatal(err)
		}
		run = waitEnded(t, st, hub, orgID, run.ID)
		if run.Status != store.Succeeded {
			t.Fatalf("run %s: %s %s", run.ID, run.Status, run.ErrorMessage)
		}
		return run
	}

	kept := submit(false)
	doc, err := svc.Recording(ctx, orgID, kept.ID)
	if err != nil {
		t.Fatal(err)
	}
	got, err := recording.Decode(bytes.NewReader(doc))
	if err != nil || len(got.Exchanges) != 1 || got.Exchanges[0].Request.Messages[0].Text != "secret plan" || got.Exchanges[0].Response.Text != "the plan is done" {
		t.Fatalf("stored recording %+v: %v", got, err)
	}

	withheld := submit(true)
	if _, err := svc.Recording(ctx, orgID, withheld.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("zero-retention run's recording: %v", err)
	}

	if _, err := svc.Sweep(ctx); err != nil { // retention of 1 ns: both runs have expired
		t.Fatal(err)
	}
	if _, err := svc.Recording(ctx, orgID, kept.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("recording after the janitor's sweep: %v", err)
	}
}

// Each turn is stored as it completes: a running run's recording already
// holds its turns so far, so a daemon crash would not lose them.
func TestRecordingIsWrittenAsTheRunGoes(t *testing.T) {
	ctx := context.Background()
	st, orgID := openStore(t)
	hub := timeline.NewHub()
	recorded, finish := make(chan struct{}), make(chan struct{})
	svc := New(st, hub, Config{Rates: ledger.DefaultRates,
		Executor: executorFunc(func(ctx context.Context, spec Spec, rec *Recorder) (Result, error) {
			rec.Recording().Record(recording.Exchange{Turn: 1,
				Request:  model.Request{Model: "m", Messages: []model.Message{{Role: model.RoleUser, Text: "first turn"}}},
				Response: &model.Response{ToolCalls: []model.ToolCall{{ID: "c1", Name: "shell", Arguments: "{}"}}, StopReason: model.StopToolUse}})
			close(recorded)
			<-finish
			return Result{Output: "done"}, rec.Recording().Err()
		})})
	t.Cleanup(func() {
		stopped, stop := context.WithCancel(ctx)
		stop()
		svc.Serve(stopped, time.Hour)
	})
	run, _, err := svc.Submit(ctx, Submission{Spec: Spec{OrgID: orgID, Prompt: "p", Model: "m", Timeout: time.Minute, MaxCostMicros: 1000},
		Canonical: []byte(`{"prompt":"p"}`)})
	if err != nil {
		t.Fatal(err)
	}
	<-recorded
	doc, err := svc.Recording(ctx, orgID, run.ID)
	close(finish)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := recording.Decode(bytes.NewReader(doc))
	if err != nil || len(rec.Exchanges) != 1 || rec.Exchanges[0].Request.Messages[0].Text != "first turn" {
		t.Fatalf("recording of the running run: %+v, %v", rec, err)
	}
	if r := waitEnded(t, st, hub, orgID, run.ID); r.Status != store.Succeeded {
		t.Fatalf("run %s: %s", r.Status, r.ErrorMessage)
	}
}
