package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/model/recording"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
	"github.com/ephemeralhq/ephemeral/tests/fakeprovider"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// pageVM answers the product page's commands the way the real VM does.
func pageVM() *fakeVM {
	return &fakeVM{answer: func(_ context.Context, command string) (string, string, int, error) {
		switch {
		case command == "pwd; whoami":
			return "/tmp/ephemeral-run-Fake01/scratch\nworker\n", "", 0, nil
		case strings.HasPrefix(command, "command -v curl"):
			return "/usr/bin/curl\n", "curl: (6) Could not resolve host: example.com\n", 6, nil
		case strings.Contains(command, "primes.py"):
			return "2 3 5 7 11 13 17 19 23 29 31 37 41 43 47\n", "", 0, nil
		case strings.HasPrefix(command, "mkdir -p -- "):
			return "", "", 0, nil
		case strings.Contains(command, "proof.txt"):
			return "-rw-r--r-- 1 worker worker 14 Oct  7 15:02 /tmp/proof.txt\n", "", 0, nil
		}
		return "", "bash: unexpected\n", 127, nil
	}}
}

const pagePrimes = `printf '%s\n' 'print(2)' > primes.py && python3 primes.py`

func pageScript() []fakeprovider.Turn {
	return []fakeprovider.Turn{
		{ToolCalls: []fakeprovider.ToolCall{shellCall("c1", "pwd; whoami"), shellCall("c2", "command -v curl && curl -sS -m 8 https://example.com")},
			Usage: fakeprovider.Usage{InputTokens: 1460, OutputTokens: 40}},
		{ToolCalls: []fakeprovider.ToolCall{shellCall("c3", pagePrimes), shellCall("c4", "printf 'sandbox proof\\n' > /tmp/proof.txt && ls -l /tmp/proof.txt")},
			Usage: fakeprovider.Usage{InputTokens: 1620, OutputTokens: 70}},
		{Text: "1. Primes: 2 3 5 7 11 13 17 19 23 29 31 37 41 43 47\nThe network call did not succeed.",
			Usage: fakeprovider.Usage{InputTokens: 1936, OutputTokens: 88}},
	}
}

func TestProductPageRun(t *testing.T) {
	e := newEnv(t, pageVM(), pageScript()...)
	r, events := e.run(pageSpec("This is a sandbox test."))
	if r.Status != store.Succeeded || r.Output == nil || !strings.Contains(*r.Output, "did not succeed") {
		t.Fatalf("status %s, output %v, error %s %s", r.Status, r.Output, r.ErrorCode, r.ErrorMessage)
	}
	want := []string{
		"Queued: Budget $0.04 reserved",
		"MicroVM: microVM ready",
		"MicroVM: worker started · shell on · web off",
		"Shell: $ pwd; whoami",
		"Shell: $ command -v curl && curl -sS -m 8 https://example.com",
		"Shell: $ " + pagePrimes,
		"Shell: $ printf 'sandbox proof\\n' > /tmp/proof.txt && ls -l /tmp/proof.txt",
		"MicroVM: microVM destroyed",
		"Successful: 3 model calls, 5,214 tokens",
	}
	got := messages(events)
	if len(got) != len(want)+1 || !slices.Equal(got[:len(want)], want) || !strings.HasPrefix(got[len(want)], "Worker destroyed: ") {
		t.Fatalf("timeline:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if events[3].T != events[4].T || events[5].T != events[6].T || events[5].T < events[4].T {
		t.Errorf("parallel commands' t: %v %v, then %v %v", events[3].T, events[4].T, events[5].T, events[6].T)
	}
	curl := eventData(t, events[4])
	if curl["exit_code"] != float64(6) || !strings.Contains(curl["stderr"].(string), "Could not resolve host") {
		t.Errorf("curl event data: %v", curl)
	}

	reqs := e.provider.Requests()
	if len(reqs) != 3 {
		t.Fatalf("provider got %d requests", len(reqs))
	}
	results := reqs[1].ToolResults
	if len(results) != 2 || !strings.Contains(results[0].Content, "worker") ||
		!strings.Contains(results[1].Content, "Could not resolve host: example.com") || !strings.Contains(results[1].Content, "exit code: 6") {
		t.Errorf("turn 2 tool results: %+v", results)
	}
	if !strings.Contains(reqs[2].ToolResults[0].Content, "2 3 5 7 11 13") {
		t.Errorf("turn 3 tool results: %+v", reqs[2].ToolResults)
	}
	sys := reqs[0].System
	for _, fact := range []string{"/tmp/ephemeral-run-Fake01/scratch", "worker", "Web: off", "no network", "$0.04"} {
		if !strings.Contains(sys, fact) {
			t.Errorf("system prompt does not state %q:\n%s", fact, sys)
		}
	}
	if !slices.Equal(reqs[0].ToolNames, []string{ShellTool}) || reqs[0].MaxTokens <= 0 || reqs[0].MaxTokens > DefaultMaxAnswerTokens {
		t.Errorf("tools %v, max_tokens %d", reqs[0].ToolNames, reqs[0].MaxTokens)
	}

	// 5,016 input tokens at 50,000 and 198 output at 400,000 micros per
	// million, each call a whole number of micros: the page's $0.00033.
	if r.Cost.Model != 330 || r.Usage.ModelCalls != 3 || r.Usage.Tokens() != 5214 || r.Usage.ShellCommands != 4 {
		t.Errorf("usage %+v, cost %+v", r.Usage, r.Cost)
	}
	if r.Cost.Compute <= 0 {
		t.Errorf("no compute charged: %+v", r.Cost)
	}
	checkMoney(t, r)
	if e.vm.destroyed != 1 {
		t.Errorf("VM destroyed %d times", e.vm.destroyed)
	}

	doc, err := e.svc.Recording(context.Background(), e.orgID, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := recording.Decode(bytes.NewReader(doc))
	if err != nil || len(rec.Exchanges) != 3 || rec.Exchanges[2].Response.Text != pageScript()[2].Text || rec.Truncated != nil {
		t.Errorf("recording: %d exchanges, %v", len(rec.Exchanges), err)
	}
}

// A long run with large outputs fills its recording and timeline caps:
// it still succeeds, the model still sees every output, it costs what the
// same run without caps costs, and what was left out is said.
func TestSizeCapsNeitherFailTheRunNorChangeItsCost(t *testing.T) {
	const turns, output = 8, 8 << 10
	vm := func() *fakeVM {
		return &fakeVM{answer: func(_ context.Context, command string) (string, string, int, error) {
			return command + ":" + strings.Repeat("x", output) + "\n", "", 0, nil
		}}
	}
	var script []fakeprovider.Turn
	for i := range turns {
		script = append(script, fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCall(fmt.Sprint("c", i), fmt.Sprint("step-", i))},
			Usage: fakeprovider.Usage{InputTokens: 1000, OutputTokens: 50}})
	}
	script = append(script, fakeprovider.Turn{Text: "all steps ran", Usage: fakeprovider.Usage{InputTokens: 2000, OutputTokens: 20}})

	uncapped := newEnv(t, vm(), script...)
	want, _ := uncapped.run(pageSpec("run the steps"))
	capped := newEnvRuns(t, Config{}, runs.Config{MaxRecordingBytes: 4 * output, MaxTimelineBytes: 3 * output}, vm(), script...)
	r, events := capped.run(pageSpec("run the steps"))
	if r.Status != store.Succeeded || want.Status != store.Succeeded {
		t.Fatalf("status %s (%s), uncapped %s", r.Status, r.ErrorMessage, want.Status)
	}
	if r.Cost.Model != want.Cost.Model || r.Usage.ModelCalls != turns+1 || r.Usage.ShellCommands != turns || r.Usage.Tokens() != want.Usage.Tokens() {
		t.Errorf("capped run used %+v costing %+v, uncapped %+v costing %+v", r.Usage, r.Cost, want.Usage, want.Cost)
	}
	checkMoney(t, r)
	reqs := capped.provider.Requests()
	if last := reqs[len(reqs)-1].ToolResults; len(last) != 1 || !strings.Contains(last[0].Content, "step-7:"+strings.Repeat("x", 100)) {
		t.Errorf("the model did not get the last output: %.200v", last)
	}

	doc, err := capped.svc.Recording(context.Background(), capped.orgID, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := recording.Decode(bytes.NewReader(doc))
	if err != nil || rec.Truncated == nil || len(rec.Exchanges) == 0 || len(rec.Exchanges) >= turns ||
		rec.Truncated.KeptTurns+rec.Truncated.DroppedTurns != turns+1 || int64(len(doc)) > 5*output {
		t.Fatalf("recording of %d bytes, %d turns, truncated %+v: %v", len(doc), len(rec.Exchanges), rec.Truncated, err)
	}
	if _, err := recording.NewReplay(rec); err != nil {
		t.Errorf("the kept turns do not replay: %v", err)
	}

	got := messages(events)
	recordingCut := fmt.Sprintf("Model: recording cap of 32 KiB reached: turn %d and later turns are not recorded", rec.Truncated.KeptTurns+1)
	if !slices.Contains(got, recordingCut) {
		t.Errorf("timeline lacks %q:\n%s", recordingCut, strings.Join(got, "\n"))
	}
	tail := got[len(got)-3:]
	if !strings.HasPrefix(tail[0], "Timeline: timeline cap of 24 KiB reached: ") || !strings.HasPrefix(tail[1], "Successful: ") || !strings.HasPrefix(tail[2], "Worker destroyed: ") {
		t.Errorf("timeline ends %q", tail)
	}
	var stored int
	for _, ev := range events {
		if ev.Category == timeline.Shell {
			stored += len(ev.Message) + len(ev.Data)
		}
	}
	if stored > 3*output {
		t.Errorf("shell entries store %d bytes, over the cap of %d", stored, 3*output)
	}
}

func TestShellOff(t *testing.T) {
	vm := pageVM()
	e := newEnv(t, vm,
		fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCall("c1", "whoami")}},
		fakeprovider.Turn{Text: "I could not run anything."})
	spec := pageSpec("run whoami")
	spec.Shell = false
	r, events := e.run(spec)
	if r.Status != store.Succeeded {
		t.Fatalf("status %s: %s", r.Status, r.ErrorMessage)
	}
	reqs := e.provider.Requests()
	if len(reqs[0].ToolNames) != 0 || !strings.Contains(reqs[0].System, "Shell: off") {
		t.Errorf("shell off but offered tools %v; system prompt:\n%s", reqs[0].ToolNames, reqs[0].System)
	}
	if len(reqs) != 2 || len(reqs[1].ToolResults) != 1 || !strings.Contains(reqs[1].ToolResults[0].Content, "not granted the shell") {
		t.Errorf("attempted call answered with %+v", reqs[len(reqs)-1].ToolResults)
	}
	if len(vm.commands) != 0 {
		t.Errorf("commands ran with shell off: %q", vm.commands)
	}
	if !slices.Contains(messages(events), "MicroVM: worker started · shell off · web off") {
		t.Errorf("timeline: %q", messages(events))
	}
}

func TestMalformedToolCalls(t *testing.T) {
	vm := pageVM()
	hostile := []fakeprovider.ToolCall{
		{ID: "bad-json", Name: ShellTool, Arguments: `{"command": "whoami"`},
		{ID: "not-object", Name: ShellTool, Arguments: `["whoami"]`},
		{ID: "unknown-tool", Name: "rm_rf", Arguments: `{}`},
		{ID: "huge", Name: ShellTool, Arguments: `{"command": "` + strings.Repeat("x", maxArgumentBytes) + `"}`},
		{ID: "extra-field", Name: ShellTool, Arguments: `{"command": "whoami", "user": "root"}`},
		{ID: "empty", Name: ShellTool, Arguments: `{"command": "  "}`},
		{ID: "good", Name: ShellTool, Arguments: `{"command": "pwd; whoami"}`},
	}
	e := newEnv(t, vm, fakeprovider.Turn{ToolCalls: hostile}, fakeprovider.Turn{Text: "done"})
	r, _ := e.run(pageSpec("misbehave"))
	if r.Status != store.Succeeded || *r.Output != "done" {
		t.Fatalf("status %s: %s", r.Status, r.ErrorMessage)
	}
	results := e.provider.Requests()[1].ToolResults
	if len(results) != len(hostile) {
		t.Fatalf("%d results for %d calls", len(results), len(hostile))
	}
	for i, res := range results {
		good := hostile[i].ID == "good"
		if res.CallID != hostile[i].ID || strings.Contains(res.Content, "refused") == good {
			t.Errorf("call %s answered %q", hostile[i].ID, res.Content)
		}
	}
	if !slices.Equal(vm.commands, []string{"pwd; whoami"}) {
		t.Errorf("commands run: %q", vm.commands)
	}
}

func TestRetryAfter429(t *testing.T) {
	e := newEnv(t, pageVM(),
		fakeprovider.Turn{Status: 429, RetryAfter: "0"},
		fakeprovider.Turn{Text: "answer", Usage: fakeprovider.Usage{InputTokens: 100, OutputTokens: 10}})
	r, _ := e.run(pageSpec("hi"))
	if r.Status != store.Succeeded || *r.Output != "answer" {
		t.Fatalf("status %s: %s", r.Status, r.ErrorMessage)
	}
	reqs := e.provider.Requests()
	if len(reqs) != 2 || reqs[0].Status != 429 || r.Usage.ModelCalls != 1 || r.Usage.Tokens() != 110 {
		t.Errorf("%d requests, usage %+v", len(reqs), r.Usage)
	}
}

// A charge that passes the limit stops the run at once, charged exactly
// its limit.
func TestBudgetExceededByAModelCall(t *testing.T) {
	vm := pageVM()
	e := newEnv(t, vm,
		fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCall("c1", "pwd; whoami")},
			Usage: fakeprovider.Usage{InputTokens: 1_000_000, OutputTokens: 10}},
		fakeprovider.Turn{Text: "never asked"})
	spec := pageSpec("spend")
	spec.MaxCostMicros = 2000
	r, events := e.run(spec)
	if r.Status != store.BudgetExceeded || r.Charged != 2000 {
		t.Fatalf("status %s, charged %d, error %s", r.Status, r.Charged, r.ErrorMessage)
	}
	checkMoney(t, r)
	if len(vm.commands) != 0 || e.provider.Remaining() != 1 {
		t.Errorf("run went on after the budget: commands %q, %d turns unused", vm.commands, e.provider.Remaining())
	}
	if !slices.Contains(messages(events), "MicroVM: microVM destroyed") {
		t.Errorf("timeline: %q", messages(events))
	}
}

// When what is left cannot pay for a useful answer, the run stops before
// calling the model.
func TestBudgetTooSmallForNextCall(t *testing.T) {
	vm := pageVM()
	e := newEnv(t, vm,
		fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCall("c1", "pwd; whoami")},
			Usage: fakeprovider.Usage{InputTokens: 39_000}},
		fakeprovider.Turn{Text: "unaffordable"})
	spec := pageSpec("spend")
	spec.MaxCostMicros = 2000
	r, _ := e.run(spec)
	if r.Status != store.BudgetExceeded {
		t.Fatalf("status %s, error %s", r.Status, r.ErrorMessage)
	}
	checkMoney(t, r)
	if len(e.provider.Requests()) != 1 || len(vm.commands) != 1 {
		t.Errorf("%d model calls, commands %q", len(e.provider.Requests()), vm.commands)
	}
}

// A command the guest killed for passing its process limit says so, to the
// model and on the timeline, and the run goes on.
func TestProcessLimitKillIsReported(t *testing.T) {
	const bomb = ":(){ :|:& };:"
	vm := &fakeVM{ends: map[string]vsockproto.ExitStatus{bomb: {Code: -1, Signal: 9, ProcessLimit: 256, Duration: time.Second}}}
	e := newEnv(t, vm, fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCall("c1", bomb)}}, fakeprovider.Turn{Text: "done"})
	r, events := e.run(pageSpec("bomb"))
	if r.Status != store.Succeeded {
		t.Fatalf("status %s: %s", r.Status, r.ErrorMessage)
	}
	results := e.provider.Requests()[1].ToolResults
	if len(results) != 1 || !strings.HasPrefix(results[0].Content, "killed: the command tried to have more than 256 processes and threads at once") {
		t.Errorf("tool results %+v", results)
	}
	var data map[string]any
	for _, ev := range events {
		if ev.Category == timeline.Shell {
			json.Unmarshal(ev.Data, &data)
		}
	}
	if data["process_limit"] != float64(256) || data["signal"] != float64(9) {
		t.Errorf("timeline data of the command: %v", data)
	}
}

func TestTimeoutMidCommand(t *testing.T) {
	vm := &fakeVM{answer: func(ctx context.Context, command string) (string, string, int, error) {
		<-ctx.Done()
		return "", "", 0, context.Cause(ctx)
	}}
	e := newEnv(t, vm, fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCall("c1", "sleep 600")}})
	spec := pageSpec("wait")
	spec.Timeout = time.Second
	r, events := e.run(spec)
	if r.Status != store.TimedOut {
		t.Fatalf("status %s, error %s", r.Status, r.ErrorMessage)
	}
	checkMoney(t, r)
	got := messages(events)
	if !slices.Contains(got, "Shell: $ sleep 600") || !slices.Contains(got, "MicroVM: microVM destroyed") || vm.destroyed != 1 {
		t.Errorf("timeline %q, destroyed %d", got, vm.destroyed)
	}
}

func TestZeroRetentionKeepsNoRecording(t *testing.T) {
	e := newEnv(t, pageVM(), pageScript()...)
	spec := pageSpec("canary-7f3e")
	spec.ZeroDataRetention = true
	r, events := e.run(spec)
	if r.Status != store.Succeeded {
		t.Fatalf("status %s: %s", r.Status, r.ErrorMessage)
	}
	if _, err := e.store.Recording(context.Background(), e.orgID, r.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("recording kept under zero retention: %v", err)
	}
	for _, ev := range events {
		if ev.Category == timeline.Shell && (ev.Message != runs.Withheld || strings.Contains(string(ev.Data), "worker")) {
			t.Errorf("shell event keeps content: %q %s", ev.Message, ev.Data)
		}
	}
}

// The last turn offers no tools; a model that calls one anyway is told to
// answer, and gets one more call to do it.
func TestToolCallsAfterTheLastTurn(t *testing.T) {
	vm := pageVM()
	e := newEnvConfig(t, Config{MaxTurns: 2}, vm,
		fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCall("c1", "pwd; whoami")}},
		fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCall("c2", "pwd; whoami")}},
		fakeprovider.Turn{Text: "final"})
	r, _ := e.run(pageSpec("loop"))
	if r.Status != store.Succeeded || *r.Output != "final" {
		t.Fatalf("status %s: %s", r.Status, r.ErrorMessage)
	}
	reqs := e.provider.Requests()
	if len(reqs[1].ToolNames) != 0 || !strings.Contains(reqs[1].System, "last turn") {
		t.Errorf("last turn offered %v", reqs[1].ToolNames)
	}
	if len(vm.commands) != 1 || !strings.Contains(reqs[2].ToolResults[0].Content, "no turns are left") {
		t.Errorf("commands %q, answer to the late call %+v", vm.commands, reqs[2].ToolResults)
	}
}

func TestMaxTurnsFailsTheRun(t *testing.T) {
	e := newEnvConfig(t, Config{MaxTurns: 1}, pageVM(),
		fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCall("c1", "pwd; whoami")}},
		fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCall("c2", "pwd; whoami")}})
	r, _ := e.run(pageSpec("loop"))
	if r.Status != store.Failed || !strings.Contains(r.ErrorMessage, "final answer") {
		t.Errorf("status %s: %s", r.Status, r.ErrorMessage)
	}
	checkMoney(t, r)
}

func TestInlineFilesWrittenBeforeTheWorker(t *testing.T) {
	vm := pageVM()
	e := newEnv(t, vm, fakeprovider.Turn{Text: "ok"})
	spec := pageSpec("read")
	spec.Files = []runs.File{{Path: "data/in.csv", Content: "a,b\n"}, {Path: "notes.txt", Content: "hi"}}
	r, _ := e.run(spec)
	if r.Status != store.Succeeded {
		t.Fatalf("status %s: %s", r.Status, r.ErrorMessage)
	}
	if vm.files["data/in.csv"] != "a,b\n" || vm.files["notes.txt"] != "hi" || !slices.Contains(vm.commands, "mkdir -p -- data") {
		t.Errorf("files %v, commands %q", vm.files, vm.commands)
	}
	if !strings.Contains(e.provider.Requests()[0].System, "data/in.csv, notes.txt") {
		t.Errorf("system prompt does not list the files")
	}
}

// A VM that dies under the run fails it at once instead of letting the
// model talk to a dead machine until its turns run out.
func TestVMDyingFailsTheRun(t *testing.T) {
	vm := &fakeVM{stopped: make(chan struct{}), cause: errors.New("its VMM passed its memory limit")}
	vm.answer = func(context.Context, string) (string, string, int, error) {
		close(vm.stopped)
		return "", "", 0, errors.New("connection reset (the VM is gone)")
	}
	e := newEnv(t, vm,
		fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCall("c1", "kill -9 1")}},
		fakeprovider.Turn{Text: "never asked"})
	r, _ := e.run(pageSpec("crash"))
	if r.Status != store.Failed || !strings.Contains(r.ErrorMessage, "stopped unexpectedly: its VMM passed its memory limit") || e.provider.Remaining() != 1 {
		t.Errorf("status %s: %s; %d turns unused", r.Status, r.ErrorMessage, e.provider.Remaining())
	}
	checkMoney(t, r)
}

// The same run over Anthropic's wire format: parallel tool use blocks,
// tool_result blocks back, usage billed.
func TestProductPageRunOverAnthropic(t *testing.T) {
	e := newEnv(t, pageVM(), pageScript()...)
	spec := pageSpec("This is a sandbox test.")
	spec.Model = testAnthropicModel
	r, _ := e.run(spec)
	if r.Status != store.Succeeded || r.Cost.Model != 330 || r.Usage.ShellCommands != 4 {
		t.Fatalf("status %s (%s), usage %+v, cost %+v", r.Status, r.ErrorMessage, r.Usage, r.Cost)
	}
	reqs := e.provider.Requests()
	if len(reqs) != 3 || reqs[0].API != fakeprovider.Anthropic || reqs[0].MaxTokens <= 0 {
		t.Fatalf("requests: %d", len(reqs))
	}
	if res := reqs[1].ToolResults; len(res) != 2 || !strings.Contains(res[1].Content, "Could not resolve host") {
		t.Errorf("tool results: %+v", res)
	}
	checkMoney(t, r)
}

// BenchmarkPageRunOverhead measures what the agent, the runs service, SQLite
// and the model's HTTP round trips add to a run, with the VM faked: the
// product page's three turns and four commands per iteration.
func BenchmarkPageRunOverhead(b *testing.B) {
	e := newEnv(b, pageVM())
	for b.Loop() {
		e.provider.Append(pageScript()...)
		if r, _ := e.run(pageSpec("bench")); r.Status != store.Succeeded {
			b.Fatalf("status %s: %s", r.Status, r.ErrorMessage)
		}
	}
}

// A retry the run's time cannot cover is refused at once: the run ends
// with the provider's error instead of sleeping into its timeout.
func TestRetryThatOutlastsTheRunIsRefused(t *testing.T) {
	e := newEnv(t, pageVM(),
		fakeprovider.Turn{Status: 429, RetryAfter: "3600"},
		fakeprovider.Turn{Text: "too late"})
	r, _ := e.run(pageSpec("hi"))
	if r.Status != store.Failed || !strings.Contains(r.ErrorMessage, "429") || e.provider.Remaining() != 1 {
		t.Errorf("status %s: %s; %d turns unused", r.Status, r.ErrorMessage, e.provider.Remaining())
	}
	checkMoney(t, r)
}
