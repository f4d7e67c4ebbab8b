package fakeprovider

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func post(t *testing.T, url string, header map[string]string, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("answer is not JSON: %q", raw)
	}
	return resp.StatusCode, out
}

func TestOpenAIWireFormat(t *testing.T) {
	fake := New(Turn{
		ToolCalls: []ToolCall{{Name: "shell", Arguments: `{"command":"ls"}`}, {Name: "shell", Arguments: `{"command":"pwd"}`}},
		Usage:     Usage{InputTokens: 100, OutputTokens: 10, CachedInputTokens: 64},
	})
	srv := httptest.NewServer(fake)
	defer srv.Close()
	status, out := post(t, srv.URL+"/v1/chat/completions", nil,
		`{"model":"m","max_completion_tokens":64,"messages":[{"role":"user","content":"hi"}]}`)
	if status != 200 {
		t.Fatalf("HTTP %d: %v", status, out)
	}
	choice := out["choices"].([]any)[0].(map[string]any)
	calls := choice["message"].(map[string]any)["tool_calls"].([]any)
	first := calls[0].(map[string]any)
	if choice["finish_reason"] != "tool_calls" || len(calls) != 2 || first["type"] != "function" ||
		first["function"].(map[string]any)["arguments"] != `{"command":"ls"}` || first["id"] == calls[1].(map[string]any)["id"] {
		t.Errorf("choice = %v", choice)
	}
	usage := out["usage"].(map[string]any)
	if usage["prompt_tokens"] != 100.0 || usage["total_tokens"] != 110.0 || usage["prompt_tokens_details"].(map[string]any)["cached_tokens"] != 64.0 {
		t.Errorf("usage = %v", usage)
	}
	if r := fake.Requests()[0]; r.MaxTokens != 64 || r.MaxTokensField != "max_completion_tokens" {
		t.Errorf("recorded %s=%d", r.MaxTokensField, r.MaxTokens)
	}
}

func TestAnthropicWireFormat(t *testing.T) {
	fake := New(Turn{
		Text:      "checking",
		ToolCalls: []ToolCall{{ID: "toolu_1", Name: "shell", Arguments: `{"command":"ls"}`}},
		Usage:     Usage{InputTokens: 100, OutputTokens: 10, CachedInputTokens: 64},
	})
	srv := httptest.NewServer(fake)
	defer srv.Close()
	status, out := post(t, srv.URL+"/v1/messages", map[string]string{"anthropic-version": "2023-06-01"},
		`{"model":"m","max_tokens":64,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`)
	if status != 200 {
		t.Fatalf("HTTP %d: %v", status, out)
	}
	content := out["content"].([]any)
	if out["type"] != "message" || out["stop_reason"] != "tool_use" || len(content) != 2 ||
		content[1].(map[string]any)["input"].(map[string]any)["command"] != "ls" {
		t.Errorf("message = %v", out)
	}
	usage := out["usage"].(map[string]any)
	if usage["input_tokens"] != 36.0 || usage["cache_read_input_tokens"] != 64.0 {
		t.Errorf("usage = %v, want cache reads apart from input_tokens", usage)
	}
}

func TestRefusesWhatTheRealAPIsRefuse(t *testing.T) {
	const toolCallThenUser = `{"model":"m","messages":[{"role":"user","content":"hi"},
		{"role":"assistant","content":null,"tool_calls":[{"id":"a","type":"function","function":{"name":"shell","arguments":"{}"}}]},
		{"role":"user","content":"skip it"}]}`
	tests := []struct {
		name, path string
		header     map[string]string
		body       string
		want       int
	}{
		{"openai wrong key", "/v1/chat/completions", map[string]string{"Authorization": "Bearer nope"}, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, 401},
		{"openai unanswered tool call", "/v1/chat/completions", map[string]string{"Authorization": "Bearer k"}, toolCallThenUser, 400},
		{"openai result for no call", "/v1/chat/completions", map[string]string{"Authorization": "Bearer k"},
			`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"tool","tool_call_id":"x","content":"out"}]}`, 400},
		{"openai both token fields", "/v1/chat/completions", map[string]string{"Authorization": "Bearer k"},
			`{"model":"m","max_tokens":1,"max_completion_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, 400},
		{"anthropic no version", "/v1/messages", map[string]string{"X-Api-Key": "k"},
			`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`, 400},
		{"anthropic no max_tokens", "/v1/messages", map[string]string{"X-Api-Key": "k", "Anthropic-Version": "2023-06-01"},
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`, 400},
		{"anthropic tool_use input not an object", "/v1/messages", map[string]string{"X-Api-Key": "k", "Anthropic-Version": "2023-06-01"},
			`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]},
			{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"shell","input":"ls"}]},
			{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"x"}]}]}`, 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := New(Turn{Text: "unused"})
			fake.APIKey = "k"
			srv := httptest.NewServer(fake)
			defer srv.Close()
			status, out := post(t, srv.URL+tt.path, tt.header, tt.body)
			if status != tt.want {
				t.Errorf("HTTP %d (%v), want %d", status, out, tt.want)
			}
			if _, ok := out["error"].(map[string]any); !ok {
				t.Errorf("error body %v has no error object", out)
			}
			if fake.Remaining() != 1 {
				t.Error("a refused request used up a turn")
			}
		})
	}
}

func TestScriptedFailuresAndExhaustion(t *testing.T) {
	fake := New(Turn{Status: 429, RetryAfter: "3"}, Turn{RawBody: `{"choices": [`})
	srv := httptest.NewServer(fake)
	defer srv.Close()
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`

	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "3" {
		t.Errorf("HTTP %d Retry-After %q, want 429 and 3", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	resp, err = http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(raw) != `{"choices": [` {
		t.Errorf("raw turn: HTTP %d %q", resp.StatusCode, raw)
	}
	status, out := post(t, srv.URL+"/v1/chat/completions", nil, body)
	if status != 400 || !strings.Contains(out["error"].(map[string]any)["message"].(string), "exhausted after 2 turns") {
		t.Errorf("after the script: HTTP %d %v", status, out)
	}
	if got := fake.Requests(); len(got) != 3 || got[0].Status != 429 || got[2].Status != 400 {
		t.Errorf("recorded %d requests", len(got))
	}
}
