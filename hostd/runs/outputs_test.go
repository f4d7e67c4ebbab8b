package runs

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

// A run's output files are stored with it; a zero-data-retention run's
// are held in memory only, each returned once, within a daemon-wide cap.
func TestOutputFilesAreKeptOrReturnedOnce(t *testing.T) {
	ctx := context.Background()
	st, orgID := openStore(t)
	hub := timeline.NewHub()
	var mu sync.Mutex
	var finished []string
	svc := New(st, hub, Config{Rates: ledger.DefaultRates, MaxVolatileBytes: 40,
		Finished: func(id string) { mu.Lock(); finished = append(finished, id); mu.Unlock() },
		Executor: executorFunc(func(ctx context.Context, spec Spec, rec *Recorder) (Result, error) {
			if err := rec.Output("report.md", []byte("# ZDR-FILE-CANARY")); err != nil {
				return Result{}, err
			}
			if err := rec.Output("out/a.csv", []byte("a,b\n")); err != nil {
				return Result{}, err
			}
			if err := rec.Output("big.bin", make([]byte, 90)); spec.ZeroDataRetention != errors.Is(err, ErrOutputNotKept) {
				return Result{}, err
			}
			return Result{Output: "done"}, nil
		})})
	t.Cleanup(func() {
		stopped, stop := context.WithCancel(ctx)
		stop()
		svc.Serve(stopped, time.Hour)
	})
	submit := func(zeroRetention bool) store.Run {
		t.Helper()
		spec := Spec{OrgID: orgID, Prompt: "p", Model: "m", Timeout: time.Minute, MaxCostMicros: 1000, ZeroDataRetention: zeroRetention}
		run, _, err := svc.Submit(ctx, Submission{Spec: spec, Canonical: []byte(`{"prompt":"p"}`)})
		if err != nil {
			t.Fatal(err)
		}
		if run = waitEnded(t, st, hub, orgID, run.ID); run.Status != store.Succeeded {
			t.Fatalf("run %s: %s %s", run.ID, run.Status, run.ErrorMessage)
		}
		return run
	}

	kept := submit(false)
	listed, err := st.OutputsOf(ctx, []string{kept.ID})
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, o := range listed[kept.ID] {
		paths = append(paths, o.Path+" "+o.ContentType)
	}
	if want := []string{"big.bin application/octet-stream", "out/a.csv text/csv; charset=utf-8", "report.md text/markdown; charset=utf-8"}; !slices.Equal(paths, want) {
		t.Errorf("stored outputs %q, want %q", paths, want)
	}

	zdr := submit(true)
	if listed, _ := st.OutputsOf(ctx, []string{zdr.ID}); len(listed[zdr.ID]) != 0 {
		t.Errorf("a zero-retention run's outputs were stored: %+v", listed)
	}
	files := svc.VolatileFiles(zdr.ID)
	if len(files) != 2 || files[0].Path != "report.md" || files[1].Path != "out/a.csv" || files[0].Data != nil || files[0].Size != 17 {
		t.Fatalf("held files %+v", files)
	}
	f, ok := svc.TakeVolatileFile(zdr.ID, "report.md")
	if !ok || string(f.Data) != "# ZDR-FILE-CANARY" {
		t.Fatalf("took %q, %v", f.Data, ok)
	}
	if _, ok := svc.TakeVolatileFile(zdr.ID, "report.md"); ok {
		t.Error("a zero-retention file was returned twice")
	}
	if files := svc.VolatileFiles(zdr.ID); len(files) != 1 {
		t.Errorf("held after one was taken: %+v", files)
	}
	// The space the taken file held is free again: without it, the
	// second run's files would not fit under the cap of 40 bytes.
	again := submit(true)
	if files := svc.VolatileFiles(again.ID); len(files) != 2 {
		t.Errorf("second zero-retention run holds %+v", files)
	}

	mu.Lock()
	defer mu.Unlock()
	if want := []string{kept.ID, zdr.ID, again.ID}; !slices.Equal(finished, want) {
		t.Errorf("Finished told %v, want %v", finished, want)
	}
}
