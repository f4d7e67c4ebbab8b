package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/model"
	"github.com/ephemeralhq/ephemeral/hostd/model/registry"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
)

// ErrVMStopped ends a run whose microVM stopped before the run was done
// (the guest crashed or was killed): its tools cannot work any more.
var ErrVMStopped = errors.New("agent: the microVM stopped unexpectedly")

// vmStopped is ErrVMStopped with the VM's account of why, where it has one:
// a sandbox knows when the kernel killed its VMM for passing its memory
// limit.
func vmStopped(vm VM) error {
	if v, ok := vm.(interface{ StopCause() error }); ok {
		if cause := v.StopCause(); cause != nil {
			return fmt.Errorf("%w: %w", ErrVMStopped, cause)
		}
	}
	return ErrVMStopped
}

// ErrMaxTurns ends a run whose model kept calling tools past Config.MaxTurns.
var ErrMaxTurns = errors.New("agent: the model did not give a final answer within its turns")

// minAnswerTokens is the smallest answer worth paying for: below it the run
// stops as out of budget instead of buying a truncated reply.
const minAnswerTokens = 64

// bytesPerTokenEstimate sizes a request before sending it. Real tokenizers
// average about four bytes per token on English and code; three
// overestimates the input so max_tokens errs toward staying in budget.
const bytesPerTokenEstimate = 3

// conversation is one run's exchange with its model.
type conversation struct {
	cfg      *Config
	spec     runs.Spec
	rec      *runs.Recorder
	vm       VM
	egress   Egress // nil unless the run was granted web or connections
	model    registry.Model
	provider model.Provider
	messages []model.Message
}

// run calls the model until it answers without tool calls and returns
// that answer.
func (c *conversation) run(ctx context.Context) (string, error) {
	c.messages = []model.Message{{Role: model.RoleUser, Text: c.spec.Prompt}}
	tools := toolsFor(c.spec)
	// The last allowed turn offers no tools, so a well-behaved model has
	// to answer; one that calls tools anyway gets errors and one more
	// chance.
	for turn := 1; turn <= c.cfg.MaxTurns+1; turn++ {
		final := turn >= c.cfg.MaxTurns
		offered := tools
		if final {
			offered = nil
		}
		resp, err := c.call(ctx, offered, final)
		if err != nil {
			return "", err
		}
		if len(resp.ToolCalls) == 0 {
			return resp.Text, nil
		}
		model.NormalizeToolCalls(resp.ToolCalls)
		c.messages = append(c.messages, model.Message{Role: model.RoleAssistant, Text: resp.Text, ToolCalls: resp.ToolCalls})
		var results []model.ToolResult
		if final {
			results = refuseAll(resp.ToolCalls, "no turns are left for tools: answer now with what you have, without calling a tool")
		} else {
			results = c.runTools(ctx, resp.ToolCalls)
		}
		c.messages = append(c.messages, model.Message{Role: model.RoleTool, ToolResults: results})
		if ctx.Err() != nil {
			return "", context.Cause(ctx)
		}
		select {
		case <-c.vm.Done():
			return "", vmStopped(c.vm)
		default:
		}
	}
	return "", fmt.Errorf("%w (%d)", ErrMaxTurns, c.cfg.MaxTurns)
}

// call makes one model call the remaining budget can pay for and charges it.
func (c *conversation) call(ctx context.Context, tools []model.Tool, final bool) (model.Response, error) {
	req := newRequest(c.spec, c.cfg, c.model.Name, c.vm.ScratchDir(), c.rec.Remaining(), timeLeft(ctx), c.messages, tools, final)
	inputEstimate := estimateTokens(req)
	if least := leastCallCost(c.model.Price, inputEstimate); c.rec.Remaining() < least {
		return model.Response{}, fmt.Errorf("agent: %d micros left cannot pay for a model call of about %d input tokens (%d micros): %w",
			c.rec.Remaining(), inputEstimate, least, ledger.ErrBudgetExceeded)
	}
	maxTokens := c.model.Price.AffordableOutputTokens(c.rec.Remaining(), inputEstimate)
	req.MaxTokens = int(min(maxTokens, int64(c.cfg.MaxAnswerTokens)))
	req.BeforeRetry = func(ctx context.Context, r model.Retry) error {
		if left := timeLeft(ctx); left <= r.Wait {
			return fmt.Errorf("agent: retry in %v would outlast the run's %v left", r.Wait, left)
		}
		if c.rec.Remaining() < leastCallCost(c.model.Price, inputEstimate) {
			return fmt.Errorf("agent: the budget left cannot pay for a retry: %w", ledger.ErrBudgetExceeded)
		}
		return nil
	}
	resp, err := c.provider.Complete(ctx, req)
	if f := providerRefusal(c.model, err); f != nil {
		return model.Response{}, f
	}
	if err != nil {
		if cause := context.Cause(ctx); cause != nil {
			return model.Response{}, fmt.Errorf("agent: model call: %w (%w)", err, cause)
		}
		return model.Response{}, fmt.Errorf("agent: model call: %w", err)
	}
	usage := model.Usage{
		InputTokens:       model.ClampTokens(resp.Usage.InputTokens),
		CachedInputTokens: model.ClampTokens(resp.Usage.CachedInputTokens),
		OutputTokens:      model.ClampTokens(resp.Usage.OutputTokens),
	}
	if err := c.rec.Charge(ledger.Usage{
		ModelCalls: 1, InputTokens: usage.InputTokens, OutputTokens: usage.OutputTokens,
		ModelMicros: c.model.Price.Cost(usage),
	}); err != nil {
		return model.Response{}, fmt.Errorf("agent: charge model call: %w", err)
	}
	return resp, nil
}

// newRequest is the model call the agent makes next: the conversation so
// far under a system prompt that tells the budget and time left.
func newRequest(spec runs.Spec, cfg *Config, modelName, scratchDir string, remaining int64, left time.Duration,
	messages []model.Message, tools []model.Tool, final bool) model.Request {
	return model.Request{
		Model:    modelName,
		System:   systemPrompt(spec, scratchDir, remaining, left, cfg, final),
		Messages: messages,
		Tools:    tools,
	}
}

// estimateTokens sizes what the request will cost in input tokens.
func estimateTokens(req model.Request) int64 {
	b, err := json.Marshal(req)
	if err != nil {
		return 0
	}
	return int64(len(b))/bytesPerTokenEstimate + 1
}

// leastCallCost is what a model call of about inputTokens costs with the
// shortest answer the agent pays for: with less left, it does not make
// the call. (Price.Cost of that usage is at most the budget exactly when
// AffordableOutputTokens of the budget is at least minAnswerTokens.)
func leastCallCost(p model.Price, inputTokens int64) int64 {
	return p.Cost(model.Usage{InputTokens: inputTokens, OutputTokens: minAnswerTokens})
}

// scratchDirShape has the length of the scratch directory a microVM
// reports (guest/initd: /tmp/ephemeral-run-<6 random characters>/scratch),
// for sizing a run's first model call before the VM exists.
const scratchDirShape = "/tmp/ephemeral-run-XXXXXX/scratch"

// minimumComputeTime is the VM time a run needs at the least besides its
// first model call: the microVM runs, and is charged, while the model
// answers.
const minimumComputeTime = time.Second

// MinimumBudget is the least max_cost_micros with which spec's run can get
// its model's first answer:
//
//	first call: the estimated input tokens of the run's first model call
//	  (its prompt, the system prompt and the tool definitions, sized as
//	  before every call: JSON bytes / 3) at the model's input price, plus
//	  the shortest answer the agent pays for (64 tokens) at its output price
//	+ one VM-second of compute at the configured rate
//
// With less, the agent would stop the run as budget_exceeded before or
// right after that call, so the API refuses such a run before reserving
// anything (400 budget_too_small with minimum_micros).
func (e *Executor) MinimumBudget(spec runs.Spec) (int64, error) {
	m, err := e.model(spec)
	if err != nil {
		return 0, fmt.Errorf("agent: minimum budget: %w", err)
	}
	messages := []model.Message{{Role: model.RoleUser, Text: spec.Prompt}}
	first := newRequest(spec, &e.cfg, m.Name, scratchDirShape, spec.MaxCostMicros, spec.Timeout, messages, toolsFor(spec), e.cfg.MaxTurns <= 1)
	if e.cfg.MaxTurns <= 1 {
		first.Tools = nil // the last turn offers no tools
	}
	compute := e.cfg.Rates.Price(ledger.Usage{VMTime: minimumComputeTime}).Compute
	return leastCallCost(m.Price, estimateTokens(first)) + compute, nil
}

// timeLeft is how long the run may still go on.
func timeLeft(ctx context.Context) time.Duration {
	deadline, ok := ctx.Deadline()
	if !ok {
		return time.Duration(1<<63 - 1)
	}
	return time.Until(deadline)
}

func refuseAll(calls []model.ToolCall, why string) []model.ToolResult {
	results := make([]model.ToolResult, len(calls))
	for i, call := range calls {
		results[i] = model.ToolResult{CallID: call.ID, Content: why, IsError: true}
	}
	return results
}
