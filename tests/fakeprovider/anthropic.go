package fakeprovider

import (
	"encoding/json"
	"fmt"
)

type anthropicRequest struct {
	Model     string `json:"model"`
	MaxTokens *int   `json:"max_tokens"`
	System    string `json:"system"`
	Messages  []struct {
		Role    string `json:"role"`
		Content []struct {
			Type      string          `json:"type"`
			Text      string          `json:"text"`
			ID        string          `json:"id"`
			Name      string          `json:"name"`
			Input     json.RawMessage `json:"input"`
			ToolUseID string          `json:"tool_use_id"`
			Content   json.RawMessage `json:"content"`
			IsError   bool            `json:"is_error"`
		} `json:"content"`
	} `json:"messages"`
	Tools []struct {
		Name        string          `json:"name"`
		InputSchema json.RawMessage `json:"input_schema"`
	} `json:"tools"`
}

// decodeAnthropic checks the request the way the real API would and fills
// in rec's decoded fields.
func decodeAnthropic(rec *Request, apiKey string) error {
	if apiKey != "" && rec.Header.Get("X-Api-Key") != apiKey {
		return authError{401, "invalid x-api-key"}
	}
	if rec.Header.Get("Anthropic-Version") == "" {
		return fmt.Errorf("anthropic-version: header is required")
	}
	var req anthropicRequest
	if err := json.Unmarshal(rec.Body, &req); err != nil {
		return fmt.Errorf("invalid JSON body: %v", err)
	}
	rec.Model, rec.System, rec.Messages = req.Model, req.System, len(req.Messages)
	if req.Model == "" {
		return fmt.Errorf("model: Field required")
	}
	if req.MaxTokens == nil || *req.MaxTokens < 1 {
		return fmt.Errorf("max_tokens: Field required (at least 1)")
	}
	rec.MaxTokens, rec.MaxTokensField = *req.MaxTokens, "max_tokens"
	if len(req.Messages) == 0 || req.Messages[0].Role != "user" {
		return fmt.Errorf("messages: first message must use the \"user\" role")
	}
	for _, t := range req.Tools {
		if t.Name == "" || len(t.InputSchema) == 0 {
			return fmt.Errorf("tools: each tool needs a name and an input_schema")
		}
		rec.ToolNames = append(rec.ToolNames, t.Name)
	}

	// tool_use ids of the previous assistant turn must each be answered by
	// a tool_result in the very next user message, and only those.
	var pending map[string]bool
	for i, m := range req.Messages {
		if len(m.Content) == 0 {
			return fmt.Errorf("messages.%d: content must not be empty", i)
		}
		switch m.Role {
		case "assistant":
			if len(pending) > 0 {
				return fmt.Errorf("messages.%d: tool_use ids %s have no tool_result", i, keys(pending))
			}
			pending = map[string]bool{}
			for _, b := range m.Content {
				switch b.Type {
				case "tool_use":
					var obj map[string]json.RawMessage
					if b.ID == "" || b.Name == "" || json.Unmarshal(b.Input, &obj) != nil || obj == nil {
						return fmt.Errorf("messages.%d: tool_use needs id, name and an object input", i)
					}
					pending[b.ID] = true
				case "text":
					if b.Text == "" {
						return fmt.Errorf("messages.%d: text content blocks must be non-empty", i)
					}
				}
			}
		case "user":
			rec.ToolResults = nil
			for _, b := range m.Content {
				if b.Type != "tool_result" {
					continue
				}
				if !pending[b.ToolUseID] {
					return fmt.Errorf("messages.%d: unexpected tool_use_id %q in tool_result blocks", i, b.ToolUseID)
				}
				delete(pending, b.ToolUseID)
				rec.ToolResults = append(rec.ToolResults, ToolResult{CallID: b.ToolUseID, Content: contentString(b.Content), IsError: b.IsError})
			}
			if len(pending) > 0 {
				return fmt.Errorf("messages.%d: tool_use ids %s were found without tool_result blocks immediately after", i, keys(pending))
			}
		default:
			return fmt.Errorf("messages.%d: role %q is not user or assistant", i, m.Role)
		}
	}
	if len(pending) > 0 {
		return fmt.Errorf("tool_use ids %s were not answered", keys(pending))
	}
	return nil
}

func anthropicResponse(t Turn, modelName string, n int) map[string]any {
	content := []any{}
	if t.Text != "" {
		content = append(content, map[string]any{"type": "text", "text": t.Text})
	}
	stop := "end_turn"
	for i, c := range t.ToolCalls {
		stop = "tool_use"
		id := c.ID
		if id == "" {
			id = fmt.Sprintf("toolu_fake_%d_%d", n, i)
		}
		// The real API always sends an object; invalid scripted
		// arguments go out as a JSON string so the body stays JSON.
		var input any = json.RawMessage(c.Arguments)
		if !json.Valid([]byte(c.Arguments)) {
			input = c.Arguments
		}
		content = append(content, map[string]any{"type": "tool_use", "id": id, "name": c.Name, "input": input})
	}
	if t.StopReason != "" {
		stop = t.StopReason
	}
	cached := min(t.Usage.CachedInputTokens, t.Usage.InputTokens)
	return map[string]any{
		"id":            fmt.Sprintf("msg_fake_%d", n),
		"type":          "message",
		"role":          "assistant",
		"model":         modelName,
		"content":       content,
		"stop_reason":   stop,
		"stop_sequence": nil,
		"usage": map[string]any{
			"input_tokens":                t.Usage.InputTokens - cached,
			"output_tokens":               t.Usage.OutputTokens,
			"cache_read_input_tokens":     cached,
			"cache_creation_input_tokens": 0,
		},
	}
}
