package anthropic

import (
	"errors"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/model"
)

var parseCases = []struct {
	name  string
	body  string
	check func(t *testing.T, r model.Response) // nil: an error is expected
}{
	{"text and tool use", `{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[{"type":"thinking","thinking":"..."},{"type":"text","text":"ok"},{"type":"tool_use","id":"t1","name":"shell","input":{"command":"ls"}}],"stop_reason":"tool_use","usage":{"input_tokens":10,"output_tokens":5,"cache_read_input_tokens":20,"cache_creation_input_tokens":3}}`,
		func(t *testing.T, r model.Response) {
			want := model.Usage{InputTokens: 33, CachedInputTokens: 20, OutputTokens: 5}
			if r.Text != "ok" || len(r.ToolCalls) != 1 || r.ToolCalls[0].Arguments != `{"command":"ls"}` || r.StopReason != model.StopToolUse || r.Usage != want {
				t.Errorf("%+v", r)
			}
		}},
	{"input not an object", `{"type":"message","content":[{"type":"tool_use","id":"t1","name":"shell","input":"ls -l"},{"type":"tool_use","id":"t1","name":"shell"}],"stop_reason":"tool_use"}`,
		func(t *testing.T, r model.Response) {
			if len(r.ToolCalls) != 2 || r.ToolCalls[0].ArgumentsError == "" || r.ToolCalls[1].ArgumentsError == "" || r.ToolCalls[0].ID == r.ToolCalls[1].ID {
				t.Errorf("%+v", r.ToolCalls)
			}
		}},
	{"max tokens", `{"type":"message","content":[{"type":"text","text":"cut"}],"stop_reason":"max_tokens"}`,
		func(t *testing.T, r model.Response) {
			if r.StopReason != model.StopMaxTokens {
				t.Errorf("%+v", r)
			}
		}},
	{"hostile usage", `{"type":"message","content":[],"stop_reason":"end_turn","usage":{"input_tokens":9223372036854775807,"cache_read_input_tokens":9223372036854775807,"cache_creation_input_tokens":-1,"output_tokens":-1}}`,
		func(t *testing.T, r model.Response) {
			if r.Usage.InputTokens <= 0 || r.Usage.OutputTokens != 0 || r.Usage.CachedInputTokens > r.Usage.InputTokens {
				t.Errorf("%+v", r.Usage)
			}
		}},
	{"wrong type", `{"type":"completion","completion":"hi"}`, nil},
	{"not JSON", `]`, nil},
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
		u := r.Usage
		if u.InputTokens < 0 || u.OutputTokens < 0 || u.CachedInputTokens < 0 || u.CachedInputTokens > u.InputTokens {
			t.Fatalf("usage %+v", u)
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
	})
}
