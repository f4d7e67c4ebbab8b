package openai

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ephemeralhq/ephemeral/hostd/model"
)

// The wire types below follow the Chat Completions reference; only the
// fields this client uses are declared.

type chatRequest struct {
	Model               string        `json:"model"`
	Messages            []chatMessage `json:"messages"`
	Tools               []chatTool    `json:"tools,omitempty"`
	MaxTokens           int           `json:"max_tokens,omitempty"`
	MaxCompletionTokens int           `json:"max_completion_tokens,omitempty"`
}

type chatMessage struct {
	Role string `json:"role"`
	// Content is a pointer so an assistant message that only calls tools
	// sends "content": null, as the API documents.
	Content    *string        `json:"content"`
	ToolCalls  []chatToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
}

type chatTool struct {
	Type     string       `json:"type"`
	Function chatFunction `json:"function"`
}

type chatFunction struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

type chatToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name string `json:"name"`
		// Arguments is a JSON-encoded string per the API; some local
		// servers send the object itself, so it is decoded by hand.
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

func (c *Client) wireRequest(req model.Request) chatRequest {
	out := chatRequest{Model: req.Model}
	if c.maxTokensField == FieldMaxCompletionTokens {
		out.MaxCompletionTokens = req.MaxTokens
	} else {
		out.MaxTokens = req.MaxTokens
	}
	if req.System != "" {
		out.Messages = append(out.Messages, chatMessage{Role: "system", Content: ptr(req.System)})
	}
	for _, m := range req.Messages {
		out.Messages = append(out.Messages, wireMessages(m)...)
	}
	for _, t := range req.Tools {
		out.Tools = append(out.Tools, chatTool{Type: "function", Function: chatFunction{
			Name: t.Name, Description: t.Description, Parameters: t.InputSchema,
		}})
	}
	return out
}

// wireMessages turns one neutral message into Chat Completions messages:
// tool results become one "tool" message each.
func wireMessages(m model.Message) []chatMessage {
	switch m.Role {
	case model.RoleTool:
		out := make([]chatMessage, 0, len(m.ToolResults))
		for _, r := range m.ToolResults {
			out = append(out, chatMessage{Role: "tool", ToolCallID: r.CallID, Content: ptr(toolResultText(r))})
		}
		return out
	case model.RoleAssistant:
		msg := chatMessage{Role: "assistant"}
		if m.Text != "" || len(m.ToolCalls) == 0 {
			msg.Content = ptr(m.Text)
		}
		for _, call := range m.ToolCalls {
			wc := chatToolCall{ID: call.ID, Type: "function"}
			wc.Function.Name = call.Name
			// Sent back verbatim, even when invalid: the model should
			// see what it wrote next to the error it caused.
			wc.Function.Arguments, _ = json.Marshal(call.Arguments)
			msg.ToolCalls = append(msg.ToolCalls, wc)
		}
		return []chatMessage{msg}
	default:
		return []chatMessage{{Role: string(m.Role), Content: ptr(m.Text)}}
	}
}

// toolResultText marks failed calls in the text: Chat Completions has no
// error flag on tool messages.
func toolResultText(r model.ToolResult) string {
	if r.IsError {
		return "Error: " + r.Content
	}
	return r.Content
}

func ptr(s string) *string { return &s }

type chatResponse struct {
	ID      string          `json:"id"`
	Model   string          `json:"model"`
	Choices []chatChoice    `json:"choices"`
	Usage   *chatUsage      `json:"usage"`
	Error   json.RawMessage `json:"error"`
}

type chatChoice struct {
	Message struct {
		Content   json.RawMessage `json:"content"`
		Refusal   *string         `json:"refusal"`
		ToolCalls []chatToolCall  `json:"tool_calls"`
	} `json:"message"`
	FinishReason *string `json:"finish_reason"`
}

type chatUsage struct {
	PromptTokens        int64 `json:"prompt_tokens"`
	CompletionTokens    int64 `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// ParseResponse decodes a Chat Completions response body. Structural
// failures wrap model.ErrMalformedResponse; a bad tool call is only flagged.
func ParseResponse(body []byte) (model.Response, error) {
	var wire chatResponse
	if err := json.Unmarshal(body, &wire); err != nil {
		return model.Response{}, fmt.Errorf("openai: decode response: %w: %w", model.ErrMalformedResponse, err)
	}
	if len(wire.Choices) == 0 {
		// OpenRouter reports some upstream failures as 200 with an error.
		if len(wire.Error) > 0 && string(wire.Error) != "null" {
			return model.Response{}, fmt.Errorf("openai: response carries an error %s: %w", clip(wire.Error), model.ErrMalformedResponse)
		}
		return model.Response{}, fmt.Errorf("openai: response has no choices: %w", model.ErrMalformedResponse)
	}
	choice := wire.Choices[0]
	text, err := contentText(choice.Message.Content)
	if err != nil {
		return model.Response{}, err
	}
	if text == "" && choice.Message.Refusal != nil {
		text = *choice.Message.Refusal
	}
	resp := model.Response{ID: wire.ID, Model: wire.Model, Text: text}
	for _, wc := range choice.Message.ToolCalls {
		resp.ToolCalls = append(resp.ToolCalls, toolCall(wc))
	}
	model.NormalizeToolCalls(resp.ToolCalls)
	if choice.FinishReason != nil {
		resp.RawStopReason = *choice.FinishReason
	}
	resp.StopReason = stopReason(resp.RawStopReason, len(resp.ToolCalls) > 0)
	if u := wire.Usage; u != nil {
		resp.Usage = model.Usage{InputTokens: model.ClampTokens(u.PromptTokens), OutputTokens: model.ClampTokens(u.CompletionTokens)}
		if d := u.PromptTokensDetails; d != nil {
			resp.Usage.CachedInputTokens = min(model.ClampTokens(d.CachedTokens), resp.Usage.InputTokens)
		}
	}
	return resp, nil
}

// contentText accepts the documented string (or null) and the array of
// content parts some compatible servers return.
func contentText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("openai: message content is neither text nor parts: %w", model.ErrMalformedResponse)
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type == "text" {
			b.WriteString(p.Text)
		}
	}
	return b.String(), nil
}

func toolCall(wc chatToolCall) model.ToolCall {
	call := model.ToolCall{ID: wc.ID, Name: wc.Function.Name}
	raw := wc.Function.Arguments
	var s string
	switch {
	case len(raw) == 0 || string(raw) == "null":
		call.ArgumentsError = "arguments are missing"
	case json.Unmarshal(raw, &s) == nil:
		call.Arguments = s
	default:
		// Not a string: keep the JSON as written and let the check
		// decide whether it is a usable object.
		call.Arguments = string(raw)
	}
	if wc.Type != "" && wc.Type != "function" {
		call.ArgumentsError = fmt.Sprintf("tool call type %q is not \"function\"", clip([]byte(wc.Type)))
	}
	return call
}

func stopReason(raw string, hasToolCalls bool) model.StopReason {
	switch raw {
	case "stop":
		// Some local servers say "stop" even when they called tools.
		if hasToolCalls {
			return model.StopToolUse
		}
		return model.StopEndTurn
	case "tool_calls", "function_call":
		return model.StopToolUse
	case "length":
		return model.StopMaxTokens
	case "content_filter":
		return model.StopContentFilter
	}
	return model.StopUnknown
}

// clip bounds provider text quoted in errors.
func clip(b []byte) string {
	const n = 200
	if len(b) > n {
		return strings.ToValidUTF8(string(b[:n]), "") + "…"
	}
	return strings.ToValidUTF8(string(b), "")
}
