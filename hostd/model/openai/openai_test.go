package openai

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/model"
	"github.com/ephemeralhq/ephemeral/hostd/model/httpcall"
	"github.com/ephemeralhq/ephemeral/tests/fakeprovider"
)

const testKey = "sk-test-123"

var shellTool = model.Tool{
	Name:        "shell",
	Description: "Run a bash command in the sandbox.",
	InputSchema: json.RawMessage(`{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}`),
}

// newClient serves fake on a local listener and returns a client for it
// with fast backoff.
func newClient(t *testing.T, fake *fakeprovider.Server, cfg Config) *Client {
	t.Helper()
	fake.APIKey = testKey
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	cfg.BaseURL = srv.URL + "/v1"
	if cfg.APIKey == "" {
		cfg.APIKey = testKey
	}
	cfg.HTTP = httpcall.Client{BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func userRequest(text string) model.Request {
	return model.Request{
		Model:     "openai/gpt-6-luna",
		System:    "You are in a sandbox.",
		Messages:  []model.Message{{Role: model.RoleUser, Text: text}},
		Tools:     []model.Tool{shellTool},
		MaxTokens: 512,
	}
}

func TestParallelToolCallsRoundTrip(t *testing.T) {
	fake := fakeprovider.New(
		fakeprovider.Turn{
			ToolCalls: []fakeprovider.ToolCall{
				{ID: "call_pwd", Name: "shell", Arguments: `{"command":"pwd; whoami"}`},
				{ID: "call_curl", Name: "shell", Arguments: `{"command":"curl -sS https://example.com"}`},
			},
			Usage: fakeprovider.Usage{InputTokens: 1200, OutputTokens: 80, CachedInputTokens: 1024},
		},
		fakeprovider.Turn{Text: "The sandbox works.", Usage: fakeprovider.Usage{InputTokens: 1500, OutputTokens: 20}},
	)
	c := newClient(t, fake, Config{})
	ctx := context.Background()

	req := userRequest("Test the sandbox.")
	resp, err := c.Complete(ctx, req)
	if err != nil {
		t.Fatalf("turn 1: %v", err)
	}
	if resp.StopReason != model.StopToolUse || len(resp.ToolCalls) != 2 {
		t.Fatalf("turn 1: stop %q with %d calls, want tool_use with 2", resp.StopReason, len(resp.ToolCalls))
	}
	if c0 := resp.ToolCalls[0]; c0.ID != "call_pwd" || c0.Name != "shell" || c0.Arguments != `{"command":"pwd; whoami"}` || c0.ArgumentsError != "" {
		t.Errorf("first call = %+v", c0)
	}
	if want := (model.Usage{InputTokens: 1200, CachedInputTokens: 1024, OutputTokens: 80}); resp.Usage != want {
		t.Errorf("usage = %+v, want %+v", resp.Usage, want)
	}

	req.Messages = append(req.Messages,
		model.Message{Role: model.RoleAssistant, ToolCalls: resp.ToolCalls},
		model.Message{Role: model.RoleTool, ToolResults: []model.ToolResult{
			{CallID: "call_curl", Content: "curl: (6) Could not resolve host: example.com", IsError: true},
			{CallID: "call_pwd", Content: "/tmp/ephemeral-run-x/scratch\nworker\n"},
		}})
	resp, err = c.Complete(ctx, req)
	if err != nil {
		t.Fatalf("turn 2: %v", err)
	}
	if resp.Text != "The sandbox works." || resp.StopReason != model.StopEndTurn || len(resp.ToolCalls) != 0 {
		t.Errorf("turn 2 = %+v", resp)
	}

	got := fake.Requests()
	if len(got) != 2 {
		t.Fatalf("fake received %d requests, want 2", len(got))
	}
	second := got[1]
	if second.Status != 200 {
		t.Fatalf("fake refused the second request: %s", second.Body)
	}
	wantResults := []fakeprovider.ToolResult{
		{CallID: "call_curl", Content: "Error: curl: (6) Could not resolve host: example.com"},
		{CallID: "call_pwd", Content: "/tmp/ephemeral-run-x/scratch\nworker\n"},
	}
	if len(second.ToolResults) != 2 || second.ToolResults[0] != wantResults[0] || second.ToolResults[1] != wantResults[1] {
		t.Errorf("tool results sent = %+v, want %+v", second.ToolResults, wantResults)
	}
	if second.System != "You are in a sandbox." || second.Model != "openai/gpt-6-luna" ||
		len(second.ToolNames) != 1 || second.ToolNames[0] != "shell" || second.Messages != 5 {
		t.Errorf("second request: system %q model %q tools %v messages %d", second.System, second.Model, second.ToolNames, second.Messages)
	}
	if second.MaxTokens != 512 || second.MaxTokensField != FieldMaxTokens {
		t.Errorf("sent %s=%d, want max_tokens=512", second.MaxTokensField, second.MaxTokens)
	}
	if auth := second.Header.Get("Authorization"); auth != "Bearer "+testKey {
		t.Errorf("Authorization = %q", auth)
	}
}

func TestMaxCompletionTokensField(t *testing.T) {
	fake := fakeprovider.New(fakeprovider.Turn{Text: "ok"})
	c := newClient(t, fake, Config{MaxTokensField: FieldMaxCompletionTokens})
	if _, err := c.Complete(context.Background(), userRequest("hi")); err != nil {
		t.Fatal(err)
	}
	if r := fake.Requests()[0]; r.MaxTokensField != FieldMaxCompletionTokens || r.MaxTokens != 512 {
		t.Errorf("sent %s=%d, want max_completion_tokens=512", r.MaxTokensField, r.MaxTokens)
	}
}

func TestDefaultMaxTokensFieldFollowsBaseURL(t *testing.T) {
	for base, want := range map[string]string{
		"":                             FieldMaxCompletionTokens,
		DefaultBaseURL + "/":           FieldMaxCompletionTokens,
		"https://openrouter.ai/api/v1": FieldMaxTokens,
		"http://127.0.0.1:11434/v1":    FieldMaxTokens,
	} {
		c, err := New(Config{BaseURL: base})
		if err != nil {
			t.Fatal(err)
		}
		if c.maxTokensField != want {
			t.Errorf("base %q: field %q, want %q", base, c.maxTokensField, want)
		}
	}
	if _, err := New(Config{MaxTokensField: "max_output_tokens"}); err == nil {
		t.Error("unknown max tokens field accepted")
	}
	if _, err := New(Config{BaseURL: "ftp://x"}); err == nil {
		t.Error("non-HTTP base URL accepted")
	}
}

func TestWrongKeyIsNotRetried(t *testing.T) {
	fake := fakeprovider.New(fakeprovider.Turn{Text: "never"})
	c := newClient(t, fake, Config{APIKey: "sk-wrong"})
	_, err := c.Complete(context.Background(), userRequest("hi"))
	var apiErr *model.APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || apiErr.Type != "authentication_error" {
		t.Fatalf("err = %v, want a 401 APIError", err)
	}
	if n := len(fake.Requests()); n != 1 || fake.Remaining() != 1 {
		t.Errorf("%d requests, %d turns left; want 1 request and the turn unused", n, fake.Remaining())
	}
}

func TestRateLimitThenSuccessHonoursRetryAfter(t *testing.T) {
	fake := fakeprovider.New(
		fakeprovider.Turn{Status: 429, RetryAfter: "1"},
		fakeprovider.Turn{Text: "done", Usage: fakeprovider.Usage{InputTokens: 10, OutputTokens: 2}},
	)
	c := newClient(t, fake, Config{})
	var retries []model.Retry
	req := userRequest("hi")
	req.BeforeRetry = func(_ context.Context, r model.Retry) error { retries = append(retries, r); return nil }
	resp, err := c.Complete(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Text != "done" || resp.Usage.Total() != 12 {
		t.Errorf("resp = %+v", resp)
	}
	if len(retries) != 1 || retries[0].Wait != time.Second {
		t.Errorf("retries = %+v, want one waiting the Retry-After second", retries)
	}
	if got := fake.Requests(); len(got) != 2 || got[0].Status != 429 {
		t.Errorf("fake saw %d requests", len(got))
	}
}

func TestTimeoutStopsRetries(t *testing.T) {
	fake := fakeprovider.New(
		fakeprovider.Turn{Status: 500},
		fakeprovider.Turn{Text: "too late", DelayMillis: 60_000},
		fakeprovider.Turn{Text: "never reached"},
	)
	c := newClient(t, fake, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := c.Complete(ctx, userRequest("hi"))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	if fake.Remaining() != 1 {
		t.Errorf("%d turns left, want 1: the client must stop retrying at the deadline", fake.Remaining())
	}
}

func TestMalformedToolArgumentsAreFlagged(t *testing.T) {
	fake := fakeprovider.New(fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{
		{ID: "ok", Name: "shell", Arguments: `{"command":"ls"}`},
		{ID: "bad", Name: "shell", Arguments: `{"command": "ls`},
	}})
	c := newClient(t, fake, Config{})
	resp, err := c.Complete(context.Background(), userRequest("hi"))
	if err != nil {
		t.Fatalf("one bad call failed the whole turn: %v", err)
	}
	if len(resp.ToolCalls) != 2 || resp.ToolCalls[0].ArgumentsError != "" {
		t.Fatalf("calls = %+v", resp.ToolCalls)
	}
	bad := resp.ToolCalls[1]
	if bad.ArgumentsError == "" || bad.Arguments != `{"command": "ls` {
		t.Errorf("bad call = %+v, want raw arguments kept and an error", bad)
	}
}

func TestHostileResponses(t *testing.T) {
	tests := []struct {
		name    string
		turn    fakeprovider.Turn
		wantErr error
	}{
		{"not JSON", fakeprovider.Turn{RawBody: `{"choices": [`}, model.ErrMalformedResponse},
		{"no choices", fakeprovider.Turn{RawBody: `{"id":"x","choices":[]}`}, model.ErrMalformedResponse},
		{"error inside 200", fakeprovider.Turn{RawBody: `{"error":{"message":"upstream failed","code":502}}`}, model.ErrMalformedResponse},
		{"content of wrong type", fakeprovider.Turn{RawBody: `{"choices":[{"message":{"content":42},"finish_reason":"stop"}]}`}, model.ErrMalformedResponse},
		{"huge body", fakeprovider.Turn{Text: strings.Repeat("a", 4096)}, model.ErrResponseTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := fakeprovider.New(tt.turn)
			c := newClient(t, fake, Config{})
			c.http.MaxResponseBytes = 2048
			_, err := c.Complete(context.Background(), userRequest("hi"))
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("err = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func TestUnknownFinishReasonIsFlagged(t *testing.T) {
	fake := fakeprovider.New(fakeprovider.Turn{Text: "hm", StopReason: "cosmic_ray"})
	c := newClient(t, fake, Config{})
	resp, err := c.Complete(context.Background(), userRequest("hi"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StopReason != model.StopUnknown || resp.RawStopReason != "cosmic_ray" {
		t.Errorf("stop = %q (%q), want unknown with the raw reason", resp.StopReason, resp.RawStopReason)
	}
}
