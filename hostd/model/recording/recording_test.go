package recording

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/model"
	"github.com/ephemeralhq/ephemeral/hostd/model/openai"
	"github.com/ephemeralhq/ephemeral/tests/fakeprovider"
)

var shellTool = model.Tool{Name: "shell", Description: "Run bash.", InputSchema: json.RawMessage(`{"type":"object"}`)}

// memSink keeps what a Writer stores, as a run's store would.
type memSink struct {
	entries   [][]byte
	truncated []byte
	failAt    int // the turn whose append fails; 0: none
}

func (s *memSink) AppendExchange(turn int, entry []byte) error {
	if turn == s.failAt {
		return errors.New("disk full")
	}
	s.entries = append(s.entries, bytes.Clone(entry))
	return nil
}

func (s *memSink) Truncated(t Truncation) error {
	b, err := json.Marshal(t)
	s.truncated = b
	return err
}

// document is the recording file of what the sink holds.
func (s *memSink) document(t testing.TB) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteDocument(&buf, s.entries, s.truncated); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// stored is the size of what the sink holds.
func (s *memSink) stored() int64 {
	n := int64(len(s.truncated))
	for _, e := range s.entries {
		n += int64(len(e))
	}
	return n
}

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
// returns the recording file built from what the Writer stored.
func record(t *testing.T) []byte {
	t.Helper()
	srv := httptest.NewServer(fakeprovider.New(pageScript()...))
	t.Cleanup(srv.Close)
	client, err := openai.New(openai.Config{BaseURL: srv.URL + "/v1"})
	if err != nil {
		t.Fatal(err)
	}
	var sink memSink
	w := NewWriter(&sink, 1<<20)
	if _, err := runAgent(t, Wrap(client, w), "/tmp/ephemeral-run-aaa/scratch"); err != nil {
		t.Fatalf("recording run: %v", err)
	}
	if err := w.Err(); err != nil {
		t.Fatal(err)
	}
	return sink.document(t)
}

func decode(t testing.TB, stored []byte) Recording {
	t.Helper()
	rec, err := Decode(bytes.NewReader(stored))
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func replayFrom(t *testing.T, stored []byte) *Replay {
	t.Helper()
	r, err := NewReplay(decode(t, stored))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRecordThenReplayIsDeterministic(t *testing.T) {
	stored := record(t)
	exchanges := decode(t, stored).Exchanges
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

// Each stored turn holds what is new in its request, not the conversation
// before it; decoding gives every turn its whole request back.
func TestEntriesHoldOnlyWhatChanged(t *testing.T) {
	at := time.Date(2026, 11, 30, 4, 0, 0, 0, time.UTC)
	user := model.Message{Role: model.RoleUser, Text: "task"}
	call := func(id string) model.Message {
		return model.Message{Role: model.RoleAssistant, ToolCalls: []model.ToolCall{{ID: id, Name: "shell", Arguments: `{}`}}}
	}
	result := func(id, out string) model.Message {
		return model.Message{Role: model.RoleTool, ToolResults: []model.ToolResult{{CallID: id, Content: out}}}
	}
	turn := func(n int, system string, tools []model.Tool, msgs ...model.Message) Exchange {
		return Exchange{Turn: n, StartedAt: at.Add(time.Duration(n) * time.Second), Duration: time.Second,
			Request:  model.Request{Model: "m", System: system, Tools: tools, MaxTokens: 4096, Messages: msgs},
			Response: &model.Response{Text: fmt.Sprint("answer ", n), StopReason: model.StopToolUse}}
	}
	exchanges := []Exchange{
		turn(1, "budget $0.04", []model.Tool{shellTool}, user),
		turn(2, "budget $0.03", []model.Tool{shellTool}, user, call("c1"), result("c1", "OUTPUT-ONE")),
		turn(3, "budget $0.03", []model.Tool{shellTool}, user, call("c1"), result("c1", "OUTPUT-ONE"), call("c2"), result("c2", "OUTPUT-TWO")),
		// The last turn offers no tools, and this conversation rewrote
		// its history (an agent may summarise old output).
		turn(4, "budget $0.02", nil, user, call("c1"), result("c1", "[summarised]"), call("c2"), result("c2", "OUTPUT-TWO")),
	}
	exchanges[3].Response, exchanges[3].Error = nil, "openai: HTTP 500"

	var sink memSink
	w := NewWriter(&sink, 1<<20)
	for _, ex := range exchanges {
		w.Record(ex)
	}
	if err := w.Err(); err != nil || len(sink.entries) != 4 || sink.truncated != nil {
		t.Fatalf("stored %d entries, truncated %s: %v", len(sink.entries), sink.truncated, err)
	}
	wantInEntry := []struct{ has, lacks []string }{
		{[]string{`"task"`, `"system":"budget $0.04"`, `"tools":[{"name":"shell"`, `"model":"m"`, `"max_tokens":4096`, `"kept_messages":0`}, nil},
		{[]string{`"kept_messages":1`, "OUTPUT-ONE", `"system":"budget $0.03"`}, []string{`"task"`, `"tools"`, `"model"`, `"max_tokens"`}},
		{[]string{`"kept_messages":3`, "OUTPUT-TWO"}, []string{"OUTPUT-ONE", `"system"`, `"tools"`}},
		{[]string{`"kept_messages":2`, "[summarised]", "OUTPUT-TWO", `"tools":[]`, `"error":"openai: HTTP 500"`}, []string{`"task"`, "OUTPUT-ONE"}},
	}
	for i, want := range wantInEntry {
		for _, s := range want.has {
			if !bytes.Contains(sink.entries[i], []byte(s)) {
				t.Errorf("turn %d entry lacks %s: %s", i+1, s, sink.entries[i])
			}
		}
		for _, s := range want.lacks {
			if bytes.Contains(sink.entries[i], []byte(s)) {
				t.Errorf("turn %d entry repeats %s: %s", i+1, s, sink.entries[i])
			}
		}
	}

	rec := decode(t, sink.document(t))
	if rec.Truncated != nil || !reflect.DeepEqual(rec.Exchanges, exchanges) {
		t.Errorf("decoded\n%+v\nrecorded\n%+v", rec.Exchanges, exchanges)
	}
}

// The product page's example holds its recording as shipped, version 1
// (every request whole): it still reads, and stored as this version it
// decodes to the same turns.
func TestVersion1StillReads(t *testing.T) {
	shipped, err := os.ReadFile("../../../examples/product-page.json")
	if err != nil {
		t.Fatal(err)
	}
	var example struct {
		Recording json.RawMessage `json:"recording"`
	}
	if err := json.Unmarshal(shipped, &example); err != nil {
		t.Fatal(err)
	}
	v1 := decode(t, example.Recording)
	if len(v1.Exchanges) != 3 || v1.Truncated != nil || !strings.HasPrefix(v1.Exchanges[0].Request.Messages[0].Text, "This is a sandbox test.") {
		t.Fatalf("shipped recording read as %d exchanges", len(v1.Exchanges))
	}
	if _, err := NewReplay(v1); err != nil {
		t.Fatal(err)
	}
	// Encoding compacts a tool's schema; its meaning stays.
	for _, ex := range v1.Exchanges {
		for i, tool := range ex.Request.Tools {
			var compact bytes.Buffer
			if err := json.Compact(&compact, tool.InputSchema); err != nil {
				t.Fatal(err)
			}
			ex.Request.Tools[i].InputSchema = compact.Bytes()
		}
	}
	var sink memSink
	w := NewWriter(&sink, 1<<20)
	for _, ex := range v1.Exchanges {
		w.Record(ex)
	}
	v2 := sink.document(t)
	if got := decode(t, v2); !reflect.DeepEqual(got, v1) {
		t.Errorf("version 2 of the shipped recording decodes to\n%+v\nnot\n%+v", got, v1)
	}
	t.Logf("product page: version 1 %d bytes, version 2 %d bytes", len(shipped), len(v2))
}

func TestReplayRefusesDivergence(t *testing.T) {
	stored := record(t)
	exchanges := decode(t, stored).Exchanges
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
	fr, err := NewReplay(Recording{Exchanges: failed})
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
	var sink memSink
	_, callErr := Wrap(client, NewWriter(&sink, 1<<20)).Complete(context.Background(), model.Request{Model: "m", Messages: []model.Message{{Role: model.RoleUser, Text: "hi"}}})
	got := decode(t, sink.document(t)).Exchanges
	if callErr == nil || len(got) != 1 || got[0].Response != nil || got[0].Error != callErr.Error() || got[0].Turn != 1 {
		t.Errorf("recorded %+v for error %v", got, callErr)
	}
}

// A recording stops at its cap: the turns that fit are kept, the rest are
// counted in its truncation mark, and a replay says where it was cut.
func TestWriterCapTruncatesTheRecording(t *testing.T) {
	exchanges, _ := recordLong(t, 6, 4<<10)
	var whole memSink
	w := NewWriter(&whole, 1<<20)
	for _, ex := range exchanges {
		w.Record(ex)
	}
	limit := int64(len(whole.entries[0]) + len(whole.entries[1]) + len(whole.entries[2]))

	var sink memSink
	w = NewWriter(&sink, limit)
	for _, ex := range exchanges {
		w.Record(ex)
	}
	if err := w.Err(); err != nil {
		t.Fatal(err)
	}
	var dropped int64
	for _, e := range whole.entries[3:] {
		dropped += int64(len(e))
	}
	rec := decode(t, sink.document(t))
	want := Truncation{KeptTurns: 3, DroppedTurns: 3, DroppedBytes: dropped, LimitBytes: limit}
	if len(rec.Exchanges) != 3 || rec.Truncated == nil || *rec.Truncated != want {
		t.Fatalf("%d exchanges, truncation %+v, want %+v", len(rec.Exchanges), rec.Truncated, want)
	}
	if !reflect.DeepEqual(rec.Exchanges, exchanges[:3]) {
		t.Error("the kept turns differ from the recorded ones")
	}
	r, err := NewReplay(rec)
	if err != nil {
		t.Fatal(err)
	}
	if cut, ok := r.Truncated(); !ok || cut != want {
		t.Errorf("replay's truncation %+v %v", cut, ok)
	}
	for _, ex := range exchanges[:3] {
		if _, err := r.Complete(context.Background(), ex.Request); err != nil {
			t.Fatalf("turn %d: %v", ex.Turn, err)
		}
	}
	_, err = r.Complete(context.Background(), exchanges[3].Request)
	if !errors.Is(err, ErrTruncated) || !strings.Contains(err.Error(), "turn 4") || !strings.Contains(err.Error(), "after turn 3") {
		t.Errorf("turn past the cut: %v", err)
	}

	// A first turn over the cap leaves nothing to replay, and says so.
	var tiny memSink
	w = NewWriter(&tiny, 10)
	w.Record(exchanges[0])
	if _, err := NewReplay(decode(t, tiny.document(t))); !errors.Is(err, ErrTruncated) {
		t.Errorf("recording cut before its first turn: %v", err)
	}
}

// A turn the store failed to take ends the recording: later entries would
// build on it.
func TestWriterStopsAtTheFirstStoreFailure(t *testing.T) {
	exchanges, _ := recordLong(t, 4, 100)
	sink := memSink{failAt: 2}
	w := NewWriter(&sink, 1<<20)
	for _, ex := range exchanges {
		w.Record(ex)
	}
	if err := w.Err(); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("Err() = %v", err)
	}
	if len(sink.entries) != 1 {
		t.Errorf("stored %d entries after the failure", len(sink.entries))
	}
}

func TestDecodeRefusesBrokenRecordings(t *testing.T) {
	ok := &model.Response{Text: "x"}
	bad := map[string][]Exchange{
		"empty":    nil,
		"turn gap": {{Turn: 1, Response: ok}, {Turn: 3, Response: ok}},
		"neither":  {{Turn: 1}},
		"both":     {{Turn: 1, Response: ok, Error: "e"}},
	}
	for name, ex := range bad {
		if _, err := NewReplay(Recording{Exchanges: ex}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	for name, doc := range map[string]string{
		"unknown version":      `{"version":3,"exchanges":[]}`,
		"no exchanges":         `{"version":2}`,
		"keeps too much":       `{"version":2,"exchanges":[{"turn":1,"request":{"kept_messages":1}}]}`,
		"keeps a negative":     `{"version":2,"exchanges":[{"turn":1,"request":{"kept_messages":-1}}]}`,
		"entry is not an exch": `{"version":2,"exchanges":[17]}`,
	} {
		if _, err := Decode(strings.NewReader(doc)); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	cutWrong := Recording{Exchanges: []Exchange{{Turn: 1, Response: ok}}, Truncated: &Truncation{KeptTurns: 4}}
	if _, err := NewReplay(cutWrong); err == nil {
		t.Error("a truncation mark that does not match the turns was accepted")
	}
}

// The size of a recording is linear in its turns when every turn's tool
// output has the same size: doubling the turns less than doubles and a
// tenth the bytes. Storing each request whole, as version 1 did, grows
// with the square.
func TestRecordingSizeIsLinearInTurns(t *testing.T) {
	const output = 16 << 10
	size := func(turns int) (stored, whole int64) {
		exchanges, sink := recordLong(t, turns, output)
		v1, err := json.Marshal(map[string]any{"version": 1, "exchanges": exchanges})
		if err != nil {
			t.Fatal(err)
		}
		return sink.stored(), int64(len(v1))
	}
	stored20, whole20 := size(20)
	stored40, whole40 := size(40)
	if ratio := float64(stored40) / float64(stored20); ratio >= 2.2 {
		t.Errorf("40 turns stored %d bytes, 20 turns %d: ratio %.2f, want < 2.2", stored40, stored20, ratio)
	}
	// The control: whole requests do grow with the square, so the
	// conversation above is one that would show it.
	if ratio := float64(whole40) / float64(whole20); ratio < 3 {
		t.Errorf("whole requests: 40 turns %d bytes, 20 turns %d: ratio %.2f, want ≥ 3", whole40, whole20, ratio)
	}
	t.Logf("20 turns: %d bytes (whole requests %d); 40 turns: %d bytes (whole requests %d)", stored20, whole20, stored40, whole40)
}

// BenchmarkRecordingBytesPerTurn records runs of 5 to 40 turns, each
// turn's command printing 16 KiB, and reports the bytes stored per turn
// (flat), the size of the last turn's entry, and what storing every
// request whole, as version 1 did, took per turn (growing with the turns).
// B/op is the whole simulated run: its conversation and its recording.
func BenchmarkRecordingBytesPerTurn(b *testing.B) {
	const outputBytes = 16 << 10
	for _, turns := range []int{5, 10, 20, 40} {
		b.Run(fmt.Sprintf("turns=%d", turns), func(b *testing.B) {
			b.ReportAllocs()
			var sink *memSink
			for b.Loop() {
				sink = &memSink{}
				longConversation(b, turns, outputBytes, NewWriter(sink, 1<<40))
			}
			var all exchangeList
			longConversation(b, turns, outputBytes, &all)
			whole, err := json.Marshal(map[string]any{"version": 1, "exchanges": all})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(sink.stored())/float64(turns), "stored-B/turn")
			b.ReportMetric(float64(len(sink.entries[len(sink.entries)-1])), "last-turn-B")
			b.ReportMetric(float64(len(whole))/float64(turns), "v1-B/turn")
		})
	}
}

// recordLong is a long conversation's exchanges and what a Writer stored of
// them.
func recordLong(tb testing.TB, turns, outputBytes int) ([]Exchange, *memSink) {
	tb.Helper()
	var sink memSink
	var all exchangeList
	longConversation(tb, turns, outputBytes, recorders{NewWriter(&sink, 1<<40), &all})
	return all, &sink
}

// longConversation runs an agent-like loop of turns model calls recorded by
// rec: every turn but the last calls the shell once and gets outputBytes of
// output back; the system prompt changes every turn, as the agent's budget
// line does.
func longConversation(tb testing.TB, turns, outputBytes int, rec Recorder) {
	tb.Helper()
	p := Wrap(scriptedModel{turns: turns}, rec)
	req := model.Request{Model: "m", Tools: []model.Tool{shellTool}, MaxTokens: 4096,
		Messages: []model.Message{{Role: model.RoleUser, Text: "work for a while"}}}
	output := strings.Repeat("x", outputBytes)
	for n := 1; ; n++ {
		req.System = fmt.Sprintf("Budget: $%.4f left.", 1/float64(n))
		resp, err := p.Complete(context.Background(), req)
		if err != nil {
			tb.Fatal(err)
		}
		if len(resp.ToolCalls) == 0 {
			return
		}
		req.Messages = append(req.Messages,
			model.Message{Role: model.RoleAssistant, ToolCalls: resp.ToolCalls},
			model.Message{Role: model.RoleTool, ToolResults: []model.ToolResult{{CallID: resp.ToolCalls[0].ID,
				Content: fmt.Sprintf("turn %d:\n%s", n, output)}}})
	}
}

// scriptedModel calls the shell until its last turn, then answers.
type scriptedModel struct{ turns int }

func (m scriptedModel) Complete(_ context.Context, req model.Request) (model.Response, error) {
	n := (len(req.Messages)-1)/2 + 1
	if n >= m.turns {
		return model.Response{Text: "done", StopReason: model.StopEndTurn}, nil
	}
	return model.Response{StopReason: model.StopToolUse, ToolCalls: []model.ToolCall{{
		ID: fmt.Sprint("call_", n), Name: "shell", Arguments: fmt.Sprintf(`{"command":"step %d"}`, n)}}}, nil
}

type recorders []Recorder

func (rs recorders) Record(ex Exchange) {
	for _, r := range rs {
		r.Record(ex)
	}
}

type exchangeList []Exchange

func (l *exchangeList) Record(ex Exchange) { *l = append(*l, ex) }
