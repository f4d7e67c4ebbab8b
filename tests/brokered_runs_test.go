package tests

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/agent"
	"github.com/ephemeralhq/ephemeral/hostd/broker"
	"github.com/ephemeralhq/ephemeral/hostd/config"
	"github.com/ephemeralhq/ephemeral/hostd/examplecrm"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/system"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
	"github.com/ephemeralhq/ephemeral/tests/fakeprovider"
)

func toolCall(id, name string, args map[string]string) fakeprovider.ToolCall {
	raw, _ := json.Marshal(args)
	return fakeprovider.ToolCall{ID: id, Name: name, Arguments: string(raw)}
}

// resultsByID maps the tool results a model request carried by call id.
func resultsByID(req fakeprovider.Request) map[string]string {
	out := map[string]string{}
	for _, r := range req.ToolResults {
		out[r.CallID] = r.Content
	}
	return out
}

// serveModel starts the scripted model for a daemon and returns the
// environment that points the daemon at it.
func serveModel(t *testing.T, script ...fakeprovider.Turn) (*fakeprovider.Server, []string) {
	t.Helper()
	fake := fakeprovider.New(script...)
	fake.APIKey = "sk-test-provider"
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	return fake, []string{"EPHEMERAL_OPENAI_BASE_URL=" + srv.URL + "/v1", "EPHEMERAL_OPENAI_API_KEY=" + fake.APIKey,
		"EPHEMERAL_DEFAULT_MODEL=openai/gpt-6-luna"}
}

// submit posts a run request and waits for the run's end.
func (d daemon) submit(t *testing.T, request string) apiRun {
	t.Helper()
	var created apiRun
	if status := d.call(t, "POST", "/v1/runs", strings.NewReader(request), map[string]string{"Content-Type": "application/json"}, &created); status >= 300 {
		t.Fatalf("POST /v1/runs: %d %+v", status, created.Error)
	}
	run, events := d.waitRun(t, created.ID)
	run.events = events
	return run
}

// A run granted the built-in example CRM, through the real daemon: the
// model calls it with connection_request, the code in the VM with curl at
// $EPHEMERAL_CONNECTIONS_URL; a POST the run was not granted is refused;
// every call is on the timeline and the credential reaches neither.
func TestConnectionRunThroughServe(t *testing.T) {
	state := cliState(t)
	curlGet := `curl -sS -m 30 "$EPHEMERAL_CONNECTIONS_URL/example-crm/customers?country=DE"`
	curlPost := `curl -sS -m 30 -o /dev/null -w '%{http_code}' -X POST -d '{}' "$EPHEMERAL_CONNECTIONS_URL/example-crm/customers"`
	fake, env := serveModel(t,
		fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{
			toolCall("tool", agent.ConnectionTool, map[string]string{"connection": examplecrm.Name, "path": "/customers/1"}),
			shellCall("get", curlGet),
			shellCall("post", curlPost),
		}, Usage: fakeprovider.Usage{InputTokens: 1200, OutputTokens: 60}},
		fakeprovider.Turn{Text: "Ada Analytics GmbH and Elbe Health e.V. are the German customers.",
			Usage: fakeprovider.Usage{InputTokens: 1800, OutputTokens: 20}},
	)
	d := startServe(t, state, env...)
	run := d.submit(t, `{"prompt": "Which customers are in Germany?", "shell": true, "web": false,
		"connections": [{"name": "example-crm", "methods": ["GET"]}], "timeout_seconds": 120, "max_cost_micros": 40000}`)
	if run.Status != "succeeded" {
		t.Fatalf("run %s: %+v\n%s", run.Status, run.Error, strings.Join(run.messages(), "\n"))
	}

	reqs := fake.Requests()
	if len(reqs) != 2 {
		t.Fatalf("model got %d requests", len(reqs))
	}
	if !slices.Contains(reqs[0].ToolNames, agent.ConnectionTool) || slices.Contains(reqs[0].ToolNames, agent.WebFetchTool) {
		t.Errorf("offered tools %v", reqs[0].ToolNames)
	}
	got := resultsByID(reqs[1])
	if !strings.Contains(got["tool"], "status: 200") || !strings.Contains(got["tool"], "Ada Analytics GmbH") {
		t.Errorf("connection_request result: %q", got["tool"])
	}
	if !strings.Contains(got["get"], "exit code: 0") || !strings.Contains(got["get"], "Elbe Health e.V.") || strings.Contains(got["get"], "Bergfeld") {
		t.Errorf("curl GET result: %q", got["get"])
	}
	if !strings.Contains(got["post"], "stdout:\n403") {
		t.Errorf("curl POST result: %q", got["post"])
	}
	for _, r := range reqs {
		if strings.Contains(string(r.Body), examplecrm.DemoToken) {
			t.Errorf("the connection's credential reached the model")
		}
	}

	lines := run.messages()
	for _, want := range []string{
		"MicroVM: worker started · shell on · web off · connections example-crm",
		"Connection: GET example-crm /customers/1 → 200",
		"Connection: GET example-crm /customers → 200",
	} {
		if !slices.Contains(lines, want) {
			t.Errorf("timeline lacks %q:\n%s", want, strings.Join(lines, "\n"))
		}
	}
	if !slices.ContainsFunc(lines, func(l string) bool {
		return strings.HasPrefix(l, "Connection: POST example-crm /customers → 403 refused")
	}) {
		t.Errorf("timeline lacks the refused POST:\n%s", strings.Join(lines, "\n"))
	}
	if slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, timeline.Network+": ") }) {
		t.Errorf("calls through the broker counted as blocked egress:\n%s", strings.Join(lines, "\n"))
	}
	if run.Cost.Web != 0 {
		t.Errorf("connection calls billed as web: %d micros", run.Cost.Web)
	}
	checkCost(t, run)
}

// A sealed run whose code tries the broker's address and DNS: the
// firewall drops both, and the timeline says so before the VM goes.
func TestBlockedEgressOnTheTimeline(t *testing.T) {
	state := cliState(t)
	attempt := `curl -sS -m 3 http://10.77.0.1:3128/; ` +
		`python3 -c "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'q', ('10.77.0.1', 53))"`
	_, env := serveModel(t,
		fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCall("try", attempt)}},
		fakeprovider.Turn{Text: "blocked"},
	)
	d := startServe(t, state, env...)
	run := d.submit(t, `{"prompt": "Try to get out.", "shell": true, "web": false, "timeout_seconds": 120, "max_cost_micros": 40000}`)
	if run.Status != "succeeded" {
		t.Fatalf("run %s: %+v", run.Status, run.Error)
	}
	lines := run.messages()
	blocked := regexp.MustCompile(`^Network: egress blocked: [0-9]+ packets \(DNS [1-9][0-9]*, IPv6 [0-9]+, other [1-9][0-9]*\)$`)
	at := slices.IndexFunc(lines, blocked.MatchString)
	if at < 0 || lines[at+1] != "MicroVM: microVM destroyed" {
		t.Fatalf("no egress-blocked entry just before the VM's end:\n%s", strings.Join(lines, "\n"))
	}
	checkCost(t, run)
}

// inProcessRun runs spec on a daemon built by the composition root, as
// `ephemeral serve` is, but in-process so that the test can give its
// broker a resolver and a test hook that reach the test's own upstream
// (no configuration reaches them). The daemon's sandboxes live in a
// directory of the test's own, checked empty at the end.
func inProcessRun(t *testing.T, cfg config.Config, opts system.Options, spec runs.Spec, script ...fakeprovider.Turn) (store.Run, []store.Event, *fakeprovider.Server) {
	t.Helper()
	requireVM(t)
	ctx := context.Background()
	fake := fakeprovider.New(script...)
	srv := httptest.NewServer(fake)
	defer srv.Close()
	dir := t.TempDir()
	models := filepath.Join(dir, "models.json")
	if err := os.WriteFile(models, []byte(`{"models": [{"name": "`+spec.Model+`", "provider": "openai",
		"price": {"input_micros_per_mtok": 50000, "output_micros_per_mtok": 400000}}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.StateDir, cfg.OpenAIBaseURL, cfg.ModelsFile, cfg.MaxConcurrentRuns = stateDir(), srv.URL+"/v1", models, 1
	cfg.DefaultModel = spec.Model
	opts.Database, opts.SandboxDir, opts.Logger = filepath.Join(dir, "ephemeral.db"), filepath.Join(dir, "sandboxes"), slog.New(slog.NewTextHandler(t.Output(), nil))
	sys, err := system.New(ctx, cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := sys.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		assertNothingLeft(t, opts.SandboxDir)
	}()
	if err := sys.Start(ctx); err != nil {
		t.Fatal(err)
	}
	org, err := sys.Store.CreateOrg(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sys.Store.Credit(ctx, org.ID, spec.MaxCostMicros); err != nil {
		t.Fatal(err)
	}
	spec.OrgID = org.ID
	canonical, _ := json.Marshal(spec)
	r, _, err := sys.Runs.Submit(ctx, runs.Submission{Spec: spec, Canonical: canonical})
	if err != nil {
		t.Fatal(err)
	}
	followCtx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	var events eventList
	if r, err = sys.Runs.Follow(followCtx, org.ID, r.ID, 0, &events); err != nil {
		t.Fatalf("run %s: %v", r.ID, err)
	}
	return r, events.inTimelineOrder(), fake
}

// eventList collects a followed run's timeline, amendments replacing the
// entries they amend.
type eventList struct{ bySeq map[int64]store.Event }

func (l *eventList) Events(batch []store.Event) error {
	if l.bySeq == nil {
		l.bySeq = map[int64]store.Event{}
	}
	for _, e := range batch {
		l.bySeq[e.Seq] = e
	}
	return nil
}

func (l *eventList) Idle() error { return nil }

func (l *eventList) inTimelineOrder() []store.Event {
	var out []store.Event
	for _, e := range l.bySeq {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b store.Event) int { return cmp.Compare(a.Seq, b.Seq) })
	return out
}

// A run with web, in a real microVM behind a real broker: the model
// fetches a page with web_fetch and the code in the VM with curl through
// the proxy variables; both are on the timeline and billed at the web
// price. The upstream lives in the test's own namespace, which only a
// test hook lets the broker reach, so this runs in-process rather than
// through the daemon (which has no such hook).
func TestWebRunInAMicroVM(t *testing.T) {
	requireVM(t)
	page := "page-" + randomHex(8)
	up := newUpstreamHost(t, page)
	cfg := config.Defaults()
	cfg.WebMicrosPerRequest = 250
	opts := system.Options{
		BrokerResolver:        testResolver{"upstream.test": up.addr},
		UnsafeBrokerTestHooks: &broker.TestHooks{AllowAddress: func(a netip.Addr) bool { return a == up.addr }},
	}
	url := "http://upstream.test:8080/hello"
	spec := runs.Spec{Prompt: "Fetch the page twice.", Model: "test/model", Shell: true, Web: true,
		Timeout: 2 * time.Minute, MaxCostMicros: 40_000}
	r, events, fake := inProcessRun(t, cfg, opts, spec,
		fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{
			toolCall("tool", agent.WebFetchTool, map[string]string{"url": url}),
			shellCall("curl", "curl -sS -m 30 "+url),
		}, Usage: fakeprovider.Usage{InputTokens: 1000, OutputTokens: 50}},
		fakeprovider.Turn{Text: "fetched", Usage: fakeprovider.Usage{InputTokens: 1500, OutputTokens: 10}},
	)
	if r.Status != store.Succeeded {
		t.Fatalf("run %s: %s %s", r.Status, r.ErrorCode, r.ErrorMessage)
	}
	reqs := fake.Requests()
	if len(reqs) != 2 || !strings.Contains(reqs[0].System, "Web: on") {
		t.Fatalf("model got %d requests", len(reqs))
	}
	got := resultsByID(reqs[1])
	if !strings.Contains(got["tool"], "status: 200") || !strings.Contains(got["tool"], page) {
		t.Errorf("web_fetch result: %q", got["tool"])
	}
	if !strings.Contains(got["curl"], "exit code: 0") || !strings.Contains(got["curl"], page) {
		t.Errorf("curl result: %q", got["curl"])
	}

	var lines []string
	for _, ev := range events {
		lines = append(lines, ev.Category+": "+ev.Message)
	}
	want := fmt.Sprintf("Web: GET upstream.test:8080 → 200, %d B", len(page))
	if n := strings.Count(strings.Join(lines, "\n")+"\n", want+"\n"); n != 2 {
		t.Errorf("%q %d times, want twice (web_fetch and curl):\n%s", want, n, strings.Join(lines, "\n"))
	}
	if !slices.Contains(lines, "MicroVM: worker started · shell on · web on") {
		t.Errorf("timeline:\n%s", strings.Join(lines, "\n"))
	}
	if r.Usage.WebRequests != 2 || r.Cost.Web != 2*cfg.WebMicrosPerRequest {
		t.Errorf("%d web requests cost %d micros, want 2 × %d", r.Usage.WebRequests, r.Cost.Web, cfg.WebMicrosPerRequest)
	}
	if r.Reserved != r.Charged+r.Released || r.Cost.Total() != r.Charged || r.Cost.Compute <= 0 {
		t.Errorf("cost %+v, charged %d, reserved %d, released %d", r.Cost, r.Charged, r.Reserved, r.Released)
	}
}
