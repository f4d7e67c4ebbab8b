package tests

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/tests/fakeprovider"
)

// How runs end when they hit a limit, through the real daemon and real
// microVMs: the status, the timeline, the money, and nothing left behind
// (cliState checks that no sandbox survives).
func TestRunLimitsEndToEnd(t *testing.T) {
	state := cliState(t)
	fake := fakeprovider.New()
	model := httptest.NewServer(fake)
	defer model.Close()
	d := startServe(t, state, "EPHEMERAL_OPENAI_BASE_URL="+model.URL+"/v1", "EPHEMERAL_DEFAULT_MODEL=openai/gpt-6-luna")

	submit := func(t *testing.T, body string) apiRun {
		t.Helper()
		var created apiRun
		if status := d.call(t, "POST", "/v1/runs", strings.NewReader(body), map[string]string{"Content-Type": "application/json"}, &created); status >= 300 {
			t.Fatalf("POST /v1/runs: %d", status)
		}
		run, events := d.waitRun(t, created.ID)
		run.events = events
		return run
	}

	t.Run("unservable models are refused with 400", func(t *testing.T) {
		for _, name := range []string{"gpt-7-imaginary", "claude-haiku-4-5"} {
			var e struct {
				Error struct{ Code, Param, Message string }
			}
			body := fmt.Sprintf(`{"prompt": "hi", "model": %q, "max_cost_micros": 1000}`, name)
			if status := d.call(t, "POST", "/v1/runs", strings.NewReader(body), nil, &e); status != http.StatusBadRequest || e.Error.Param != "model" {
				t.Errorf("model %s: %d %+v", name, status, e)
			}
		}
	})

	t.Run("a budget below the first call's cost is refused with the minimum", func(t *testing.T) {
		var e struct {
			Error struct {
				Code, Param   string
				MinimumMicros int64 `json:"minimum_micros"`
			}
		}
		body := `{"prompt": "Say hi.", "shell": true, "max_cost_micros": 10}`
		if status := d.call(t, "POST", "/v1/runs", strings.NewReader(body), nil, &e); status != http.StatusBadRequest ||
			e.Error.Code != "budget_too_small" || e.Error.Param != "max_cost_micros" || e.Error.MinimumMicros <= 10 {
			t.Fatalf("%d %+v", status, e)
		}
		fake.Append(fakeprovider.Turn{Text: "hi", Usage: fakeprovider.Usage{InputTokens: 10, OutputTokens: 1}})
		// The minimum pays for the first answer (and a second of the VM,
		// which the teardown under TCG may pass).
		run := submit(t, strings.Replace(body, "10}", fmt.Sprint(e.Error.MinimumMicros)+"}", 1))
		if run.Usage.ModelCalls != 1 || run.Cost.Reserved != e.Error.MinimumMicros || (run.Status != "succeeded" && run.Status != "budget_exceeded") {
			t.Fatalf("with the minimum: %s %+v, %d model calls", run.Status, run.Error, run.Usage.ModelCalls)
		}
		checkCost(t, run)
	})

	t.Run("timeout mid-command", func(t *testing.T) {
		fake.Append(fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCall("c1", "echo started; sleep 600")}})
		run := submit(t, `{"prompt": "wait", "shell": true, "timeout_seconds": 6, "max_cost_micros": 40000}`)
		if run.Status != "timed_out" {
			t.Fatalf("status %s %+v", run.Status, run.Error)
		}
		checkCost(t, run)
		if msgs := run.messages(); !slices.Contains(msgs, "Shell: $ echo started; sleep 600") || !slices.Contains(msgs, "MicroVM: microVM destroyed") {
			t.Errorf("timeline %q", msgs)
		}
	})

	t.Run("budget exhausted mid-run", func(t *testing.T) {
		fake.Append(
			fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCall("c1", "echo one")}, Usage: fakeprovider.Usage{InputTokens: 1000}},
			fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCall("c2", "echo two")}, Usage: fakeprovider.Usage{InputTokens: 1_000_000}},
		)
		run := submit(t, `{"prompt": "spend", "shell": true, "max_cost_micros": 5000}`)
		if run.Status != "budget_exceeded" || run.Cost.Charged != 5000 {
			t.Fatalf("status %s, cost %+v, error %+v", run.Status, run.Cost, run.Error)
		}
		checkCost(t, run)
		if msgs := run.messages(); !slices.Contains(msgs, "Shell: $ echo one") || slices.Contains(msgs, "Shell: $ echo two") {
			t.Errorf("timeline %q", msgs)
		}
		if fake.Remaining() != 0 {
			t.Errorf("%d scripted turns unused", fake.Remaining())
		}
	})

	t.Run("zero data retention keeps no recording", func(t *testing.T) {
		fake.Append(
			fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCall("c1", "echo zr-canary-5d1c")}},
			fakeprovider.Turn{Text: "zr-canary-5d1c answered"},
		)
		run := submit(t, `{"prompt": "say zr-canary-5d1c", "shell": true, "zero_data_retention": true, "max_cost_micros": 40000}`)
		if run.Status != "succeeded" {
			t.Fatalf("status %s %+v", run.Status, run.Error)
		}
		if status := d.call(t, "GET", "/v1/runs/"+run.ID+"/recording", nil, nil, nil); status != http.StatusNotFound {
			t.Errorf("recording of a zero-retention run: %d", status)
		}
		raw, _ := json.Marshal(run.events)
		if strings.Contains(string(raw), "zr-canary-5d1c") || !slices.Contains(run.messages(), "Shell: "+runs.Withheld) {
			t.Errorf("timeline keeps content: %s", raw)
		}
	})
}

func checkCost(t *testing.T, run apiRun) {
	t.Helper()
	c := run.Cost
	if c.Reserved != c.Charged+c.Released || c.Model+c.Web+c.Compute != c.Charged || c.Charged > c.Reserved {
		t.Errorf("cost %+v", c)
	}
}

func (r apiRun) messages() []string {
	var out []string
	for _, ev := range r.events {
		out = append(out, ev.Category+": "+ev.Message)
	}
	return out
}
