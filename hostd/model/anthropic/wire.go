package anthropic

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ephemeralhq/ephemeral/hostd/model"
)

// The wire types follow the Messages API reference (anthropic-version
// 2023-06-01); only the fields this client uses are declared.

type messagesRequest struct {
	Model     string    `json:"model"`
	System    string    `json:"system,omitempty"`
	Messages  []message `json:"messages"`
	Tools     []tool    `json:"tools,omitempty"`
	MaxTokens int       `json:"max_tokens"`
}

type message struct {
	Role    string  `json:"role"`
	Content []block `json:"content"`
}

// block is one content block; Type selects which other fields are set.
type block struct {
	Type string `json:"type"`
	// text
	Text string `json:"text,omitempty"`
	// tool_use
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
	// tool_result
	ToolUseID string `json:"tool_use_id,omitempty"`
	Content   string `json:"content,omitempty"`
	IsError   bool   `json:"is_error,omitempty"`
}

type tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// emptyObject stands in for tool_use input that was not an object: the API
// rejects anything else, and the model learns what went wrong from the
// tool_result error that answers the call.
var emptyObject = json.RawMessage(`{}`)

func wireRequest(req model.Request) messagesRequest {
	out := messagesRequest{Model: req.Model, System: req.System, MaxTokens: req.MaxTokens}
	if out.MaxTokens <= 0 {
		out.MaxTokens = DefaultMaxTokens
	}
	for _, m := range req.Messages {
		out.Messages = append(out.Messages, wireMessage(m))
	}
	for _, t := range req.Tools {
		schema := t.InputSchema
		if len(schema) == 0 {
			schema = json.RawMessage(`{"type":"object"}`)
		}
		out.Tools = append(out.Tools, tool{Name: t.Name, Description: t.Description, InputSchema: schema})
	}
	return out
}

func wireMessage(m model.Message) message {
	switch m.Role {
	case model.RoleTool:
		out := message{Role: "user"}
		for _, r := range m.ToolResults {
			out.Content = append(out.Content, block{Type: "tool_result", ToolUseID: r.CallID, Content: r.Content, IsError: r.IsError})
		}
		return out
	case model.RoleAssistant:
		out := message{Role: "assistant"}
		// The API rejects empty text blocks.
		if m.Text != "" {
			out.Content = append(out.Content, block{Type: "text", Text: m.Text})
		}
		for _, call := range m.ToolCalls {
			input := emptyObject
			if model.CheckArguments(call.Arguments) == "" {
				input = json.RawMessage(call.Arguments)
			}
			out.Content = append(out.Content, block{Type: "tool_use", ID: call.ID, Name: call.Name, Input: input})
		}
		return out
	default:
		return message{Role: string(m.Role), Content: []block{{Type: "text", Text: m.Text}}}
	}
}

type messagesResponse struct {
	ID         string          `json:"id"`
	Type       string          `json:"type"`
	Model      string          `json:"model"`
	Content    []responseBlock `json:"content"`
	StopReason *string         `json:"stop_reason"`
	Usage      *struct {
		InputTokens              int64 `json:"input_tokens"`
		OutputTokens             int64 `json:"output_tokens"`
		CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
		CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
	} `json:"usage"`
}

type responseBlock struct {
	Type  string          `json:"type"`
	Text  string          `json:"text"`
	ID    string          `json:"id"`
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
}

// ParseResponse decodes a Messages response body. Structural failures wrap
// model.ErrMalformedResponse; a bad tool_use block is only flagged.
func ParseResponse(body []byte) (model.Response, error) {
	var wire messagesResponse
	if err := json.Unmarshal(body, &wire); err != nil {
		return model.Response{}, fmt.Errorf("anthropic: decode response: %w: %w", model.ErrMalformedResponse, err)
	}
	if wire.Type != "message" {
		return model.Response{}, fmt.Errorf("anthropic: response type %q, want \"message\": %w", clip(wire.Type), model.ErrMalformedResponse)
	}
	resp := model.Response{ID: wire.ID, Model: wire.Model}
	var text strings.Builder
	for _, b := range wire.Content {
		switch b.Type {
		case "text":
			text.WriteString(b.Text)
		case "tool_use":
			call := model.ToolCall{ID: b.ID, Name: b.Name, Arguments: string(b.Input)}
			if len(b.Input) == 0 {
				call.ArgumentsError = "tool_use block has no input"
			}
			resp.ToolCalls = append(resp.ToolCalls, call)
		}
		// Other block types (thinking, server tools) carry nothing the
		// agent acts on.
	}
	resp.Text = text.String()
	model.NormalizeToolCalls(resp.ToolCalls)
	if wire.StopReason != nil {
		resp.RawStopReason = *wire.StopReason
	}
	resp.StopReason = stopReason(resp.RawStopReason)
	if u := wire.Usage; u != nil {
		// Anthropic counts cache reads and writes apart from input_tokens;
		// the neutral Usage counts every prompt token as input.
		cached := model.ClampTokens(u.CacheReadInputTokens)
		resp.Usage = model.Usage{
			InputTokens:       model.ClampTokens(u.InputTokens) + model.ClampTokens(u.CacheCreationInputTokens) + cached,
			CachedInputTokens: cached,
			OutputTokens:      model.ClampTokens(u.OutputTokens),
		}
	}
	return resp, nil
}

func stopReason(raw string) model.StopReason {
	switch raw {
	case "end_turn", "stop_sequence":
		return model.StopEndTurn
	case "tool_use":
		return model.StopToolUse
	case "max_tokens":
		return model.StopMaxTokens
	case "refusal":
		return model.StopContentFilter
	}
	return model.StopUnknown
}

func clip(s string) string {
	const n = 100
	if len(s) > n {
		s = s[:n] + "…"
	}
	return strings.ToValidUTF8(s, "")
}
