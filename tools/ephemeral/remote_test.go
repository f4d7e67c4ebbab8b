package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/ephemeralhq/ephemeral/tools/ephemeral/internal/fakeapi"
)

const remoteKey = "eph_0123456789abcdef_remote-secret"

// remote is a fake daemon and the environment that points the CLI at it.
type remote struct {
	api *fakeapi.Server
	url string
}

func newRemote(t *testing.T) remote {
	t.Helper()
	api := fakeapi.New(remoteKey)
	api.NewRun = func(id string, _ map[string]any) *fakeapi.Run { return fakeapi.PageRun(id) }
	ts := httptest.NewServer(api)
	t.Cleanup(ts.Close)
	t.Setenv("EPHEMERAL_URL", ts.URL)
	t.Setenv("EPHEMERAL_API_KEY", remoteKey)
	return remote{api: api, url: ts.URL}
}

// cliRun is what a command printed and how it exited.
type cliRun struct {
	stdout, stderr string
	err            error
	code           int // the process's exit status
}

// ephemeral runs the CLI's remote commands in this process, as the binary
// would.
func ephemeral(t *testing.T, args ...string) cliRun {
	t.Helper()
	var out, errOut bytes.Buffer
	app := &cli.App{Name: "ephemeral", Commands: []*cli.Command{runsCommand, balanceCommand}, DisableSliceFlagSeparator: true,
		Writer: &out, ErrWriter: &errOut, ExitErrHandler: func(*cli.Context, error) {}}
	err := app.Run(hoistFlags(append([]string{"ephemeral"}, args...), runsCommand, balanceCommand))
	code := 0
	if err != nil {
		code = exitCode(err)
	}
	return cliRun{out.String(), errOut.String(), err, code}
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

const pageRequest = `{"prompt": "This is a sandbox test.", "web": false, "shell": true, "timeout_seconds": 120, "max_cost_micros": 40000}`

// The product page's timeline as ephemeral run prints it: commands when
// they start, results in timeline order, then the answer and the cost.
const pageTimeline = `  0.00  Queued           Budget $0.04 reserved
  2.42  MicroVM          microVM ready
  2.47  MicroVM          worker started · shell on · web off
  5.25  Shell            $ pwd; whoami
  5.25  Shell            $ command -v curl && curl -sS -m 8 https://example.com
  5.25  Shell            $ pwd; whoami  → exit 0 after 0.23 s
                         │ /tmp/ephemeral-run-d4hLHG/scratch
                         │ worker
  5.25  Shell            $ command -v curl && curl -sS -m 8 https://example.com  → exit 6 after 0.41 s
                         │ /usr/bin/curl
                         │ curl: (6) Could not resolve host: example.com
 10.33  Shell            $ python3 primes.py
 10.33  Shell            $ ls -l /tmp/proof.txt
 10.33  Shell            $ python3 primes.py  → exit 0 after 0.09 s
                         │ 2 3 5 7 11 13 17 19 23 29 31 37 41 43 47
 10.33  Shell            $ ls -l /tmp/proof.txt  → exit 0 after 0.02 s
                         │ -rw-r--r-- 1 worker worker 14 Dec  1 03:05 /tmp/proof.txt
 15.83  MicroVM          microVM destroyed
 15.84  Successful       3 model calls, 5,214 tokens
 16.24  Worker destroyed $0.00353 charged, $0.03647 released

Output:
1. Prime script output: 2 3 5 7 11 13 17 19 23 29 31 37 41 43 47
The network call did not succeed.

model $0.00033 · web $0.00 · compute $0.0032
`

// runs create -f request.json --follow prints the run, then its timeline
// in ephemeral run's format, and exits 0; an event stream that drops,
// even in the middle of an entry, is resumed without printing anything
// twice or leaving anything out.
func TestRunsCreateFollow(t *testing.T) {
	request := writeFile(t, "request.json", pageRequest)
	for _, cuts := range [][]fakeapi.Cut{nil, {{After: 4, Partial: true}, {After: 3}, {After: 7}}} {
		r := newRemote(t)
		r.api.Cuts = cuts
		got := ephemeral(t, "runs", "create", "-f", request, "--follow", "--verbose")
		if got.err != nil {
			t.Fatalf("cuts %v: %v\n%s", cuts, got.err, got.stderr)
		}
		want := fmt.Sprintf("run_%032x  model openai/gpt-6-luna, queued, created\n\n", 1) + pageTimeline
		if got.stdout != want {
			t.Errorf("cuts %v: printed\n%s\nwant\n%s", cuts, got.stdout, want)
		}
		reqs := r.api.Requests()
		if reqs[0].Body != pageRequest {
			t.Errorf("sent %s, want the file verbatim", reqs[0].Body)
		}
		if !regexp.MustCompile(`(?m)^ephemeral: POST http://127\.0\.0\.1:\d+/v1/runs \(Idempotency-Key [0-9a-f-]{36}\)$`).MatchString(got.stderr) ||
			!strings.Contains(got.stderr, reqs[0].IdempotencyKey) {
			t.Errorf("--verbose does not show the Idempotency-Key %q:\n%s", reqs[0].IdempotencyKey, got.stderr)
		}
		if len(cuts) > 0 && strings.Count(got.stderr, "reconnecting in") != len(cuts) {
			t.Errorf("--verbose does not tell the %d reconnections:\n%s", len(cuts), got.stderr)
		}
		if strings.Contains(got.stderr+got.stdout, "remote-secret") {
			t.Errorf("the key is printed:\n%s", got.stderr)
		}
	}
}

// Each way a run can end has its exit status, for runs events --follow as
// for runs create --follow.
func TestFollowExitsWithTheRunsOutcome(t *testing.T) {
	r := newRemote(t)
	for i, tc := range []struct {
		status string
		code   int
	}{{"succeeded", 0}, {"failed", 3}, {"timed_out", 4}, {"budget_exceeded", 5}, {"canceled", 6}} {
		run := fakeapi.PageRun(fmt.Sprintf("run_%032x", 100+i))
		if tc.status != "succeeded" {
			fakeapi.Ended(run, tc.status, tc.status, "the run ended "+tc.status)
		}
		r.api.AddRun(run)
		got := ephemeral(t, "runs", "events", run.Object["id"].(string), "--follow")
		if got.code != tc.code || !strings.Contains(got.stdout, "Worker destroyed") {
			t.Errorf("%s: exit %d (%v), want %d\n%s", tc.status, got.code, got.err, tc.code, got.stdout)
		}
		if tc.code != 0 && !strings.Contains(got.err.Error(), "the run ended "+tc.status) {
			t.Errorf("%s: %v", tc.status, got.err)
		}
	}
	if !strings.Contains(runsCommand.Subcommands[0].Description, "3 failed, 4 timed_out, 5 budget_exceeded, 6 canceled") {
		t.Error("runs create --help does not list the exit statuses")
	}
}

// Flags make the request, or override the file's fields; a field given
// twice in the file is refused rather than guessed at.
func TestRunsCreateRequestFromFlags(t *testing.T) {
	r := newRemote(t)
	local := writeFile(t, "data.csv", "a,b\n1,2\n")
	got := ephemeral(t, "runs", "create", "--prompt", "sum the columns", "--max-cost-micros", "40000", "--shell",
		"--connection", "crm:GET,HEAD", "--input", "in/data.csv="+local, "--timeout-seconds", "60")
	if got.err != nil {
		t.Fatal(got.err)
	}
	var sent map[string]any
	json.Unmarshal([]byte(r.api.Requests()[0].Body), &sent)
	want := `map[connections:[map[methods:[GET HEAD] name:crm]] files:[map[content:a,b
1,2
 path:in/data.csv]] max_cost_micros:40000 prompt:sum the columns shell:true timeout_seconds:60]`
	if fmt.Sprint(sent) != want {
		t.Errorf("sent %v\nwant %s", sent, want)
	}
	if !strings.Contains(got.stderr, "follow it with: ephemeral runs events run_") {
		t.Errorf("stderr %q", got.stderr)
	}

	request := writeFile(t, "request.json", pageRequest)
	if got := ephemeral(t, "runs", "create", "-f", request, "--web", "--max-cost-micros", "1000"); got.err != nil {
		t.Fatal(got.err)
	}
	json.Unmarshal([]byte(r.api.Requests()[1].Body), &sent)
	if sent["web"] != true || sent["max_cost_micros"] != 1000.0 || sent["shell"] != true || sent["prompt"] != "This is a sandbox test." {
		t.Errorf("file with flags sent %v", sent)
	}

	twice := writeFile(t, "twice.json", `{"prompt": "p", "web": false, "web": true, "max_cost_micros": 1}`)
	if got := ephemeral(t, "runs", "create", "-f", twice, "--shell"); got.err == nil || !strings.Contains(got.err.Error(), `parameter "web" is given more than once`) {
		t.Errorf("a field twice: %v", got.err)
	}
	for _, args := range [][]string{
		{"--shell"}, // no prompt
		{"--prompt", "p", "--connection", "crm"},
		{"--prompt", "p", "--input", "nowhere"},
	} {
		if got := ephemeral(t, append([]string{"runs", "create"}, args...)...); got.err == nil {
			t.Errorf("%v accepted", args)
		}
	}
	if n := len(r.api.Requests()); n != 2 {
		t.Errorf("%d requests reached the API, want only the 2 good ones", n)
	}

	// The API's own refusal names the field.
	got = ephemeral(t, "runs", "create", "--prompt", "p")
	if got.code != 1 || got.err.Error() != `runs create: max_cost_micros is required (HTTP 400, invalid_request_error/parameter_missing, param "max_cost_micros")` {
		t.Errorf("missing budget: %d %v", got.code, got.err)
	}
}

// --json prints the API's objects, one a line, for scripts.
func TestJSONOutputs(t *testing.T) {
	r := newRemote(t)
	for i := 1; i <= 3; i++ {
		r.api.AddRun(fakeapi.PageRun(fmt.Sprintf("run_%032x", 100+i)))
	}
	id := fmt.Sprintf("run_%032x", 101)
	decodeLines := func(args ...string) []map[string]any {
		t.Helper()
		got := ephemeral(t, args...)
		if got.err != nil {
			t.Fatalf("%v: %v", args, got.err)
		}
		var objects []map[string]any
		for _, line := range strings.Split(strings.TrimSuffix(got.stdout, "\n"), "\n") {
			var o map[string]any
			if err := json.Unmarshal([]byte(line), &o); err != nil {
				t.Fatalf("%v: line %q: %v", args, line, err)
			}
			objects = append(objects, o)
		}
		return objects
	}
	if o := decodeLines("runs", "get", id, "--json"); len(o) != 1 || o[0]["id"] != id || o[0]["object"] != "run" {
		t.Errorf("get: %v", o)
	}
	if o := decodeLines("runs", "list", "--json", "--limit", "2"); len(o) != 1 || o[0]["object"] != "list" || len(o[0]["data"].([]any)) != 2 || o[0]["has_more"] != true {
		t.Errorf("list: %v", o)
	}
	if o := decodeLines("runs", "list", "--json", "--limit", "2", "--all"); len(o) != 2 || o[1]["has_more"] != false {
		t.Errorf("list --all: %v", o)
	}
	if o := decodeLines("balance", "--json"); len(o) != 1 || o[0]["object"] != "balance" || o[0]["available_micros"] != 4996470.0 {
		t.Errorf("balance: %v", o)
	}
	if o := decodeLines("runs", "events", id, "--json"); len(o) != 10 || o[3]["rev"] != 6.0 {
		t.Errorf("events: %d %v", len(o), o)
	}
	// Following: every revision as sent, then the ended run.
	o := decodeLines("runs", "events", id, "--json", "--follow")
	if len(o) != 15 || o[5]["id"] != 4.0 || o[5]["rev"] != 6.0 || o[14]["object"] != "run" || o[14]["status"] != "succeeded" {
		t.Errorf("events --follow: %d %v", len(o), o)
	}
	o = decodeLines("runs", "create", "-f", writeFile(t, "r.json", pageRequest), "--json", "--follow")
	if len(o) != 16 || o[0]["status"] != "queued" || o[15]["status"] != "succeeded" {
		t.Errorf("create --follow: %d %v", len(o), o)
	}
	if o := decodeLines("runs", "cancel", id, "--json"); len(o) != 1 || o[0]["id"] != id {
		t.Errorf("cancel: %v", o)
	}
	if o := decodeLines("runs", "delete", id, "--json"); len(o) != 1 || o[0]["purged_at"] == nil {
		t.Errorf("delete: %v", o)
	}
}

// What people read: a run, a page of runs with the way to the next, the
// timeline as it is, the balance, a recording saved for replay.
func TestHumanOutputs(t *testing.T) {
	r := newRemote(t)
	for i := 1; i <= 3; i++ {
		r.api.AddRun(fakeapi.PageRun(fmt.Sprintf("run_%032x", 100+i)))
	}
	id := fmt.Sprintf("run_%032x", 103)
	got := ephemeral(t, "runs", "get", id)
	for _, want := range []string{
		"id:        " + id + "\n", "status:    succeeded\n",
		"usage:     3 model calls, 5,214 tokens, 4 shell commands, 0 web requests, 13.3 VM-seconds\n",
		"cost:      $0.04 reserved, $0.00353 charged, $0.03647 released (model $0.00033 · web $0.00 · compute $0.0032)\n",
		"\nOutput:\n1. Prime script output:",
	} {
		if !strings.Contains(got.stdout, want) {
			t.Errorf("runs get lacks %q:\n%s", want, got.stdout)
		}
	}
	got = ephemeral(t, "runs", "list", "--limit", "2")
	if !regexp.MustCompile(`^ID +STATUS +MODEL +CREATED +CHARGED\n`+id+` +succeeded +openai/gpt-6-luna +2026-12-01 03:05:00Z +\$0\.00353\n`+
		fmt.Sprintf("run_%032x", 102)+` `).MatchString(got.stdout) ||
		got.stderr != fmt.Sprintf("more: ephemeral runs list --starting-after run_%032x (or --all)\n", 102) {
		t.Errorf("runs list:\n%s%s", got.stdout, got.stderr)
	}
	if got := ephemeral(t, "runs", "list", "--status", "failed"); strings.Count(got.stdout, "\n") != 1 || r.api.Requests()[len(r.api.Requests())-1].Query != "status=failed" {
		t.Errorf("runs list --status failed:\n%s", got.stdout)
	}
	// The timeline as it is: each entry once, with its latest data.
	got = ephemeral(t, "runs", "events", id)
	wantTimeline := `  0.00  Queued           Budget $0.04 reserved
  2.42  MicroVM          microVM ready
  2.47  MicroVM          worker started · shell on · web off
  5.25  Shell            $ pwd; whoami
                         │ /tmp/ephemeral-run-d4hLHG/scratch
                         │ worker
  5.25  Shell            $ command -v curl && curl -sS -m 8 https://example.com
                         │ /usr/bin/curl
                         │ curl: (6) Could not resolve host: example.com
 10.33  Shell            $ python3 primes.py
                         │ 2 3 5 7 11 13 17 19 23 29 31 37 41 43 47
 10.33  Shell            $ ls -l /tmp/proof.txt
                         │ -rw-r--r-- 1 worker worker 14 Dec  1 03:05 /tmp/proof.txt
 15.83  MicroVM          microVM destroyed
 15.84  Successful       3 model calls, 5,214 tokens
 16.24  Worker destroyed $0.00353 charged, $0.03647 released
`
	if got.stdout != wantTimeline {
		t.Errorf("runs events:\n%s\nwant\n%s", got.stdout, wantTimeline)
	}
	if got := ephemeral(t, "balance"); got.stdout != "available        $4.99647    4996470 micros\nheld                $0.00          0 micros\n"+
		"charged          $0.00353       3530 micros\ncredited            $5.00    5000000 micros\n" {
		t.Errorf("balance:\n%s", got.stdout)
	}
	saved := filepath.Join(t.TempDir(), "run.json")
	if got := ephemeral(t, "runs", "recording", id, "-o", saved); got.err != nil || !strings.Contains(got.stderr, "ephemeral run --replay "+saved) {
		t.Errorf("recording: %v %s", got.err, got.stderr)
	}
	if info, err := os.Stat(saved); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("saved recording: %v %v", info, err)
	}
}

// Without a key nothing is sent and the error says where a key comes from;
// a wrong key is the API's 401 in words.
func TestRemoteNeedsAKey(t *testing.T) {
	r := newRemote(t)
	t.Setenv("EPHEMERAL_API_KEY", "")
	got := ephemeral(t, "balance")
	if got.code != 1 || !strings.Contains(got.err.Error(), "balance: no API key: set EPHEMERAL_API_KEY (or --api-key)") || len(r.api.Requests()) != 0 {
		t.Errorf("no key: %d %v", got.code, got.err)
	}
	got = ephemeral(t, "runs", "list", "--api-key", "eph_0123456789abcdef_wrong")
	if got.code != 1 || !strings.Contains(got.err.Error(), "send a valid API key as Authorization: Bearer eph_... (HTTP 401, authentication_error/invalid_api_key)") {
		t.Errorf("wrong key: %d %v", got.code, got.err)
	}
	got = ephemeral(t, "runs", "get")
	if got.err == nil || !strings.Contains(got.err.Error(), "runs get: expected exactly one argument RUN_ID, got 0") {
		t.Errorf("no run id: %v", got.err)
	}
}

// The client's settings: a flag beats the variable, the variable the
// default; neither is a daemon setting.
func TestClientSettingsPrecedence(t *testing.T) {
	r := newRemote(t)
	other := httptest.NewServer(fakeapi.New("eph_fedcba9876543210_other"))
	defer other.Close()
	t.Setenv("EPHEMERAL_URL", other.URL)
	if got := ephemeral(t, "balance", "--url", r.url); got.err != nil {
		t.Errorf("--url over the variable: %v", got.err)
	}
	if got := ephemeral(t, "balance"); got.err == nil || !strings.Contains(got.err.Error(), "HTTP 401") {
		t.Errorf("the variable's daemon, which does not know the key: %v", got.err)
	}
	t.Setenv("EPHEMERAL_URL", "")
	if got := ephemeral(t, "balance"); got.err == nil || !strings.Contains(got.err.Error(), "http://127.0.0.1:8080") {
		t.Errorf("the default URL: %v", got.err)
	}
	var exit cli.ExitCoder
	if got := ephemeral(t, "balance", "--url", r.url); errors.As(got.err, &exit) {
		t.Errorf("an API success is an exit %d", exit.ExitCode())
	}
}

// Flags typed after a remote command's argument count as flags; other
// commands' arguments, and anything after "--", stay as typed.
func TestHoistFlags(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"ephemeral runs get run_1 --json", "ephemeral runs get --json run_1"},
		{"ephemeral runs create -f - --follow", "ephemeral runs create -f - --follow"},
		{"ephemeral runs create --follow -f request.json", "ephemeral runs create --follow -f request.json"},
		{"ephemeral runs events run_1 --url http://h:1 --follow", "ephemeral runs events --url http://h:1 --follow run_1"},
		{"ephemeral runs recording run_1 -o=run.json", "ephemeral runs recording -o=run.json run_1"},
		{"ephemeral runs get -- --json", "ephemeral runs get -- --json"},
		{"ephemeral balance --json", "ephemeral balance --json"},
		{"ephemeral sandbox exec ls -l", "ephemeral sandbox exec ls -l"},
		{"ephemeral --state-dir /s admin org list", "ephemeral --state-dir /s admin org list"},
	} {
		if got := strings.Join(hoistFlags(strings.Fields(tc.in), runsCommand, balanceCommand), " "); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.in, got, tc.want)
		}
	}
}
