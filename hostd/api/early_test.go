package api

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/runs"
)

// refusedBeforeReserving checks that a refused request left no trace: no
// run and nothing held on the balance.
func refusedBeforeReserving(t *testing.T, h *harness) {
	t.Helper()
	if a := h.balance(); a.Held != 0 || a.Charged != 0 {
		t.Errorf("a refused request moved money: %+v", a)
	}
	var list struct{ Data []runJSON }
	h.do("GET", "/v1/runs", "").decode(t, &list)
	if len(list.Data) != 0 {
		t.Errorf("a refused request created runs: %+v", list.Data)
	}
}

// Without a configured default model, a request must name one: the 400
// lists the usable models and names the setting. The model is not
// guessed.
func TestModelRequiredWithoutADefault(t *testing.T) {
	h := newHarness(t, harnessConfig{noDefaultModel: true, checkModels: true})
	resp := h.do("POST", "/v1/runs", productPageRequest)
	e := resp.apiError(t)
	if resp.status != http.StatusBadRequest || e.Code != "model_required" || e.Param != "model" {
		t.Fatalf("%d %s", resp.status, resp.body)
	}
	if !strings.Contains(e.Message, "default-model") || !strings.Contains(e.Message, "EPHEMERAL_DEFAULT_MODEL") ||
		!slices.Contains(e.UsableModels, "openai/gpt-6-luna") || !slices.Contains(e.UsableModels, "gpt-4o-mini") ||
		slices.Contains(e.UsableModels, "claude-haiku-4-5") || !strings.Contains(e.Message, "gpt-4o-mini") {
		t.Errorf("the error does not say what to do: %s", resp.body)
	}
	refusedBeforeReserving(t, h)

	// Naming the model is enough; so is a replay, which runs with its
	// recording's model.
	named := strings.Replace(productPageRequest, `"web": false,`, `"web": false, "model": "gpt-4o-mini",`, 1)
	if run := h.createRun(named); run.Model != "gpt-4o-mini" {
		t.Errorf("named model: the run has %q", run.Model)
	}
	replay := strings.Replace(productPageRequest, `"web": false,`, `"web": false, "replay": "product-page",`, 1)
	if run := h.createRun(replay); run.Model != "openai/gpt-6-luna" {
		t.Errorf("replay: the run has %q", run.Model)
	}
}

// The models endpoint marks no model as the default when none is set.
func TestNoModelIsTheDefaultWithoutOne(t *testing.T) {
	h := newHarness(t, harnessConfig{noDefaultModel: true})
	var list struct{ Data []modelJSON }
	h.do("GET", "/v1/models", "").decode(t, &list)
	for _, m := range list.Data {
		if m.Default {
			t.Errorf("%s is marked default", m.ID)
		}
	}
}

// A replay that names no model runs with its recording's, whatever the
// daemon's default is.
func TestReplayWithoutModelUsesTheRecordings(t *testing.T) {
	h := newHarness(t, harnessConfig{defaultModel: "gpt-4o-mini"})
	replay := strings.Replace(productPageRequest, `"web": false,`, `"web": false, "replay": "product-page",`, 1)
	if run := h.createRun(replay); run.Model != "openai/gpt-6-luna" {
		t.Errorf("replay: the run has %q", run.Model)
	}
}

// A model whose provider is not configured is refused before anything is
// reserved or booted.
func TestUnconfiguredProviderIsRefusedBeforeReserving(t *testing.T) {
	booted := false
	h := newHarness(t, harnessConfig{checkModels: true, executor: scriptedExecutor(
		func(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error) {
			booted = true
			return runs.Result{}, nil
		})})
	body := strings.Replace(productPageRequest, `"web": false,`, `"web": false, "model": "claude-haiku-4-5",`, 1)
	resp := h.do("POST", "/v1/runs", body)
	e := resp.apiError(t)
	if resp.status != http.StatusBadRequest || e.Code != "model_not_available" || e.Param != "model" ||
		!strings.Contains(e.Message, "anthropic-api-key") {
		t.Fatalf("%d %s", resp.status, resp.body)
	}
	refusedBeforeReserving(t, h)
	if booted {
		t.Error("the run was executed")
	}
}

// A budget below what the first model call can cost is refused with the
// minimum, before anything is reserved.
func TestBudgetBelowTheFirstCallIsRefused(t *testing.T) {
	var asked runs.Spec
	h := newHarness(t, harnessConfig{minimumBudget: func(spec runs.Spec) (int64, error) {
		asked = spec
		return 301, nil
	}})
	body := strings.Replace(productPageRequest, "40000", "300", 1)
	resp := h.do("POST", "/v1/runs", body)
	e := resp.apiError(t)
	if resp.status != http.StatusBadRequest || e.Code != "budget_too_small" || e.Param != "max_cost_micros" || e.MinimumMicros != 301 ||
		!strings.Contains(e.Message, "at least 301 ($0.000301)") {
		t.Fatalf("%d %s", resp.status, resp.body)
	}
	if asked.Model != "openai/gpt-6-luna" || !asked.Shell || asked.MaxCostMicros != 300 || !strings.HasPrefix(asked.Prompt, "This is a sandbox test.") {
		t.Errorf("the minimum was asked of %+v", asked)
	}
	refusedBeforeReserving(t, h)

	if run := h.createRun(strings.Replace(productPageRequest, "40000", "301", 1)); run.Cost.Reserved != 301 {
		t.Errorf("the minimum itself: reserved %d", run.Cost.Reserved)
	}

	// A minimum that cannot be worked out is the daemon's fault.
	broken := newHarness(t, harnessConfig{minimumBudget: func(runs.Spec) (int64, error) { return 0, errors.New("no price") }})
	if resp := broken.do("POST", "/v1/runs", productPageRequest); resp.status != http.StatusInternalServerError {
		t.Errorf("%d %s", resp.status, resp.body)
	}
}
