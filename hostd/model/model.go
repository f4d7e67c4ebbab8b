// Package model is the provider-neutral view of one call to a language
// model: a conversation (system prompt, user text, assistant tool calls, tool
// results), the tools offered, and the answer with its token usage.
//
// Provider clients (openai, anthropic, the replay provider) translate this
// view to and from their wire formats; the agent loop only ever sees this
// package's types. Everything a provider returns is treated as hostile: tool
// calls whose arguments are not a JSON object are kept, flagged with
// ArgumentsError, so the agent can answer them as tool errors instead of
// failing the whole turn.
package model

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Provider answers one model turn.
type Provider interface {
	Complete(ctx context.Context, req Request) (Response, error)
}

// Role says who wrote a message.
type Role string

const (
	RoleUser      Role = "user"
	RoleAssistant Role = "assistant"
	// RoleTool messages carry the results of the previous assistant
	// message's tool calls.
	RoleTool Role = "tool"
)

// Request is one model call: the whole conversation so far.
type Request struct {
	Model    string    `json:"model"`
	System   string    `json:"system,omitempty"`
	Messages []Message `json:"messages"`
	Tools    []Tool    `json:"tools,omitempty"`
	// MaxTokens bounds the answer's output tokens; the agent caps it to
	// what the remaining budget can pay for. Zero leaves it to the
	// provider (Anthropic requires one: its client then uses a default).
	MaxTokens int `json:"max_tokens,omitempty"`
	// BeforeRetry, when set, is asked before every retry of a failed
	// attempt; returning an error stops retrying (for example when the
	// budget or the time left cannot pay for another attempt).
	BeforeRetry RetryHook `json:"-"`
}

// Message is one entry of the conversation. Which fields are used depends on
// Role: user messages have Text; assistant messages have Text and/or
// ToolCalls; tool messages have ToolResults.
type Message struct {
	Role        Role         `json:"role"`
	Text        string       `json:"text,omitempty"`
	ToolCalls   []ToolCall   `json:"tool_calls,omitempty"`
	ToolResults []ToolResult `json:"tool_results,omitempty"`
}

// Tool is a function the model may call.
type Tool struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// InputSchema is the JSON Schema of the arguments object.
	InputSchema json.RawMessage `json:"input_schema"`
}

// ToolCall is the model asking for one tool invocation.
type ToolCall struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Arguments is the JSON text exactly as the model produced it, kept
	// even when it is invalid so it can be shown back to the model.
	Arguments string `json:"arguments"`
	// ArgumentsError says why the call cannot be run (arguments not a
	// JSON object, no tool name); empty when the call is well-formed.
	ArgumentsError string `json:"arguments_error,omitempty"`
}

// ToolResult answers one ToolCall.
type ToolResult struct {
	CallID  string `json:"call_id"`
	Content string `json:"content"`
	// IsError marks a failed call (unknown tool, bad arguments, refused)
	// so the model can tell it from output.
	IsError bool `json:"is_error,omitempty"`
}

// StopReason is why the model stopped, normalised across providers.
type StopReason string

const (
	StopEndTurn       StopReason = "end_turn"
	StopToolUse       StopReason = "tool_use"
	StopMaxTokens     StopReason = "max_tokens"
	StopContentFilter StopReason = "content_filter"
	// StopUnknown is a reason this package does not know; the provider's
	// own word is in Response.RawStopReason.
	StopUnknown StopReason = "unknown"
)

// Response is the model's answer to one Request.
type Response struct {
	// ID is the provider's id for this completion, for support requests.
	ID string `json:"id,omitempty"`
	// Model is the model that answered as the provider names it (may
	// differ from the requested alias).
	Model         string     `json:"model,omitempty"`
	Text          string     `json:"text,omitempty"`
	ToolCalls     []ToolCall `json:"tool_calls,omitempty"`
	StopReason    StopReason `json:"stop_reason"`
	RawStopReason string     `json:"raw_stop_reason,omitempty"`
	// Usage is zero when the provider did not report it.
	Usage Usage `json:"usage"`
}

// Usage counts the tokens one call consumed.
type Usage struct {
	// InputTokens is every prompt token, cached ones included.
	InputTokens int64 `json:"input_tokens"`
	// CachedInputTokens is the part of InputTokens served from the
	// provider's prompt cache (billed at the cached rate).
	CachedInputTokens int64 `json:"cached_input_tokens,omitempty"`
	OutputTokens      int64 `json:"output_tokens"`
}

// Total is input plus output tokens, the number shown to users.
func (u Usage) Total() int64 { return u.InputTokens + u.OutputTokens }

// Add returns the sum of two usages.
func (u Usage) Add(v Usage) Usage {
	return Usage{
		InputTokens:       u.InputTokens + v.InputTokens,
		CachedInputTokens: u.CachedInputTokens + v.CachedInputTokens,
		OutputTokens:      u.OutputTokens + v.OutputTokens,
	}
}

// Retry describes a retry about to happen.
type Retry struct {
	// Attempt is the number of the attempt about to start (2 for the
	// first retry).
	Attempt int
	// Wait is how long the client will sleep before it.
	Wait time.Duration
	// Err is why the previous attempt failed.
	Err error
}

// RetryHook may refuse a retry by returning an error.
type RetryHook func(ctx context.Context, r Retry) error

// CheckArguments validates a tool call's raw arguments and returns the reason
// they are unusable, or "" when they are a JSON object.
func CheckArguments(raw string) string {
	if raw == "" {
		return "arguments are empty"
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &obj); err != nil {
		return fmt.Sprintf("arguments are not a JSON object: %v", err)
	}
	if obj == nil {
		return "arguments are null, not a JSON object"
	}
	return ""
}

// NormalizeToolCalls flags calls without a name or with unusable arguments
// (keeping a flag a provider client already set), and gives calls
// without an id, or with an id already used in this answer, a fresh one, so
// every call can be answered by exactly one tool result.
func NormalizeToolCalls(calls []ToolCall) {
	seen := make(map[string]bool, len(calls))
	for i := range calls {
		c := &calls[i]
		switch {
		case c.ArgumentsError != "":
		case c.Name == "":
			c.ArgumentsError = "tool call has no tool name"
		default:
			c.ArgumentsError = CheckArguments(c.Arguments)
		}
		if c.ID == "" || seen[c.ID] {
			c.ID = uniqueCallID(i, seen)
		}
		seen[c.ID] = true
	}
}

func uniqueCallID(index int, seen map[string]bool) string {
	id := fmt.Sprintf("call_%d", index)
	for n := 2; seen[id]; n++ {
		id = fmt.Sprintf("call_%d_%d", index, n)
	}
	return id
}

// maxTokenCount bounds a token count read from a provider (2^40, far above
// any real call) so sums of counts cannot overflow int64.
const maxTokenCount = 1 << 40

// ClampTokens makes a provider-reported token count safe to add and bill:
// never negative, never near overflow.
func ClampTokens(n int64) int64 { return min(max(n, 0), maxTokenCount) }
