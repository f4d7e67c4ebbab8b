package runs

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

// runOnce runs one run of spec with exec on a fresh service and returns
// it once it has ended.
func runOnce(t *testing.T, cfg Config, spec Spec, exec executorFunc) store.Run {
	t.Helper()
	ctx := context.Background()
	st, orgID := openStore(t)
	hub := timeline.NewHub()
	cfg.Rates, cfg.Executor = ledger.DefaultRates, exec
	svc := New(st, hub, cfg)
	t.Cleanup(func() {
		stopped, stop := context.WithCancel(ctx)
		stop()
		svc.Serve(stopped, time.Hour) // waits for the run's goroutine
	})
	spec.OrgID = orgID
	if spec.MaxCostMicros == 0 {
		spec.MaxCostMicros = 1000
	}
	run, _, err := svc.Submit(ctx, Submission{Spec: spec, Canonical: []byte(`{"prompt":"p"}`)})
	if err != nil {
		t.Fatal(err)
	}
	return waitEnded(t, st, hub, orgID, run.ID)
}

// The timeout counts from the moment the microVM is ready: a boot longer
// than the whole timeout leaves the run all of it, and the context the
// run works in ends at exactly that deadline.
func TestTimeoutStartsWhenTheMicroVMIsReady(t *testing.T) {
	const timeout = 300 * time.Millisecond
	var before, after, deadline time.Time
	run := runOnce(t, Config{BootTimeout: time.Minute}, Spec{Prompt: "p", Model: "m", Timeout: timeout},
		func(ctx context.Context, spec Spec, rec *Recorder) (Result, error) {
			time.Sleep(2 * timeout) // a slow boot
			before = time.Now()
			ctx, stop := rec.StartClock(ctx)
			defer stop()
			after = time.Now()
			deadline, _ = ctx.Deadline()
			return Result{Output: "done in time"}, ctx.Err()
		})
	if run.Status != store.Succeeded {
		t.Fatalf("a boot longer than the timeout: %s %s %s", run.Status, run.ErrorCode, run.ErrorMessage)
	}
	if deadline.Before(before.Add(timeout)) || deadline.After(after.Add(timeout)) {
		t.Errorf("deadline %v is not the timeout after the clock started (%v to %v)", deadline, before, after)
	}

	run = runOnce(t, Config{}, Spec{Prompt: "p", Model: "m", Timeout: timeout},
		func(ctx context.Context, spec Spec, rec *Recorder) (Result, error) {
			ctx, stop := rec.StartClock(ctx)
			defer stop()
			<-ctx.Done() // a command that never ends
			return Result{}, ctx.Err()
		})
	if run.Status != store.TimedOut || run.ErrorCode != "timeout" {
		t.Fatalf("work past the timeout: %s %s %s", run.Status, run.ErrorCode, run.ErrorMessage)
	}
}

// A microVM that is not ready within the boot limit fails the run, says
// so, and costs nothing.
func TestBootLimitEndsARunThatNeverBoots(t *testing.T) {
	run := runOnce(t, Config{BootTimeout: 200 * time.Millisecond}, Spec{Prompt: "p", Model: "m", Timeout: time.Hour},
		func(ctx context.Context, spec Spec, rec *Recorder) (Result, error) {
			<-ctx.Done() // a boot that hangs
			return Result{}, ctx.Err()
		})
	if run.Status != store.Failed || run.ErrorCode != "boot_timeout" || run.Charged != 0 || run.Released != run.Reserved {
		t.Fatalf("%s %s %q, charged %d released %d", run.Status, run.ErrorCode, run.ErrorMessage, run.Charged, run.Released)
	}
}

// An Executor's Failure sets the run's error code and says what to fix;
// under zero data retention only its own words are kept.
func TestFailureNamesTheErrorCode(t *testing.T) {
	fail := func(ctx context.Context, spec Spec, rec *Recorder) (Result, error) {
		return Result{}, &Failure{Code: "provider_auth_failed", Message: "the provider rejected the key: set a valid one",
			Err: errors.New("HTTP 401: incorrect key for prompt secret plan")}
	}
	run := runOnce(t, Config{}, Spec{Prompt: "p", Model: "m", Timeout: time.Minute}, fail)
	want := "the provider rejected the key: set a valid one (HTTP 401: incorrect key for prompt secret plan)"
	if run.Status != store.Failed || run.ErrorCode != "provider_auth_failed" || run.ErrorMessage != want {
		t.Fatalf("%s %s %q", run.Status, run.ErrorCode, run.ErrorMessage)
	}
	run = runOnce(t, Config{}, Spec{Prompt: "p", Model: "m", Timeout: time.Minute, ZeroDataRetention: true}, fail)
	if run.ErrorCode != "provider_auth_failed" || run.ErrorMessage != "the provider rejected the key: set a valid one" {
		t.Fatalf("zero data retention: %s %q", run.ErrorCode, run.ErrorMessage)
	}
}
