package anthropic

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

const testKey = "sk-ant-test"

var shellTool = model.Tool{
	Name:        "shell",
	Description: "Run a bash command in the sandbox.",
	InputSchema: json.RawMessage(`{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}`),
}

func newClient(t *testing.T, fake *fakeprovider.Server, cfg Config) *Client {
	t.Helper()
	fake.APIKey = testKey
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	cfg.BaseURL = srv.URL
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
		Model:     "claude-haiku-4-5",
		System:    "You are in a sandbox.",
		Messages:  []model.Message{{Role: model.RoleUser, Text: text}},
		Tools:     []model.Tool{shellTool},
		MaxTokens: 700,
	}
}

func TestParallelToolUseRoundTrip(t *testing.T) {
	fake := fakeprovider.New(
		fakeprovider.Turn{
			Text: "Let me look.",
			ToolCalls: []fakeprovider.ToolCall{
				{ID: "toolu_pwd", Name: "shell", Arguments: `{"command":"pwd; whoami"}`},
				{ID: "toolu_curl", Name: "shell", Arguments: `{"command":"curl -sS https://example.com"}`},
			},
			Usage: fakeprovider.Usage{InputTokens: 1500, CachedInputTokens: 1000, OutputTokens: 90},
		},
		fakeprovider.Turn{Text: "Done.", Usage: fakeprovider.Usage{InputTokens: 1700, OutputTokens: 5}},
	)
	c := newClient(t, fake, Config{})
	ctx := context.Background()

	req := userRequest("Test the sandbox.")
	resp, err := c.Complete(ctx, req)
	if err != nil {
		t.Fatalf("turn 1: %v", err)
	}
	if resp.Text != "Let me look." || resp.StopReason != model.StopToolUse || len(resp.ToolCalls) != 2 {
		t.Fatalf("turn 1 = %+v", resp)
	}
	if c1 := resp.ToolCalls[1]; c1.ID != "toolu_curl" || c1.Name != "shell" || c1.Arguments != `{"command":"curl -sS https://example.com"}` || c1.ArgumentsError != "" {
		t.Errorf("second call = %+v", c1)
	}
	// Anthropic reports cache reads apart from input_tokens; the neutral
	// usage counts all prompt tokens as input.
	if want := (model.Usage{InputTokens: 1500, CachedInputTokens: 1000, OutputTokens: 90}); resp.Usage != want {
		t.Errorf("usage = %+v, want %+v", resp.Usage, want)
	}

	req.Messages = append(req.Messages,
		model.Message{Role: model.RoleAssistant, Text: resp.Text, ToolCalls: resp.ToolCalls},
		model.Message{Role: model.RoleTool, ToolResults: []model.ToolResult{
			{CallID: "toolu_pwd", Content: "/tmp/ephemeral-run-x/scratch\nworker\n"},
			{CallID: "toolu_curl", Content: "curl: (6) Could not resolve host: example.com", IsError: true},
		}})
	resp, err = c.Complete(ctx, req)
	if err != nil {
		t.Fatalf("turn 2: %v", err)
	}
	if resp.Text != "Done." || resp.StopReason != model.StopEndTurn {
		t.Errorf("turn 2 = %+v", resp)
	}

	got := fake.Requests()
	if len(got) != 2 || got[1].Status != 200 {
		t.Fatalf("fake received %d requests (last refused?)", len(got))
	}
	second := got[1]
	wantResults := []fakeprovider.ToolResult{
		{CallID: "toolu_pwd", Content: "/tmp/ephemeral-run-x/scratch\nworker\n"},
		{CallID: "toolu_curl", Content: "curl: (6) Could not resolve host: example.com", IsError: true},
	}
	if len(second.ToolResults) != 2 || second.ToolResults[0] != wantResults[0] || second.ToolResults[1] != wantResults[1] {
		t.Errorf("tool results sent = %+v, want %+v", second.ToolResults, wantResults)
	}
	if second.MaxTokens != 700 || second.System != "You are in a sandbox." || second.Messages != 3 {
		t.Errorf("second request: max_tokens %d system %q messages %d", second.MaxTokens, second.System, second.Messages)
	}
	if second.Header.Get("X-Api-Key") != testKey || second.Header.Get("Anthropic-Version") != APIVersion {
		t.Errorf("headers: x-api-key %q anthropic-version %q", second.Header.Get("X-Api-Key"), second.Header.Get("Anthropic-Version"))
	}
	if second.Header.Get("Authorization") != "" {
		t.Error("Anthropic request carries an Authorization header")
	}
}

func TestDefaultMaxTokens(t *testing.T) {
	fake := fakeprovider.New(fakeprovider.Turn{Text: "ok"})
	c := newClient(t, fake, Config{})
	req := userRequest("hi")
	req.MaxTokens = 0
	if _, err := c.Complete(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if got := fake.Requests()[0].MaxTokens; got != DefaultMaxTokens {
		t.Errorf("max_tokens = %d, want the default %d", got, DefaultMaxTokens)
	}
}

func TestBadToolCallIsSentBackAsEmptyInput(t *testing.T) {
	// The model's malformed call is answered with a tool error; the API
	// only accepts an object as tool_use input, so the history must still
	// be valid for the next turn.
	fake := fakeprovider.New(
		fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{{ID: "toolu_bad", Name: "shell", Arguments: `{"command": "ls`}}},
		fakeprovider.Turn{Text: "sorry"},
	)
	c := newClient(t, fake, Config{})
	req := userRequest("hi")
	resp, err := c.Complete(context.Background(), req)
	if err != nil {
		t.Fatalf("a bad call failed the whole turn: %v", err)
	}
	bad := resp.ToolCalls[0]
	// The fake, like a broken server, sent the input as a JSON string.
	if bad.ArgumentsError == "" || bad.Arguments != `"{\"command\": \"ls"` {
		t.Fatalf("bad call = %+v, want raw arguments and an error", bad)
	}
	req.Messages = append(req.Messages,
		model.Message{Role: model.RoleAssistant, ToolCalls: resp.ToolCalls},
		model.Message{Role: model.RoleTool, ToolResults: []model.ToolResult{{CallID: bad.ID, Content: bad.ArgumentsError, IsError: true}}})
	if _, err := c.Complete(context.Background(), req); err != nil {
		t.Fatalf("turn after the bad call: %v", err)
	}
}

func TestWrongKeyIsNotRetried(t *testing.T) {
	fake := fakeprovider.New(fakeprovider.Turn{Text: "never"})
	c := newClient(t, fake, Config{APIKey: "sk-ant-wrong"})
	_, err := c.Complete(context.Background(), userRequest("hi"))
	var apiErr *model.APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || apiErr.Provider != "anthropic" {
		t.Fatalf("err = %v, want a 401 APIError", err)
	}
	if len(fake.Requests()) != 1 {
		t.Errorf("%d requests, want 1", len(fake.Requests()))
	}
}

func TestOverloadedThenSuccessHonoursRetryAfter(t *testing.T) {
	fake := fakeprovider.New(
		fakeprovider.Turn{Status: 529},
		fakeprovider.Turn{Status: 429, RetryAfter: "1"},
		fakeprovider.Turn{Text: "done"},
	)
	c := newClient(t, fake, Config{})
	var waits []time.Duration
	req := userRequest("hi")
	req.BeforeRetry = func(_ context.Context, r model.Retry) error { waits = append(waits, r.Wait); return nil }
	resp, err := c.Complete(context.Background(), req)
	if err != nil || resp.Text != "done" {
		t.Fatalf("resp %+v, err %v", resp, err)
	}
	if len(waits) != 2 || waits[1] != time.Second {
		t.Errorf("waits = %v, want a backoff then the Retry-After second", waits)
	}
}

func TestTimeoutStopsSlowResponse(t *testing.T) {
	fake := fakeprovider.New(fakeprovider.Turn{Text: "too late", DelayMillis: 60_000}, fakeprovider.Turn{Text: "never"})
	c := newClient(t, fake, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := c.Complete(ctx, userRequest("hi")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	if fake.Remaining() != 1 {
		t.Errorf("%d turns left, want 1", fake.Remaining())
	}
}

func TestHostileResponses(t *testing.T) {
	tests := []struct {
		name    string
		turn    fakeprovider.Turn
		wantErr error
	}{
		{"not JSON", fakeprovider.Turn{RawBody: `{"content": [`}, model.ErrMalformedResponse},
		{"error object in 200", fakeprovider.Turn{RawBody: `{"type":"error","error":{"type":"api_error","message":"x"}}`}, model.ErrMalformedResponse},
		{"content not a list", fakeprovider.Turn{RawBody: `{"type":"message","content":"hi"}`}, model.ErrMalformedResponse},
		{"huge body", fakeprovider.Turn{Text: strings.Repeat("a", 4096)}, model.ErrResponseTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := fakeprovider.New(tt.turn)
			c := newClient(t, fake, Config{})
			c.http.MaxResponseBytes = 2048
			if _, err := c.Complete(context.Background(), userRequest("hi")); !errors.Is(err, tt.wantErr) {
				t.Errorf("err = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func TestUnknownStopReasonIsFlagged(t *testing.T) {
	fake := fakeprovider.New(fakeprovider.Turn{Text: "paused", StopReason: "pause_turn"})
	c := newClient(t, fake, Config{})
	resp, err := c.Complete(context.Background(), userRequest("hi"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StopReason != model.StopUnknown || resp.RawStopReason != "pause_turn" {
		t.Errorf("stop %q (%q)", resp.StopReason, resp.RawStopReason)
	}
}
