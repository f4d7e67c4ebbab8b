package recording

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/model"
	"github.com/ephemeralhq/ephemeral/hostd/model/openai"
	"github.com/ephemeralhq/ephemeral/tests/fakeprovider"
)

var shellTool = model.Tool{Name: "shell", Description: "Run bash.", InputSchema: json.RawMessage(`{"type":"object"}`)}

// runAgent drives p the way the agent loop does: answer every tool call
// with output, until the model answers without calls. scratch stands for
// what differs between two runs of the same conversation.
func runAgent(t *testing.T, p model.Provider, scratch string) ([]model.Response, error) {
	t.Helper()
	req := model.Request{
		Model:    "openai/gpt-6-luna",
		System:   "Sandbox. Budget left: " + scratch,
		Messages: []model.Message{{Role: model.RoleUser, Text: "This is a sandbox test."}},
		Tools:    []model.Tool{shellTool},
	}
	var responses []model.Response
	for range 10 {
		resp, err := p.Complete(context.Background(), req)
		if err != nil {
			return responses, err
		}
		responses = append(responses, resp)
		if len(resp.ToolCalls) == 0 {
			return responses, nil
		}
		results := make([]model.ToolResult, 0, len(resp.ToolCalls))
		// Answer in reverse order, as parallel calls may finish.
		for i := len(resp.ToolCalls) - 1; i >= 0; i-- {
			results = append(results, model.ToolResult{CallID: resp.ToolCalls[i].ID, Content: "ran in " + scratch})
		}
		req.Messages = append(req.Messages,
			model.Message{Role: model.RoleAssistant, Text: resp.Text, ToolCalls: resp.ToolCalls},
			model.Message{Role: model.RoleTool, ToolResults: results})
	}
	t.Fatal("conversation did not end")
	return nil, nil
}

// pageScript is the product page's run: two turns of two parallel shell
// calls, then the answer.
func pageScript() []fakeprovider.Turn {
	return []fakeprovider.Turn{
		{ToolCalls: []fakeprovider.ToolCall{
			{ID: "call_1", Name: "shell", Arguments: `{"command":"pwd; whoami"}`},
			{ID: "call_2", Name: "shell", Arguments: `{"command":"command -v curl && curl -sS -m 8 https://example.com"}`},
		}, Usage: fakeprovider.Usage{InputTokens: 1500, OutputTokens: 120}},
		{ToolCalls: []fakeprovider.ToolCall{
			{ID: "call_3", Name: "shell", Arguments: `{"command":"python3 primes.py"}`},
			{ID: "call_4", Name: "shell", Arguments: `{"command":"printf 'sandbox proof\\n' > /tmp/proof.txt && ls -l /tmp/proof.txt"}`},
		}, Usage: fakeprovider.Usage{InputTokens: 1700, OutputTokens: 200}},
		{Text: "All four checks ran.", Usage: fakeprovider.Usage{InputTokens: 1600, OutputTokens: 94}},
	}
}

// record runs the page's conversation against the fake over real HTTP and
// returns the stored recording.
func record(t *testing.T) []byte {
	t.Helper()
	srv := httptest.NewServer(fakeprovider.New(pageScript()...))
	t.Cleanup(srv.Close)
	client, err := openai.New(openai.Config{BaseURL: srv.URL + "/v1"})
	if err != nil {
		t.Fatal(err)
	}
	var log Log
	if _, err := runAgent(t, Wrap(client, &log), "/tmp/ephemeral-run-aaa/scratch"); err != nil {
		t.Fatalf("recording run: %v", err)
	}
	var buf bytes.Buffer
	if err := Encode(&buf, log.Exchanges()); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func replayFrom(t *testing.T, stored []byte) *Replay {
	t.Helper()
	exchanges, err := Decode(bytes.NewReader(stored))
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewReplay(exchanges)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRecordThenReplayIsDeterministic(t *testing.T) {
	stored := record(t)
	exchanges, err := Decode(bytes.NewReader(stored))
	if err != nil {
		t.Fatal(err)
	}
	if len(exchanges) != 3 || exchanges[2].Response.Text != "All four checks ran." || exchanges[1].Request.Messages[2].ToolResults[0].Content != "ran in /tmp/ephemeral-run-aaa/scratch" {
		t.Fatalf("recording does not hold the run: %s", stored)
	}

	first, err := runAgent(t, replayFrom(t, stored), "/tmp/ephemeral-run-bbb/scratch")
	if err != nil {
		t.Fatalf("first replay: %v", err)
	}
	second, err := runAgent(t, replayFrom(t, stored), "/tmp/ephemeral-run-ccc/scratch")
	if err != nil {
		t.Fatalf("second replay: %v", err)
	}
	if !reflect.DeepEqual(first, second) {
		t.Errorf("replays differ:\n%+v\n%+v", first, second)
	}
	for i, ex := range exchanges {
		if !reflect.DeepEqual(first[i], *ex.Response) {
			t.Errorf("turn %d: replayed %+v, recorded %+v", i+1, first[i], *ex.Response)
		}
	}
	if first[1].ToolCalls[1].Arguments != `{"command":"printf 'sandbox proof\\n' > /tmp/proof.txt && ls -l /tmp/proof.txt"}` {
		t.Errorf("tool call arguments changed: %s", first[1].ToolCalls[1].Arguments)
	}
}

func TestReplayRefusesDivergence(t *testing.T) {
	stored := record(t)
	exchanges, _ := Decode(bytes.NewReader(stored))
	turn2 := exchanges[1].Request

	tests := []struct {
		name   string
		mutate func(*model.Request)
		want   string
	}{
		{"result for another call id", func(r *model.Request) { r.Messages[2].ToolResults[0].CallID = "call_9" }, "results for"},
		{"one result missing", func(r *model.Request) { r.Messages[2].ToolResults = r.Messages[2].ToolResults[:1] }, "results for"},
		{"call renamed", func(r *model.Request) { r.Messages[1].ToolCalls[0].Name = "python" }, "calls"},
		{"extra message", func(r *model.Request) {
			r.Messages = append(r.Messages, model.Message{Role: model.RoleUser, Text: "more"})
		}, "messages"},
		{"other tools", func(r *model.Request) { r.Tools = nil }, "tools offered"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := replayFrom(t, stored)
			if _, err := r.Complete(context.Background(), exchanges[0].Request); err != nil {
				t.Fatal(err)
			}
			req := cloneRequest(turn2)
			tt.mutate(&req)
			_, err := r.Complete(context.Background(), req)
			if !errors.Is(err, ErrDiverged) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want ErrDiverged mentioning %q", err, tt.want)
			}
			// The refused request did not use up the turn.
			if _, err := r.Complete(context.Background(), turn2); err != nil {
				t.Errorf("matching request after a refused one: %v", err)
			}
		})
	}
}

func TestReplayEndsAndFailsWhereTheRecordingDid(t *testing.T) {
	stored := record(t)
	r := replayFrom(t, stored)
	if _, err := runAgent(t, r, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Complete(context.Background(), model.Request{}); !errors.Is(err, ErrExhausted) {
		t.Errorf("after the last turn: %v, want ErrExhausted", err)
	}

	failed := []Exchange{{Turn: 1, Request: model.Request{Messages: []model.Message{{Role: model.RoleUser}}}, Error: "openai: HTTP 500"}}
	fr, err := NewReplay(failed)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fr.Complete(context.Background(), failed[0].Request); !errors.Is(err, ErrRecordedFailure) || !strings.Contains(err.Error(), "HTTP 500") {
		t.Errorf("recorded failure replayed as %v", err)
	}
}

func TestRecorderSeesFailures(t *testing.T) {
	srv := httptest.NewServer(fakeprovider.New(fakeprovider.Turn{RawBody: `{"choices":`}))
	defer srv.Close()
	client, err := openai.New(openai.Config{BaseURL: srv.URL + "/v1"})
	if err != nil {
		t.Fatal(err)
	}
	var log Log
	_, callErr := Wrap(client, &log).Complete(context.Background(), model.Request{Model: "m", Messages: []model.Message{{Role: model.RoleUser, Text: "hi"}}})
	got := log.Exchanges()
	if callErr == nil || len(got) != 1 || got[0].Response != nil || got[0].Error != callErr.Error() || got[0].Turn != 1 {
		t.Errorf("recorded %+v for error %v", got, callErr)
	}
}

func TestNewReplayRefusesBrokenRecordings(t *testing.T) {
	ok := &model.Response{Text: "x"}
	bad := map[string][]Exchange{
		"empty":    nil,
		"turn gap": {{Turn: 1, Response: ok}, {Turn: 3, Response: ok}},
		"neither":  {{Turn: 1}},
		"both":     {{Turn: 1, Response: ok, Error: "e"}},
	}
	for name, ex := range bad {
		if _, err := NewReplay(ex); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := Decode(strings.NewReader(`{"version":2,"exchanges":[]}`)); err == nil {
		t.Error("unknown version accepted")
	}
}
