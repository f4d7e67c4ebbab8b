package runs

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

// A content entry appended at its start and amended at its end keeps its
// place and shows the amended data; under zero retention the amendment
// keeps only what append would have kept.
func TestRecorderAmendsAContentEntryUnderTheRetentionRules(t *testing.T) {
	ctx := context.Background()
	st, orgID := openStore(t)
	hub := timeline.NewHub()
	const canary = "AMEND-OUTPUT-CANARY"
	svc := New(st, hub, Config{Rates: ledger.DefaultRates,
		Executor: executorFunc(func(ctx context.Context, spec Spec, rec *Recorder) (Result, error) {
			seq, err := rec.StartContentEvent(time.Now(), timeline.Shell, timeline.Command("echo "+canary),
				map[string]any{"command": "echo " + canary, "state": timeline.Running})
			if err != nil {
				return Result{}, err
			}
			return Result{Output: "done"}, rec.AmendContentEvent(seq, map[string]any{
				"command": "echo " + canary, "state": timeline.Done, "exit_code": 0, "stdout": canary + "\n"})
		})})
	t.Cleanup(func() {
		stopped, stop := context.WithCancel(ctx)
		stop()
		svc.Serve(stopped, time.Hour)
	})
	shellEvent := func(zeroRetention bool) (store.Event, map[string]any) {
		t.Helper()
		spec := Spec{OrgID: orgID, Prompt: "p", Model: "m", Timeout: time.Minute, MaxCostMicros: 1000, ZeroDataRetention: zeroRetention}
		run, _, err := svc.Submit(ctx, Submission{Spec: spec, Canonical: []byte(`{"prompt":"p"}`)})
		if err != nil {
			t.Fatal(err)
		}
		if run = waitEnded(t, st, hub, orgID, run.ID); run.Status != store.Succeeded {
			t.Fatalf("run %s: %s %s", run.ID, run.Status, run.ErrorMessage)
		}
		events, err := st.Events(ctx, run.ID, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		var shell []store.Event
		for _, e := range events {
			if e.Category == timeline.Shell {
				shell = append(shell, e)
			}
		}
		if len(shell) != 1 || shell[0].Seq != 2 {
			t.Fatalf("shell entries %+v, want one, second on the timeline", shell)
		}
		var data map[string]any
		if err := json.Unmarshal(shell[0].Data, &data); err != nil {
			t.Fatal(err)
		}
		return shell[0], data
	}

	ev, data := shellEvent(false)
	if ev.Message != "$ echo "+canary || data["state"] != "done" || data["stdout"] != canary+"\n" || data["exit_code"] != float64(0) {
		t.Errorf("amended entry %q %v", ev.Message, data)
	}
	ev, data = shellEvent(true)
	if ev.Message != Withheld || strings.Contains(string(ev.Data), canary) || data["state"] != "done" || data["exit_code"] != float64(0) {
		t.Errorf("zero-retention amended entry %q %s", ev.Message, ev.Data)
	}
}
