package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// remoteCLI runs the CLI's remote commands against a daemon, with the
// settings in the environment as the README's quick start sets them.
func remoteCLI(t *testing.T, daemonURL, key string, args ...string) cliResult {
	t.Helper()
	bin := buildCLI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "EPHEMERAL_URL="+daemonURL, "EPHEMERAL_API_KEY="+key)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("ephemeral %v: %v", args, err)
	}
	return cliResult{stdout.String(), stderr.String(), code}
}

// cuttingProxy forwards to the daemon and resets the first event stream
// after cutAfter messages, in the middle of the next one, as a flaky
// network or load balancer would.
type cuttingProxy struct {
	*httptest.Server
	mu      sync.Mutex
	streams []string // each event stream's Last-Event-ID
}

func newCuttingProxy(t *testing.T, daemonURL string, cutAfter int) *cuttingProxy {
	t.Helper()
	target, err := url.Parse(daemonURL)
	if err != nil {
		t.Fatal(err)
	}
	p := &cuttingProxy{}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.FlushInterval = -1
	rp.ModifyResponse = func(resp *http.Response) error {
		if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			return nil
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		p.streams = append(p.streams, resp.Request.Header.Get("Last-Event-ID"))
		if len(p.streams) == 1 {
			resp.Body = &cutReader{r: resp.Body, messages: cutAfter}
		}
		return nil
	}
	p.Server = httptest.NewServer(rp)
	t.Cleanup(p.Close)
	return p
}

func (p *cuttingProxy) lastEventIDs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.streams...)
}

// cutReader passes a stream through until it has passed the given number
// of messages (blank-line ends) and a few bytes of the next, then fails.
type cutReader struct {
	r        io.ReadCloser
	messages int
	tail     int // bytes of the next message still let through
	cut      bool
	prev     byte
}

var errCut = errors.New("connection cut by the test's proxy")

func (c *cutReader) Read(b []byte) (int, error) {
	if c.cut {
		return 0, errCut
	}
	n, err := c.r.Read(b)
	for i := 0; i < n; i++ {
		if c.messages == 0 {
			if c.tail == 0 {
				c.cut = true
				return i, nil
			}
			c.tail--
			continue
		}
		if b[i] == '\n' && c.prev == '\n' {
			c.messages--
			c.tail = 12 // "id: 5\nevent:": an entry cut short
		}
		c.prev = b[i]
	}
	return n, err
}

func (c *cutReader) Close() error { return c.r.Close() }

// The README's quick start end to end: the product page's request.json
// sent with `ephemeral runs create -f request.json --follow` to a real
// daemon (the model scripted with the page's turns, the commands run in a
// microVM) through a proxy that cuts the event stream mid-run. The CLI
// resumes it and prints the page's timeline in ephemeral run's format,
// each line once, then the answer and the cost, and exits 0; the other
// remote commands read the same run; a call without a key is refused in
// words.
func TestRemoteCLIFollowsTheProductPageRun(t *testing.T) {
	state := cliState(t)
	fake, handler := pageModel(t)
	model := httptest.NewServer(handler)
	defer model.Close()
	d := startServe(t, state, "EPHEMERAL_OPENAI_BASE_URL="+model.URL+"/v1", "EPHEMERAL_OPENAI_API_KEY="+fake.APIKey,
		"EPHEMERAL_DEFAULT_MODEL=openai/gpt-6-luna")
	proxy := newCuttingProxy(t, d.url, 4)
	request := filepath.Join(t.TempDir(), "request.json")
	if err := os.WriteFile(request, []byte(productPageRequest), 0o600); err != nil {
		t.Fatal(err)
	}

	r := remoteCLI(t, proxy.URL, d.key, "runs", "create", "-f", request, "--follow", "--verbose")
	if r.code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	id := regexp.MustCompile(`^(run_[0-9a-f]{32})  model openai/gpt-6-luna, queued, created\n\n`).FindStringSubmatch(r.stdout)
	if id == nil {
		t.Fatalf("first line:\n%s", r.stdout)
	}
	lines := []*regexp.Regexp{
		regexp.MustCompile(`(?m)^ +0\.00 +Queued +Budget \$0\.04 reserved$`),
		regexp.MustCompile(`(?m)^ +[0-9.]+ +MicroVM +microVM ready$`),
		regexp.MustCompile(`(?m)^ +[0-9.]+ +MicroVM +worker started · shell on · web off$`),
		regexp.MustCompile(`(?m)^ +[0-9.]+ +Shell +\$ pwd; whoami( +→ exit 0 after [0-9.]+ s)?\n +│ /tmp/ephemeral-run-[A-Za-z0-9]{6}/scratch\n +│ worker$`),
		regexp.MustCompile(`(?m)^ +[0-9.]+ +Shell +\$ command -v curl .*\n(.*\n)* +│ curl: \(6\) Could not resolve host: example\.com$`),
		regexp.MustCompile(`(?m)^ +[0-9.]+ +Shell +\$ printf '%s\\n' '#!/usr/bin/env python3'.*\n(.*\n)* +│ 2 3 5 7 11 13 17 19 23 29 31 37 41 43 47$`),
		regexp.MustCompile(`(?m)^ +[0-9.]+ +Shell +\$ printf 'sandbox proof\\n' > /tmp/proof\.txt .*\n +│ -rw-r--r-- 1 worker worker 14 .* /tmp/proof\.txt$`),
		regexp.MustCompile(`(?m)^ +[0-9.]+ +MicroVM +microVM destroyed$`),
		regexp.MustCompile(`(?m)^ +[0-9.]+ +Successful +3 model calls, 5,214 tokens$`),
		regexp.MustCompile(`(?m)^ +[0-9.]+ +Worker destroyed +\$0\.[0-9]+ charged, \$0\.[0-9]+ released$`),
		regexp.MustCompile(`(?m)^Output:\n(.*\n)*The network call did not succeed\.$`),
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
	// Nothing twice: each entry's line once, each command's start once and
	// its result at most once more, each output line once.
	timeline, _, _ := strings.Cut(r.stdout, "\nOutput:")
	for _, once := range []string{"Budget $0.04 reserved", "microVM ready", "worker started", "microVM destroyed", "3 model calls", "charged,",
		"│ worker", "Could not resolve host", "│ 2 3 5 7 11", "│ -rw-r--r--"} {
		if n := strings.Count(timeline, once); n != 1 {
			t.Errorf("%q printed %d times:\n%s", once, n, r.stdout)
		}
	}
	for _, cmd := range []string{"$ pwd; whoami", "$ command -v curl", "$ printf 'sandbox proof"} {
		if n := strings.Count(timeline, cmd); n < 1 || n > 2 {
			t.Errorf("%q printed %d times:\n%s", cmd, n, r.stdout)
		}
	}
	streams := proxy.lastEventIDs()
	if len(streams) < 2 || streams[0] != "" || streams[1] == "" {
		t.Errorf("event streams through the proxy, by Last-Event-ID: %q", streams)
	}
	t.Logf("event streams through the proxy, by Last-Event-ID: %q", streams)
	if !strings.Contains(r.stderr, "connection cut") && !strings.Contains(r.stderr, "reconnecting in") {
		t.Errorf("--verbose does not tell the reconnection:\n%s", r.stderr)
	}
	if strings.Contains(r.stderr+r.stdout, d.key) {
		t.Error("the API key was printed")
	}

	// The same run, read back as scripts read it (flags after the id).
	var run apiRun
	r = remoteCLI(t, d.url, d.key, "runs", "get", id[1], "--json")
	if err := json.Unmarshal([]byte(r.stdout), &run); err != nil || run.Status != "succeeded" || run.Cost.Charged <= 0 {
		t.Errorf("runs get --json: %v %+v\n%s%s", err, run, r.stdout, r.stderr)
	}
	var page struct {
		Object string   `json:"object"`
		Data   []apiRun `json:"data"`
	}
	r = remoteCLI(t, d.url, d.key, "runs", "list", "--json", "--status", "succeeded")
	if err := json.Unmarshal([]byte(r.stdout), &page); err != nil || page.Object != "list" || len(page.Data) != 1 || page.Data[0].ID != id[1] {
		t.Errorf("runs list --json: %v %+v\n%s%s", err, page, r.stdout, r.stderr)
	}
	var balance struct {
		Object   string `json:"object"`
		Charged  int64  `json:"charged_micros"`
		Credited int64  `json:"credited_micros"`
	}
	r = remoteCLI(t, d.url, d.key, "balance", "--json")
	if err := json.Unmarshal([]byte(r.stdout), &balance); err != nil || balance.Object != "balance" || balance.Charged != run.Cost.Charged || balance.Credited != 5_000_000 {
		t.Errorf("balance --json: %v %+v\n%s%s", err, balance, r.stdout, r.stderr)
	}
	r = remoteCLI(t, d.url, d.key, "runs", "events", id[1])
	if r.code != 0 || !strings.Contains(r.stdout, "│ worker\n") || strings.Count(r.stdout, "$ pwd; whoami") != 1 {
		t.Errorf("runs events:\n%s%s", r.stdout, r.stderr)
	}
	saved := filepath.Join(t.TempDir(), "run.json")
	if r = remoteCLI(t, d.url, d.key, "runs", "recording", id[1], "-o", saved); r.code != 0 {
		t.Errorf("runs recording: %s", r.stderr)
	} else if b, _ := os.ReadFile(saved); !bytes.Contains(b, []byte("did not succeed")) {
		t.Errorf("the saved recording: %.200s", b)
	}

	// The key's use shows in the administrator's list.
	admin := runCLI(t, state, "admin", "key", "list", "--org", "acme")
	if admin.code != 0 || !regexp.MustCompile(`dev@acme\.example +\S+ \S+ +\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ +-`).MatchString(admin.stdout) {
		t.Errorf("admin key list after use:\n%s%s", admin.stdout, admin.stderr)
	}

	// Without a key nothing is sent; with a wrong one the API says why.
	r = remoteCLI(t, d.url, "", "runs", "list")
	if r.code != 1 || !strings.Contains(r.stderr, "ephemeral: runs list: no API key: set EPHEMERAL_API_KEY (or --api-key)") {
		t.Errorf("no key: exit %d\n%s", r.code, r.stderr)
	}
	r = remoteCLI(t, d.url, "eph_0123456789abcdef_"+strings.Repeat("A", 43), "runs", "get", id[1])
	if r.code != 1 || !strings.Contains(r.stderr, "send a valid API key as Authorization: Bearer eph_... (HTTP 401, authentication_error/invalid_api_key)") {
		t.Errorf("wrong key: exit %d\n%s", r.code, r.stderr)
	}

	if r = remoteCLI(t, d.url, d.key, "runs", "delete", id[1]); r.code != 0 || r.stdout != id[1]+": content purged\n" {
		t.Errorf("runs delete: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
