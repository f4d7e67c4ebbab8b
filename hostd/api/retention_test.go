package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/model"
	"github.com/ephemeralhq/ephemeral/hostd/model/recording"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
	"github.com/ephemeralhq/ephemeral/internal/pgtest"
)

// canaryExecutor puts the prompt's canary everywhere a real run would put
// user content: commands, their output, the recording of the model's
// turns, an error, the final output.
func canaryExecutor(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error) {
	canary := strings.Fields(spec.Prompt)[1]
	if err := rec.ContentEvent(timeline.Shell, timeline.Command("echo "+canary), map[string]any{
		"exit_code": 0, "output": canary + "\n", "duration_ms": 3}); err != nil {
		return runs.Result{}, err
	}
	exchanges := pageRecording(spec)
	exchanges = append(exchanges, recording.Exchange{Turn: 2, Request: model.Request{Model: spec.Model,
		Messages: append(exchanges[0].Request.Messages,
			model.Message{Role: model.RoleAssistant, ToolCalls: exchanges[0].Response.ToolCalls},
			model.Message{Role: model.RoleTool, ToolResults: []model.ToolResult{{CallID: "call_1", Content: canary + "\n"}}})},
		Response: &model.Response{Text: "it printed " + canary, StopReason: model.StopEndTurn}})
	if err := record(rec, exchanges); err != nil {
		return runs.Result{}, err
	}
	if strings.Contains(spec.Prompt, "fail") {
		return runs.Result{}, errors.New("model refused: " + canary)
	}
	return runs.Result{Output: "the canary is " + canary}, nil
}

// dbFilesContain reports whether any of the database's files hold s; on
// PostgreSQL, whether a dump of the database holds it.
func dbFilesContain(t *testing.T, h *harness, s string) bool {
	t.Helper()
	if h.store.Postgres() {
		return bytes.Contains(pgtest.Shared(t).Dump(t, h.store.URL()), []byte(s))
	}
	dbPath := h.dbPath
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
		if resp := h.do("GET", "/v1/runs/"+run.ID+"/recording", ""); resp.status != http.StatusNotFound {
			t.Fatalf("recording of a zero-retention run: %d %s", resp.status, resp.body)
		}
		events := h.do("GET", "/v1/runs/"+run.ID+"/events", "")
		if strings.Contains(string(events.body), canary) || !strings.Contains(string(events.body), runs.Withheld) ||
			!strings.Contains(string(events.body), `"exit_code":0`) {
			t.Fatalf("events: %s", events.body)
		}
	}
	if dbFilesContain(t, h, canary) {
		t.Fatalf("canary %q found in the database files", canary)
	}

	// The same run without zero retention does store it: the search works.
	run := h.createRun(`{"prompt":"echo ` + canary + ` please","shell":true,"max_cost_micros":1000}`)
	h.waitFinished(run.ID)
	if !dbFilesContain(t, h, canary) {
		t.Fatal("control run's content not found: the canary search is broken")
	}
}

func TestDeletePurgesTheRecording(t *testing.T) {
	h := newHarness(t, harnessConfig{executor: scriptedExecutor(canaryExecutor)})
	const canary = "CANARY-recording-51f0aa"
	run := h.waitFinished(h.createRun(`{"prompt":"echo ` + canary + ` please","shell":true,"max_cost_micros":1000}`).ID)

	// The recording is the run's model turns, as ephemeral run --replay reads them.
	resp := h.do("GET", "/v1/runs/"+run.ID+"/recording", "")
	if resp.status != http.StatusOK || resp.header.Get("Content-Type") != "application/json" {
		t.Fatalf("recording: %d %s", resp.status, resp.body)
	}
	rec, err := recording.Decode(bytes.NewReader(resp.body))
	if err != nil {
		t.Fatal(err)
	}
	exchanges := rec.Exchanges
	if _, err := recording.NewReplay(rec); err != nil || len(exchanges) != 2 ||
		exchanges[0].Request.Messages[0].Text != "echo "+canary+" please" ||
		exchanges[1].Request.Messages[2].ToolResults[0].Content != canary+"\n" {
		t.Fatalf("recording does not replay the run's turns (%v): %s", err, resp.body)
	}
	_, otherKey := h.newOrg("other", 1_000_000)
	if resp := h.do("GET", "/v1/runs/"+run.ID+"/recording", "", "Authorization", "Bearer "+otherKey); resp.status != http.StatusNotFound {
		t.Fatalf("another organisation's recording: %d %s", resp.status, resp.body)
	}
	if !dbFilesContain(t, h, canary) {
		t.Fatal("run's content not found before the purge: the canary search is broken")
	}

	if resp := h.do("DELETE", "/v1/runs/"+run.ID, ""); resp.status != http.StatusOK {
		t.Fatalf("delete: %d %s", resp.status, resp.body)
	}
	resp = h.do("GET", "/v1/runs/"+run.ID+"/recording", "")
	if resp.status != http.StatusNotFound || resp.apiError(t).Code != "recording_not_found" {
		t.Fatalf("recording after purge: %d %s", resp.status, resp.body)
	}
	if dbFilesContain(t, h, canary) {
		t.Fatalf("canary %q still in the database files after the purge", canary)
	}
}

// The retention janitor leaves nothing of an expired run's content in the
// database files, with no checkpoint but its own, and gives the space back.
func TestJanitorLeavesNoExpiredContentOnDisk(t *testing.T) {
	h := newHarness(t, harnessConfig{executor: scriptedExecutor(canaryExecutor), retention: time.Nanosecond})
	const canary = "CANARY-janitor-0be7c1"
	var ids []string
	for i := range 3 {
		// Prompts of some size, so their purge frees whole pages.
		ids = append(ids, h.waitFinished(h.createRun(fmt.Sprintf(`{"prompt":"echo %s please %d %s","shell":true,"max_cost_micros":1000}`,
			canary, i, strings.Repeat("padding ", 2000))).ID).ID)
	}
	if !dbFilesContain(t, h, canary) {
		t.Fatal("runs' content not found before the sweep: the canary search is broken")
	}
	if err := h.store.Checkpoint(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Giving pages back to the file system is SQLite's part; PostgreSQL's
	// autovacuum does it for a shared database.
	sqlite := !h.store.Postgres()
	var before int64
	if sqlite {
		before = fileSize(t, h.dbPath)
	}

	if _, err := h.svc.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if resp := h.do("GET", "/v1/runs/"+id+"/recording", ""); resp.status != http.StatusNotFound {
			t.Fatalf("recording after the sweep: %d %s", resp.status, resp.body)
		}
	}
	if dbFilesContain(t, h, canary) {
		t.Fatalf("canary %q still in the database files after the sweep", canary)
	}
	if !sqlite {
		return
	}
	if after := fileSize(t, h.dbPath); after >= before {
		t.Fatalf("the database file did not shrink: %d bytes before the sweep, %d after", before, after)
	}
}

// fileSize is the size of the database file.
func fileSize(t *testing.T, dbPath string) int64 {
	t.Helper()
	fi, err := os.Stat(dbPath)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
