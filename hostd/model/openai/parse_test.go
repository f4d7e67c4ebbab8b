package openai

import (
	"errors"
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/model"
)

var parseCases = []struct {
	name string
	body string
	// check inspects a successful parse; nil means an error is expected.
	check func(t *testing.T, r model.Response)
}{
	{"text", `{"id":"c1","model":"m","choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`,
		func(t *testing.T, r model.Response) {
			if r.Text != "hi" || r.StopReason != model.StopEndTurn || r.Usage.Total() != 4 {
				t.Errorf("%+v", r)
			}
		}},
	{"content parts", `{"choices":[{"message":{"content":[{"type":"text","text":"a"},{"type":"image_url"},{"type":"text","text":"b"}]},"finish_reason":"length"}]}`,
		func(t *testing.T, r model.Response) {
			if r.Text != "ab" || r.StopReason != model.StopMaxTokens {
				t.Errorf("%+v", r)
			}
		}},
	{"refusal", `{"choices":[{"message":{"content":null,"refusal":"I can't."},"finish_reason":"content_filter"}]}`,
		func(t *testing.T, r model.Response) {
			if r.Text != "I can't." || r.StopReason != model.StopContentFilter {
				t.Errorf("%+v", r)
			}
		}},
	{"arguments as object (local server)", `{"choices":[{"message":{"tool_calls":[{"id":"a","type":"function","function":{"name":"shell","arguments":{"command":"ls"}}}]},"finish_reason":"stop"}]}`,
		func(t *testing.T, r model.Response) {
			if len(r.ToolCalls) != 1 || r.ToolCalls[0].Arguments != `{"command":"ls"}` || r.ToolCalls[0].ArgumentsError != "" || r.StopReason != model.StopToolUse {
				t.Errorf("%+v", r)
			}
		}},
	{"missing ids and arguments", `{"choices":[{"message":{"tool_calls":[{"function":{"name":"shell"}},{"type":"retrieval","function":{"name":"x","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`,
		func(t *testing.T, r model.Response) {
			if len(r.ToolCalls) != 2 || r.ToolCalls[0].ID == "" || r.ToolCalls[0].ID == r.ToolCalls[1].ID ||
				r.ToolCalls[0].ArgumentsError == "" || !strings.Contains(r.ToolCalls[1].ArgumentsError, "retrieval") {
				t.Errorf("%+v", r.ToolCalls)
			}
		}},
	{"hostile usage", `{"choices":[{"message":{"content":"x"},"finish_reason":null}],"usage":{"prompt_tokens":-5,"completion_tokens":9223372036854775807,"prompt_tokens_details":{"cached_tokens":99}}}`,
		func(t *testing.T, r model.Response) {
			if r.Usage.InputTokens != 0 || r.Usage.CachedInputTokens != 0 || r.Usage.OutputTokens <= 0 || r.StopReason != model.StopUnknown {
				t.Errorf("%+v", r)
			}
		}},
	{"not JSON", `<html>`, nil},
	{"choices not a list", `{"choices":{}}`, nil},
	{"empty", ``, nil},
}

func TestParseResponse(t *testing.T) {
	for _, tt := range parseCases {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseResponse([]byte(tt.body))
			if tt.check == nil {
				if !errors.Is(err, model.ErrMalformedResponse) {
					t.Errorf("err = %v, want ErrMalformedResponse", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, r)
		})
	}
}

func FuzzParseResponse(f *testing.F) {
	for _, tt := range parseCases {
		f.Add([]byte(tt.body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseResponse(body)
		if err != nil {
			if !errors.Is(err, model.ErrMalformedResponse) {
				t.Fatalf("error %v does not wrap ErrMalformedResponse", err)
			}
			return
		}
		checkResponseInvariants(t, r)
	})
}

// checkResponseInvariants holds for every response the agent can receive,
// whatever the server sent.
func checkResponseInvariants(t *testing.T, r model.Response) {
	t.Helper()
	if r.Usage.InputTokens < 0 || r.Usage.OutputTokens < 0 || r.Usage.CachedInputTokens < 0 || r.Usage.CachedInputTokens > r.Usage.InputTokens {
		t.Fatalf("usage %+v", r.Usage)
	}
	ids := map[string]bool{}
	for _, c := range r.ToolCalls {
		if c.ID == "" || ids[c.ID] {
			t.Fatalf("tool call id %q empty or repeated", c.ID)
		}
		ids[c.ID] = true
		if c.ArgumentsError == "" && model.CheckArguments(c.Arguments) != "" {
			t.Fatalf("unflagged bad arguments %q", c.Arguments)
		}
	}
}

func BenchmarkParseResponseParallelToolCalls(b *testing.B) {
	body := []byte(`{"id":"c","model":"m","choices":[{"message":{"role":"assistant","content":null,"tool_calls":[` +
		`{"id":"call_1","type":"function","function":{"name":"shell","arguments":"{\"command\":\"pwd; whoami\"}"}},` +
		`{"id":"call_2","type":"function","function":{"name":"shell","arguments":"{\"command\":\"curl -sS -m 8 https://example.com\"}"}}]},` +
		`"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":1500,"completion_tokens":120,"prompt_tokens_details":{"cached_tokens":1024}}}`)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := ParseResponse(body); err != nil {
			b.Fatal(err)
		}
	}
}
