package runs

import (
	"context"
	"encoding/json"
	"fmt"
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

// A run whose content entries pass the timeline's cap ends as it would
// have: the entries past the cap are not stored, an entry that grows past
// it keeps its numbers but not its output, the system's entries are all
// there, and one entry before the outcome says what was left out.
func TestTimelineCapLeavesOutContentNotTheRun(t *testing.T) {
	ctx := context.Background()
	st, orgID := openStore(t)
	hub := timeline.NewHub()
	const limit = 3000
	big := strings.Repeat("o", 1400)
	svc := New(st, hub, Config{Rates: ledger.DefaultRates, MaxTimelineBytes: limit,
		Executor: executorFunc(func(ctx context.Context, spec Spec, rec *Recorder) (Result, error) {
			if err := rec.Event(timeline.MicroVM, timeline.MicroVMReady, nil); err != nil {
				return Result{}, err
			}
			long, err := rec.StartContentEvent(time.Now(), timeline.Shell, "$ long", map[string]any{"command": "long", "state": timeline.Running})
			if err != nil || long == 0 {
				return Result{}, fmt.Errorf("start under the cap: seq %d, %v", long, err)
			}
			for i := range 3 {
				if err := rec.ContentEvent(timeline.Shell, fmt.Sprint("$ big ", i), map[string]any{"stdout": big}); err != nil {
					return Result{}, err
				}
			}
			if err := rec.AmendContentEvent(long, map[string]any{"command": "long", "state": timeline.Done, "exit_code": 3, "stdout": big}); err != nil {
				return Result{}, err
			}
			late, err := rec.StartContentEvent(time.Now(), timeline.Shell, "$ "+big, map[string]any{"state": timeline.Running})
			if err != nil || late != 0 {
				return Result{}, fmt.Errorf("start past the cap: seq %d, %v", late, err)
			}
			if err := rec.AmendContentEvent(late, map[string]any{"state": timeline.Done, "stdout": "late output"}); err != nil {
				return Result{}, err
			}
			if err := rec.Charge(ledger.Usage{ModelCalls: 1, ModelMicros: 700}); err != nil {
				return Result{}, err
			}
			return Result{Output: "done"}, rec.Event(timeline.MicroVM, timeline.MicroVMDestroyed, nil)
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
	if run = waitEnded(t, st, hub, orgID, run.ID); run.Status != store.Succeeded {
		t.Fatalf("run %s: %s %s", run.ID, run.Status, run.ErrorMessage)
	}
	if run.Charged != 700 || run.Released != 300 {
		t.Errorf("charged %d, released %d; want 700 and 300", run.Charged, run.Released)
	}
	events, err := st.Events(ctx, run.ID, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	var content int
	for _, e := range events {
		got = append(got, e.Category+": "+e.Message)
		if e.Content {
			content += len(e.Category) + len(e.Message) + len(e.Data)
		}
	}
	want := []string{
		"Queued: Budget $0.001 reserved",
		"MicroVM: microVM ready",
		"Shell: $ long",
		"Shell: $ big 0",
		"Shell: $ big 1",
		"MicroVM: microVM destroyed",
		"Timeline: timeline cap of 2.9 KiB reached: 2 entries not stored, 1 cut short",
		"Successful: 1 model call, 0 tokens",
		"Worker destroyed: $0.0007 charged, $0.0003 released",
	}
	if len(got) != len(want) {
		t.Fatalf("timeline\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("entry %d is %q, want %q", i+1, got[i], want[i])
		}
	}
	if content > limit {
		t.Errorf("content entries store %d bytes, over the cap of %d", content, limit)
	}
	var long map[string]any
	if err := json.Unmarshal(events[2].Data, &long); err != nil {
		t.Fatal(err)
	}
	if long["state"] != "done" || long["exit_code"] != float64(3) || long["content_dropped"] != true || long["stdout"] != nil {
		t.Errorf("the entry amended past the cap holds %v", long)
	}
	var leftOut map[string]any
	if err := json.Unmarshal(events[6].Data, &leftOut); err != nil {
		t.Fatal(err)
	}
	// Left out: big 2, the late entry, and the long entry's output.
	if leftOut["dropped_entries"] != float64(2) || leftOut["cut_entries"] != float64(1) || leftOut["limit_bytes"] != float64(limit) ||
		leftOut["dropped_bytes"].(float64) < 2*1400 {
		t.Errorf("the closing entry's data %v", leftOut)
	}
}
