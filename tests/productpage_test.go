package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/timeline"
	"github.com/ephemeralhq/ephemeral/tests/fakeprovider"
)

// productPageRequest is request.json from the product page, verbatim.
const productPageRequest = `{
  "prompt": "This is a sandbox test. Do these steps with the shell and report the real output, never what you expect. 1) Write a small script that prints the first 15 prime numbers, run it and show the output. 2) Run ` + "`whoami` and `pwd`" + `. 3) Try to reach the internet with ` + "`curl -sS -m 8 https://example.com`" + ` (and, if curl is missing, python3 with urllib) and report the exact error. 4) Write a file named /tmp/proof.txt and list it. Reply in Markdown, at most 120 words: one line per step with the result, then one sentence saying whether the network call succeeded.",
  "web": false,
  "shell": true,
  "timeout_seconds": 120,
  "max_cost_micros": 40000
}`

// The product page's commands; its prime script is cut off on the page
// and completed here.
const (
	pageWhoami = "pwd; whoami"
	pageCurl   = "command -v curl && curl -sS -m 8 https://example.com"
	pagePrimes = `printf '%s\n' '#!/usr/bin/env python3' 'primes = []' 'n = 2' 'while len(primes) < 15:' ` +
		`'    if all(n % p for p in primes):' '        primes.append(n)' '    n += 1' 'print(*primes)' > primes.py && python3 primes.py`
	pageProof = `printf 'sandbox proof\n' > /tmp/proof.txt && ls -l /tmp/proof.txt`
)

func shellCall(id, command string) fakeprovider.ToolCall {
	args, _ := json.Marshal(map[string]string{"command": command})
	return fakeprovider.ToolCall{ID: id, Name: "shell", Arguments: string(args)}
}

// pageModel scripts the page's first two model turns; the third, the
// Markdown answer, is written from the tool results the model really got,
// as a model would.
func pageModel(t *testing.T) (*fakeprovider.Server, http.Handler) {
	fake := fakeprovider.New(
		fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCall("call_1", pageWhoami), shellCall("call_2", pageCurl)},
			Usage: fakeprovider.Usage{InputTokens: 1460, OutputTokens: 40}},
		fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCall("call_3", pagePrimes), shellCall("call_4", pageProof)},
			Usage: fakeprovider.Usage{InputTokens: 1620, OutputTokens: 70}},
	)
	fake.APIKey = "sk-test-provider"
	var mu sync.Mutex
	calls := 0
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 32<<20))
		r.Body = io.NopCloser(bytes.NewReader(body))
		mu.Lock()
		calls++
		if calls == 3 {
			fake.Append(fakeprovider.Turn{Text: pageAnswer(toolOutputs(body)), Usage: fakeprovider.Usage{InputTokens: 1936, OutputTokens: 88}})
		}
		mu.Unlock()
		fake.ServeHTTP(w, r)
	})
	return fake, handler
}

// toolOutputs maps tool call ids to the results an OpenAI request carries.
func toolOutputs(body []byte) map[string]string {
	var req struct {
		Messages []struct {
			Role       string `json:"role"`
			Content    any    `json:"content"`
			ToolCallID string `json:"tool_call_id"`
		} `json:"messages"`
	}
	json.Unmarshal(body, &req)
	out := map[string]string{}
	for _, m := range req.Messages {
		if s, ok := m.Content.(string); ok && m.Role == "tool" {
			out[m.ToolCallID] = s
		}
	}
	return out
}

// pageAnswer is the page's answer, filled with what the VM printed.
func pageAnswer(results map[string]string) string {
	line := func(id, pattern string) string {
		return regexp.MustCompile(pattern).FindString(results[id])
	}
	return fmt.Sprintf("1. Prime script output: %s\n2. whoami: %s; pwd: %s\n3. curl error: %s\n4. /tmp/proof.txt created; ls -l: %s\nThe network call did not succeed.",
		line("call_3", `2 3 5 7[0-9 ]*`), line("call_1", `(?m)^worker$`), line("call_1", `/tmp/ephemeral-run-\S+/scratch`),
		line("call_2", `curl: \(6\).*`), line("call_4", `-rw\S+ .*/tmp/proof.txt`))
}

// daemon is a started `ephemeral serve`.
type daemon struct {
	url  string
	key  string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
}

// startServe starts the real daemon on a loopback port with env added, after
// creating an org with a member key and credit, and stops it at the end.
func startServe(t *testing.T, state string, env ...string) daemon {
	t.Helper()
	return launchServe(t, state, createOrg(t, state), env...)
}

// createOrg makes the org acme with $5 of credit and returns a member key.
func createOrg(t *testing.T, state string) string {
	t.Helper()
	admin := func(args ...string) string {
		r := runCLI(t, state, append([]string{"admin"}, args...)...)
		if r.code != 0 {
			t.Fatalf("admin %v: %s", args, r.stderr)
		}
		return strings.TrimSpace(r.stdout)
	}
	admin("org", "create", "acme")
	admin("member", "add", "--org", "acme", "dev@acme.example")
	key := admin("key", "create", "--org", "acme", "--member", "dev@acme.example")
	admin("credit", "--org", "acme", "--micros", "5000000")
	return key
}

// launchServe starts `ephemeral serve` on state and waits until it serves.
func launchServe(t *testing.T, state, key string, env ...string) daemon {
	t.Helper()
	bin := buildCLI(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin, "--state-dir", state, "serve", "--listen", addr)
	cmd.Env = append(os.Environ(), env...)
	var logs syncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		<-done
		if t.Failed() {
			t.Logf("ephemeral serve:\n%s", logs.String())
		}
	})
	url := "http://" + addr
	for deadline := time.Now().Add(30 * time.Second); ; {
		if resp, err := http.Get(url + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not come up:\n%s", logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	return daemon{url: url, key: key, cmd: cmd, done: done}
}

func (d daemon) call(t *testing.T, method, path string, body io.Reader, header map[string]string, into any) int {
	t.Helper()
	req, err := http.NewRequest(method, d.url+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+d.key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
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
	if into != nil {
		if err := json.Unmarshal(raw, into); err != nil {
			t.Fatalf("%s %s: %d %s: %v", method, path, resp.StatusCode, raw, err)
		}
	}
	return resp.StatusCode
}

type apiRun struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Output string `json:"output"`
	Error  *struct {
		Code, Message string
	} `json:"error"`
	Usage struct {
		ModelCalls    int64 `json:"model_calls"`
		Tokens        int64 `json:"tokens"`
		ShellCommands int64 `json:"shell_commands"`
	} `json:"usage"`
	Cost struct {
		Reserved int64 `json:"reserved_micros"`
		Charged  int64 `json:"charged_micros"`
		Released int64 `json:"released_micros"`
		Model    int64 `json:"model_micros"`
		Web      int64 `json:"web_micros"`
		Compute  int64 `json:"compute_micros"`
	} `json:"cost"`
	events []apiEvent
}

type apiEvent struct {
	T        float64        `json:"t"`
	Category string         `json:"category"`
	Message  string         `json:"message"`
	Data     map[string]any `json:"data"`
}

// waitRun polls the run until it has ended and returns it with its timeline.
func (d daemon) waitRun(t *testing.T, id string) (apiRun, []apiEvent) {
	t.Helper()
	var run apiRun
	for deadline := time.Now().Add(4 * time.Minute); ; {
		d.call(t, "GET", "/v1/runs/"+id, nil, nil, &run)
		if run.Status != "queued" && run.Status != "running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s still %s", id, run.Status)
		}
		time.Sleep(250 * time.Millisecond)
	}
	var page struct {
		Data []apiEvent `json:"data"`
	}
	d.call(t, "GET", "/v1/runs/"+id+"/events", nil, nil, &page)
	return run, page.Data
}

// The product page's run end to end: its curl request, verbatim, against
// the real daemon, the model scripted with the page's three turns, and the
// commands really executed in a microVM.
func TestProductPageRunEndToEnd(t *testing.T) {
	state := cliState(t)
	fake, handler := pageModel(t)
	model := httptest.NewServer(handler)
	defer model.Close()
	// The page's request names no model: the daemon's default is the
	// page's.
	d := startServe(t, state, "EPHEMERAL_OPENAI_BASE_URL="+model.URL+"/v1", "EPHEMERAL_OPENAI_API_KEY="+fake.APIKey,
		"EPHEMERAL_DEFAULT_MODEL=openai/gpt-6-luna")

	var created apiRun
	status := d.call(t, "POST", "/v1/runs", strings.NewReader(productPageRequest),
		map[string]string{"Content-Type": "application/json", "Idempotency-Key": "3b1f8e0e-8c55-4d0e-9a43-7d3f6b0e2a11"}, &created)
	if status != http.StatusCreated && status != http.StatusAccepted && status != http.StatusOK {
		t.Fatalf("POST /v1/runs: %d %+v", status, created)
	}
	run, events := d.waitRun(t, created.ID)
	if run.Status != "succeeded" {
		t.Fatalf("run %s: %+v", run.Status, run.Error)
	}

	want := []string{
		"Queued: Budget $0.04 reserved",
		"MicroVM: microVM ready",
		"MicroVM: worker started · shell on · web off",
		"Shell: $ " + pageWhoami,
		"Shell: $ " + pageCurl,
		"Shell: $ " + pagePrimes,
		"Shell: $ " + pageProof,
		"MicroVM: microVM destroyed",
		"Successful: 3 model calls, 5,214 tokens",
	}
	var got []string
	for _, ev := range events {
		got = append(got, ev.Category+": "+ev.Message)
	}
	settled := "Worker destroyed: " + timeline.Settled(run.Cost.Charged, run.Cost.Released)
	if len(got) != len(want)+1 || strings.Join(got[:len(want)], "\n") != strings.Join(want, "\n") || !strings.HasPrefix(got[len(want)], "Worker destroyed: ") {
		t.Fatalf("timeline:\n%s\nwant:\n%s\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"), settled)
	}
	if events[3].T != events[4].T || events[5].T != events[6].T || !(events[4].T < events[5].T) {
		t.Errorf("parallel commands' t: %v %v, then %v %v", events[3].T, events[4].T, events[5].T, events[6].T)
	}
	for i := 1; i < len(events); i++ {
		if events[i].T < events[i-1].T && events[i].Category != "Shell" {
			t.Errorf("t goes back at %q: %v after %v", got[i], events[i].T, events[i-1].T)
		}
	}

	// What the model was sent back is what the VM really printed.
	reqs := fake.Requests()
	if len(reqs) != 3 {
		t.Fatalf("model got %d requests", len(reqs))
	}
	scratch := regexp.MustCompile(`/tmp/ephemeral-run-[A-Za-z0-9]{6}/scratch`)
	r2, r3 := reqs[1].ToolResults, reqs[2].ToolResults
	if len(r2) != 2 || !strings.Contains(r2[0].Content, "\nworker\n") || !scratch.MatchString(r2[0].Content) ||
		!strings.Contains(r2[1].Content, "Could not resolve host: example.com") {
		t.Errorf("turn 1 results sent to the model: %+v", r2)
	}
	if len(r3) != 2 || !strings.Contains(r3[0].Content, "2 3 5 7 11 13 17 19 23 29 31 37 41 43 47") ||
		!regexp.MustCompile(`-rw-r--r-- 1 worker worker 14 .* /tmp/proof.txt`).MatchString(r3[1].Content) {
		t.Errorf("turn 2 results sent to the model: %+v", r3)
	}

	// The answer quotes those real results.
	for _, want := range []string{"2 3 5 7 11 13 17 19 23 29 31 37 41 43 47", "whoami: worker", "Could not resolve host: example.com", "/tmp/proof.txt", "did not succeed"} {
		if !strings.Contains(run.Output, want) {
			t.Errorf("output lacks %q:\n%s", want, run.Output)
		}
	}
	if !scratch.MatchString(run.Output) {
		t.Errorf("output lacks the scratch path:\n%s", run.Output)
	}

	c := run.Cost
	if c.Reserved != 40000 || c.Reserved != c.Charged+c.Released || c.Model+c.Web+c.Compute != c.Charged || c.Model != 330 || c.Compute <= 0 {
		t.Errorf("cost %+v", c)
	}
	if run.Usage.ModelCalls != 3 || run.Usage.Tokens != 5214 || run.Usage.ShellCommands != 4 {
		t.Errorf("usage %+v", run.Usage)
	}
	if got[len(got)-1] != settled {
		t.Errorf("settled entry %q, want %q", got[len(got)-1], settled)
	}

	// The run's recording is kept with it in the database, and a file saved
	// from the API replays in a fresh microVM as the shipped one does.
	var rec json.RawMessage
	if status := d.call(t, "GET", "/v1/runs/"+run.ID+"/recording", nil, nil, &rec); status != http.StatusOK ||
		!bytes.Contains(rec, []byte("did not succeed")) {
		t.Fatalf("recording of the run: %d %.200s", status, rec)
	}
	if _, err := os.Stat(filepath.Join(state, "recordings")); !os.IsNotExist(err) {
		t.Errorf("recordings written outside the database: %v", err)
	}
	saved := filepath.Join(t.TempDir(), "run.json")
	if err := os.WriteFile(saved, rec, 0o600); err != nil {
		t.Fatal(err)
	}
	replay := runCLI(t, cliState(t), "run", "--replay", saved)
	if replay.code != 0 || !regexp.MustCompile(`(?m)^ +│ 2 3 5 7 11 13 17 19 23 29 31 37 41 43 47$`).MatchString(replay.stdout) {
		t.Errorf("replay of the saved recording: exit %d\n%s\n%s", replay.code, replay.stdout, replay.stderr)
	}

	// Deleting the run purges its recording.
	if status := d.call(t, "DELETE", "/v1/runs/"+run.ID, nil, nil, nil); status != http.StatusOK {
		t.Fatalf("DELETE: %d", status)
	}
	if status := d.call(t, "GET", "/v1/runs/"+run.ID+"/recording", nil, nil, nil); status != http.StatusNotFound {
		t.Errorf("recording after DELETE: %d", status)
	}
}

// The README's main command: the shipped recording of the product page's
// run, replayed with no API key, its commands executed in a real microVM.
func TestReplayProductPage(t *testing.T) {
	state := cliState(t)
	r := runCLI(t, state, "run", "--replay", "../examples/product-page.json")
	if r.code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	lines := []*regexp.Regexp{
		regexp.MustCompile(`(?m)^ +0\.00 +Queued +Budget \$0\.04 reserved$`),
		regexp.MustCompile(`(?m)^ +[0-9.]+ +MicroVM +microVM ready$`),
		regexp.MustCompile(`(?m)^ +[0-9.]+ +MicroVM +worker started · shell on · web off$`),
		regexp.MustCompile(`(?m)^ +[0-9.]+ +Model +replay: `),
		// A command's result is printed right below it, or below a line
		// that repeats it when its parallel sibling was printed in between.
		regexp.MustCompile(`(?m)^ +[0-9.]+ +Shell +\$ pwd; whoami( +→ exit 0 after [0-9.]+ s)?\n +│ /tmp/ephemeral-run-[A-Za-z0-9]{6}/scratch\n +│ worker$`),
		regexp.MustCompile(`(?m)^ +[0-9.]+ +Shell +\$ command -v curl .*\n(.*\n)* +│ curl: \(6\) Could not resolve host: example\.com$`),
		regexp.MustCompile(`(?m)^ +[0-9.]+ +Shell +\$ printf '%s\\n' '#!/usr/bin/env python3'.*\n +│ 2 3 5 7 11 13 17 19 23 29 31 37 41 43 47$`),
		regexp.MustCompile(`(?m)^ +[0-9.]+ +Shell +\$ printf 'sandbox proof\\n' > /tmp/proof\.txt .*\n +│ -rw-r--r-- 1 worker worker 14 .* /tmp/proof\.txt$`),
		regexp.MustCompile(`(?m)^ +[0-9.]+ +MicroVM +microVM destroyed$`),
		regexp.MustCompile(`(?m)^ +[0-9.]+ +Successful +3 model calls, 5,214 tokens$`),
		regexp.MustCompile(`(?m)^ +[0-9.]+ +Worker destroyed +\$0\.[0-9]+ charged, \$0\.[0-9]+ released$`),
		regexp.MustCompile(`(?m)^The network call did not succeed\.$`),
		regexp.MustCompile(`(?m)^model \$0\.00033 · web \$0\.00 · compute \$0\.[0-9]+$`),
	}
	rest := r.stdout
	for _, re := range lines {
		loc := re.FindStringIndex(rest)
		if loc == nil {
			t.Fatalf("output lacks, in order, %s:\n%s", re, r.stdout)
		}
		rest = rest[loc[1]:]
	}
	if _, err := os.Stat(filepath.Join(state, "recordings")); !os.IsNotExist(err) {
		t.Errorf("a replay wrote recordings into the state directory: %v", err)
	}
}
