package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/agent"
	"github.com/ephemeralhq/ephemeral/hostd/broker"
	"github.com/ephemeralhq/ephemeral/hostd/examplecrm"
	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/model"
	"github.com/ephemeralhq/ephemeral/hostd/model/registry"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/store"
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
	return fake, []string{"EPHEMERAL_OPENAI_BASE_URL=" + srv.URL + "/v1", "EPHEMERAL_OPENAI_API_KEY=" + fake.APIKey}
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

// inProcessRun runs spec through a runs service on a throwaway database
// with the agent booting real sandboxes of m behind broker b, as the
// daemon does; the test's own broker reaches the test's upstreams.
func inProcessRun(t *testing.T, boot agent.BootFunc, rates ledger.Rates, spec runs.Spec, script ...fakeprovider.Turn) (store.Run, []store.Event, *fakeprovider.Server) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "ephemeral.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	org, err := st.CreateOrg(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Credit(ctx, org.ID, spec.MaxCostMicros); err != nil {
		t.Fatal(err)
	}
	fake := fakeprovider.New(script...)
	srv := httptest.NewServer(fake)
	defer srv.Close()
	price := model.Price{InputMicrosPerMTok: 50_000, OutputMicrosPerMTok: 400_000}
	models, err := registry.New(registry.Config{
		OpenAI: registry.ProviderConfig{BaseURL: srv.URL + "/v1"},
		Models: []registry.ModelConfig{{Name: spec.Model, Provider: registry.ProviderOpenAI, Price: &price}},
	})
	if err != nil {
		t.Fatal(err)
	}
	exec, err := agent.New(agent.Config{Boot: boot, Models: models})
	if err != nil {
		t.Fatal(err)
	}
	hub := timeline.NewHub()
	svc := runs.New(st, hub, runs.Config{Executor: exec, Rates: rates, MaxConcurrent: 1})
	serveCtx, stop := context.WithCancel(ctx)
	served := make(chan struct{})
	go func() { defer close(served); svc.Serve(serveCtx, time.Hour) }()
	defer func() { stop(); <-served }()

	spec.OrgID = org.ID
	canonical, _ := json.Marshal(spec)
	r, _, err := svc.Submit(ctx, runs.Submission{Spec: spec, Canonical: canonical})
	if err != nil {
		t.Fatal(err)
	}
	giveUp := time.After(4 * time.Minute)
	for !r.Status.Terminal() {
		changed := hub.Changed(r.ID)
		if r, err = st.GetRun(ctx, org.ID, r.ID); err != nil {
			t.Fatal(err)
		}
		if r.Status.Terminal() {
			break
		}
		select {
		case <-changed:
		case <-giveUp:
			t.Fatalf("run %s still %s", r.ID, r.Status)
		}
	}
	events, err := st.Events(ctx, r.ID, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return r, events, fake
}

// A run with web, in a real microVM behind a real broker: the model
// fetches a page with web_fetch and the code in the VM with curl through
// the proxy variables; both are on the timeline and billed at the web
// price. The upstream lives in the test's own namespace, which only a
// test hook lets the broker reach, so this runs in-process rather than
// through the daemon (which has no such hook).
func TestWebRunInAMicroVM(t *testing.T) {
	m, _ := newManager(t)
	page := "page-" + randomHex(8)
	up := newUpstreamHost(t, page)
	b := broker.New(broker.Config{
		Resolver:        testResolver{"upstream.test": up.addr},
		UnsafeTestHooks: &broker.TestHooks{AllowAddress: func(a netip.Addr) bool { return a == up.addr }},
	})
	rates := ledger.Rates{ComputeMicrosPerVMSecond: ledger.DefaultRates.ComputeMicrosPerVMSecond, WebMicrosPerRequest: 250}
	url := "http://upstream.test:8080/hello"
	spec := runs.Spec{Prompt: "Fetch the page twice.", Model: "test/model", Shell: true, Web: true,
		Timeout: 2 * time.Minute, MaxCostMicros: 40_000}
	r, events, fake := inProcessRun(t, agent.SandboxBoot(m, b), rates, spec,
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
	if r.Usage.WebRequests != 2 || r.Cost.Web != 2*rates.WebMicrosPerRequest {
		t.Errorf("%d web requests cost %d micros, want 2 × %d", r.Usage.WebRequests, r.Cost.Web, rates.WebMicrosPerRequest)
	}
	if r.Reserved != r.Charged+r.Released || r.Cost.Total() != r.Charged || r.Cost.Compute <= 0 {
		t.Errorf("cost %+v, charged %d, reserved %d, released %d", r.Cost, r.Charged, r.Reserved, r.Released)
	}
}
