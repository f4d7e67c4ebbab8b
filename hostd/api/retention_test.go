package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

// canaryExecutor puts the prompt's canary everywhere a real run would put
// user content: commands, their output, an error, the final output.
func canaryExecutor(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error) {
	canary := strings.Fields(spec.Prompt)[1]
	if err := rec.ContentEvent(timeline.Shell, timeline.Command("echo "+canary), map[string]any{
		"exit_code": 0, "output": canary + "\n", "duration_ms": 3}); err != nil {
		return runs.Result{}, err
	}
	if strings.Contains(spec.Prompt, "fail") {
		return runs.Result{}, errors.New("model refused: " + canary)
	}
	return runs.Result{Output: "the canary is " + canary}, nil
}

// dbFilesContain reports whether any of the database's files hold s.
func dbFilesContain(t *testing.T, dbPath, s string) bool {
	t.Helper()
	found := false
	for _, suffix := range []string{"", "-wal", "-shm"} {
		b, err := os.ReadFile(dbPath + suffix)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		found = found || bytes.Contains(b, []byte(s))
	}
	return found
}

func TestZeroDataRetentionKeepsNoContentOnDisk(t *testing.T) {
	h := newHarness(t, harnessConfig{executor: scriptedExecutor(canaryExecutor)})
	const canary = "CANARY-7d1e04b9c2"
	for i, prompt := range []string{"echo " + canary + " please", "echo " + canary + " and fail"} {
		body := `{"prompt":"` + prompt + `","shell":true,"max_cost_micros":1000,"zero_data_retention":true,
			"files":[{"path":"` + canary + `.txt","content":"` + canary + `"}]}`
		run := h.waitFinished(h.createRun(body, "Idempotency-Key", fmt.Sprint("zdr-", i)).ID)
		if !run.ZeroDataRetention || string(run.Request) != "null" {
			t.Fatalf("zero-retention run stored its request: %s", run.Request)
		}
		if strings.Contains(prompt, "fail") {
			if run.Error == nil || strings.Contains(run.Error.Message, canary) {
				t.Fatalf("error %+v", run.Error)
			}
		} else if run.Output == nil || !strings.Contains(*run.Output, canary) {
			// The client can still read the output while it is held in memory.
			t.Fatalf("output %v", run.Output)
		}
		events := h.do("GET", "/v1/runs/"+run.ID+"/events", "")
		if strings.Contains(string(events.body), canary) || !strings.Contains(string(events.body), runs.Withheld) ||
			!strings.Contains(string(events.body), `"exit_code":0`) {
			t.Fatalf("events: %s", events.body)
		}
	}
	if dbFilesContain(t, h.dbPath, canary) {
		t.Fatalf("canary %q found in the database files", canary)
	}

	// The same run without zero retention does store it: the search works.
	run := h.createRun(`{"prompt":"echo ` + canary + ` please","shell":true,"max_cost_micros":1000}`)
	h.waitFinished(run.ID)
	if !dbFilesContain(t, h.dbPath, canary) {
		t.Fatal("control run's content not found: the canary search is broken")
	}
}
