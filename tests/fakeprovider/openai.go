package fakeprovider

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

type openAIRequest struct {
	Model               string `json:"model"`
	MaxTokens           *int   `json:"max_tokens"`
	MaxCompletionTokens *int   `json:"max_completion_tokens"`
	Messages            []struct {
		Role       string          `json:"role"`
		Content    json.RawMessage `json:"content"`
		ToolCallID string          `json:"tool_call_id"`
		ToolCalls  []struct {
			ID       string `json:"id"`
			Type     string `json:"type"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	} `json:"messages"`
	Tools []struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
}

// decodeOpenAI checks the request the way the real API would and fills in
// rec's decoded fields.
func decodeOpenAI(rec *Request, apiKey string) error {
	if apiKey != "" && rec.Header.Get("Authorization") != "Bearer "+apiKey {
		return authError{401, "Incorrect API key provided."}
	}
	var req openAIRequest
	if err := json.Unmarshal(rec.Body, &req); err != nil {
		//lint:ignore ST1005 OpenAI's own wording, capital included
		return fmt.Errorf("We could not parse the JSON body of your request: %v", err)
	}
	rec.Model = req.Model
	if req.Model == "" {
		return fmt.Errorf("you must provide a model parameter")
	}
	if len(req.Messages) == 0 {
		return fmt.Errorf("'messages' must contain at least one message")
	}
	switch {
	case req.MaxTokens != nil && req.MaxCompletionTokens != nil:
		return fmt.Errorf("max_tokens and max_completion_tokens cannot both be set")
	case req.MaxTokens != nil:
		rec.MaxTokens, rec.MaxTokensField = *req.MaxTokens, "max_tokens"
	case req.MaxCompletionTokens != nil:
		rec.MaxTokens, rec.MaxTokensField = *req.MaxCompletionTokens, "max_completion_tokens"
	}
	rec.Messages = len(req.Messages)
	for _, t := range req.Tools {
		if t.Type != "function" {
			return fmt.Errorf("tools: type %q is not supported", t.Type)
		}
		rec.ToolNames = append(rec.ToolNames, t.Function.Name)
	}

	// Every assistant tool call must be answered by a tool message right
	// after it, and every tool message must answer one of those calls.
	var pending map[string]bool
	for i, m := range req.Messages {
		switch m.Role {
		case "system", "developer", "user", "assistant":
			if len(pending) > 0 {
				return fmt.Errorf("messages[%d]: an assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id' (missing %s)", i, keys(pending))
			}
			if i == 0 && (m.Role == "system" || m.Role == "developer") {
				rec.System = contentString(m.Content)
			}
			if m.Role == "assistant" {
				pending = map[string]bool{}
				for _, c := range m.ToolCalls {
					if c.ID == "" || c.Type != "function" || c.Function.Name == "" {
						return fmt.Errorf("messages[%d]: tool call needs id, type function and a name", i)
					}
					pending[c.ID] = true
				}
			}
			rec.ToolResults = nil
		case "tool":
			if !pending[m.ToolCallID] {
				return fmt.Errorf("messages[%d]: messages with role 'tool' must be a response to a preceding message with 'tool_calls' (id %q)", i, m.ToolCallID)
			}
			delete(pending, m.ToolCallID)
			rec.ToolResults = append(rec.ToolResults, ToolResult{CallID: m.ToolCallID, Content: contentString(m.Content)})
		default:
			return fmt.Errorf("messages[%d]: invalid role %q", i, m.Role)
		}
	}
	if len(pending) > 0 {
		return fmt.Errorf("tool calls %s were not answered", keys(pending))
	}
	return nil
}

func contentString(raw json.RawMessage) string {
	var s string
	_ = json.Unmarshal(raw, &s)
	return s
}

func keys(m map[string]bool) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return strings.Join(ks, ", ")
}

func openAIResponse(t Turn, modelName string, n int) map[string]any {
	message := map[string]any{"role": "assistant", "content": nil}
	if t.Text != "" {
		message["content"] = t.Text
	}
	finish := "stop"
	if len(t.ToolCalls) > 0 {
		finish = "tool_calls"
		var calls []map[string]any
		for i, c := range t.ToolCalls {
			id := c.ID
			if id == "" {
				id = fmt.Sprintf("call_fake_%d_%d", n, i)
			}
			calls = append(calls, map[string]any{
				"id": id, "type": "function",
				"function": map[string]any{"name": c.Name, "arguments": c.Arguments},
			})
		}
		message["tool_calls"] = calls
	}
	if t.StopReason != "" {
		finish = t.StopReason
	}
	return map[string]any{
		"id":      fmt.Sprintf("chatcmpl-fake-%d", n),
		"object":  "chat.completion",
		"created": time.Now().Unix(),
		"model":   modelName,
		"choices": []any{map[string]any{"index": 0, "message": message, "finish_reason": finish}},
		"usage": map[string]any{
			"prompt_tokens":         t.Usage.InputTokens,
			"completion_tokens":     t.Usage.OutputTokens,
			"total_tokens":          t.Usage.InputTokens + t.Usage.OutputTokens,
			"prompt_tokens_details": map[string]any{"cached_tokens": t.Usage.CachedInputTokens},
		},
	}
}
