package agent

import (
	"slices"
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/model"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
	"github.com/ephemeralhq/ephemeral/tests/fakeprovider"
)

// A provider that refuses the key (401), the key's access to the model
// (403) or knows no such model (404) ends the run at its first call,
// without retrying, as failed under an error code of its own; the
// timeline says what must be fixed.
func TestProviderRefusalEndsTheRunAtOnce(t *testing.T) {
	for _, c := range []struct {
		name, model string
		status      int
		wrongKey    bool // the provider wants another key than the daemon sends
		code, fix   string
	}{
		{"openai wrong key", testModel, 401, true, "provider_auth_failed",
			"the model provider openai rejected the daemon's API key (HTTP 401): the daemon's operator must set a valid key in the openai-api-key setting"},
		{"anthropic wrong key", testAnthropicModel, 401, true, "provider_auth_failed",
			"the model provider anthropic rejected the daemon's API key (HTTP 401): the daemon's operator must set a valid key in the anthropic-api-key setting"},
		{"openai no access", testModel, 403, false, "provider_access_denied",
			"the model provider openai refused the daemon's API key access to model " + testModel + " (HTTP 403)"},
		{"openai unknown model", testModel, 404, false, "model_not_found",
			"the model provider openai does not know model " + testModel + " (HTTP 404): check the model name"},
		{"anthropic unknown model", testAnthropicModel, 404, false, "model_not_found",
			"and the provider's address, the anthropic-base-url setting"},
	} {
		t.Run(c.name, func(t *testing.T) {
			vm := pageVM()
			e := newEnv(t, vm, fakeprovider.Turn{Status: c.status}, fakeprovider.Turn{Text: "never asked"})
			if c.wrongKey {
				e.provider.APIKey = "sk-the-right-one"
			}
			spec := pageSpec("hi")
			spec.Model = c.model
			r, events := e.run(spec)
			if r.Status != store.Failed || r.ErrorCode != c.code || !strings.Contains(r.ErrorMessage, c.fix) {
				t.Fatalf("status %s, code %s, message %q", r.Status, r.ErrorCode, r.ErrorMessage)
			}
			if reqs := e.provider.Requests(); len(reqs) != 1 || reqs[0].Status != c.status {
				t.Errorf("the provider was asked %d times (a refusal is not retried)", len(reqs))
			}
			checkMoney(t, r)
			if r.Usage.ModelCalls != 0 || r.Cost.Model != 0 || len(vm.commands) != 0 || vm.destroyed != 1 {
				t.Errorf("usage %+v, cost %+v, commands %q, destroyed %d", r.Usage, r.Cost, vm.commands, vm.destroyed)
			}
			i := slices.IndexFunc(events, func(ev store.Event) bool { return ev.Category == timeline.Failed })
			if i < 0 || events[i].Message != r.ErrorMessage || !strings.Contains(events[i].Message, c.fix) {
				t.Errorf("the timeline does not say what to fix: %q", messages(events))
			}
		})
	}
}

// Under zero data retention the provider's own words are left out; what
// to fix is still said.
func TestProviderRefusalUnderZeroDataRetention(t *testing.T) {
	e := newEnv(t, pageVM(), fakeprovider.Turn{Status: 404})
	spec := pageSpec("hi")
	spec.ZeroDataRetention = true
	r, _ := e.run(spec)
	if r.ErrorCode != "model_not_found" || strings.Contains(r.ErrorMessage, "fakeprovider") ||
		!strings.HasPrefix(r.ErrorMessage, "the model provider openai does not know model") {
		t.Fatalf("code %s, message %q", r.ErrorCode, r.ErrorMessage)
	}
}

// The minimum budget the API asks for is what the agent needs for its
// first model call: with a little less it makes none; with the minimum
// it makes it.
func TestMinimumBudgetPaysForTheFirstCall(t *testing.T) {
	prompt := strings.Repeat("Write a report on the primes below 1000. ", 200)
	spec := pageSpec(prompt)
	e := newEnv(t, pageVM(), fakeprovider.Turn{Text: "never asked"})
	least, err := e.exec.MinimumBudget(spec)
	if err != nil {
		t.Fatal(err)
	}
	compute := ledger.DefaultRates.Price(ledger.Usage{VMTime: minimumComputeTime}).Compute
	// The prompt alone is about 8,200 bytes: over 2,700 input tokens.
	if firstCall := least - compute; firstCall < testPrice.Cost(model.Usage{InputTokens: 2700, OutputTokens: minAnswerTokens}) {
		t.Fatalf("minimum %d: its first call (%d) does not cover the prompt", least, firstCall)
	}

	// The budget's wording in the system prompt may differ by a digit:
	// two micro-dollars below the first call's cost covers that.
	short := spec
	short.MaxCostMicros = least - compute - 2
	r, _ := e.run(short)
	if r.Status != store.BudgetExceeded || len(e.provider.Requests()) != 0 {
		t.Fatalf("below the minimum: %s, %d model calls", r.Status, len(e.provider.Requests()))
	}

	e = newEnv(t, pageVM(), fakeprovider.Turn{Text: "done", Usage: fakeprovider.Usage{InputTokens: 10, OutputTokens: 1}})
	enough := spec
	enough.MaxCostMicros = least
	r, _ = e.run(enough)
	if len(e.provider.Requests()) != 1 || r.Status != store.Succeeded {
		t.Fatalf("at the minimum: %s %s, %d model calls", r.Status, r.ErrorMessage, len(e.provider.Requests()))
	}
}
