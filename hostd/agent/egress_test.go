package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/broker"
	"github.com/ephemeralhq/ephemeral/hostd/connections"
	"github.com/ephemeralhq/ephemeral/hostd/examplecrm"
	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/netns"
	"github.com/ephemeralhq/ephemeral/tests/fakeprovider"
)

// siteHost is the name the test resolver maps to the loopback web site.
const siteHost = "site.test"

// webSite serves /page (a short page) and /big (bytes bytes of 'x') on
// loopback, and returns the host:port the broker reaches it at by name.
func webSite(t *testing.T, page string, bytes int) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		switch r.URL.Path {
		case "/page":
			fmt.Fprint(w, page)
		case "/big":
			fmt.Fprint(w, strings.Repeat("x", bytes))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	return siteHost + ":" + port
}

// testBroker is the daemon's broker with the example CRM as every
// organisation's connection and a resolver that knows only siteHost.
func testBroker() *broker.Broker {
	return broker.New(broker.Config{
		Resolver:    siteResolver{},
		Connections: exampleConnections{},
		InProcess:   map[string]http.Handler{examplecrm.Host: examplecrm.Handler()},
		// The test site is on loopback, which the policy refuses.
		UnsafeTestHooks: &broker.TestHooks{AllowAddress: func(a netip.Addr) bool { return a.IsLoopback() }},
	})
}

type siteResolver struct{}

func (siteResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if host == siteHost {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

type exampleConnections struct{}

func (exampleConnections) Lookup(_ context.Context, _, name string) (connections.Connection, error) {
	if name == examplecrm.Name {
		return examplecrm.Connection(), nil
	}
	return connections.Connection{}, store.ErrNotFound
}

func webCall(id, url string) fakeprovider.ToolCall {
	args, _ := json.Marshal(map[string]string{"url": url})
	return fakeprovider.ToolCall{ID: id, Name: WebFetchTool, Arguments: string(args)}
}

func connectionCall(id, method, path string) fakeprovider.ToolCall {
	args, _ := json.Marshal(map[string]string{"connection": examplecrm.Name, "method": method, "path": path})
	return fakeprovider.ToolCall{ID: id, Name: ConnectionTool, Arguments: string(args)}
}

// resultsOf maps a request's tool results by call id.
func resultsOf(req fakeprovider.Request) map[string]string {
	out := map[string]string{}
	for _, r := range req.ToolResults {
		out[r.CallID] = r.Content
	}
	return out
}

func eventsIn(events []store.Event, category string) []string {
	var out []string
	for _, ev := range events {
		if ev.Category == category {
			out = append(out, ev.Message)
		}
	}
	return out
}

// A run with web fetches through its broker session: the model gets the
// page (a big one clipped), refusals come back as tool errors, and every
// request the broker admitted is on the timeline and the bill.
func TestWebFetchTool(t *testing.T) {
	page := "<h1>hello from the test site</h1>"
	const outputBytes = 1000
	site := webSite(t, page, 3*outputBytes)
	e := newEnvConfig(t, Config{OutputBytes: outputBytes}, pageVM(),
		fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{
			webCall("page", "http://"+site+"/page"),
			webCall("big", "http://"+site+"/big"),
			webCall("metadata", "http://169.254.169.254/latest/meta-data/"),
			connectionCall("crm", "GET", "/customers"),
		}},
		fakeprovider.Turn{Text: "fetched"})
	e.broker = testBroker()
	spec := pageSpec("fetch the page")
	spec.Web = true
	r, events := e.run(spec)
	if r.Status != store.Succeeded {
		t.Fatalf("status %s: %s", r.Status, r.ErrorMessage)
	}

	reqs := e.provider.Requests()
	if !slices.Equal(reqs[0].ToolNames, []string{ShellTool, WebFetchTool}) {
		t.Errorf("offered tools %v", reqs[0].ToolNames)
	}
	if !strings.Contains(reqs[0].System, "Web: on") || !strings.Contains(reqs[0].System, "proxy variables") {
		t.Errorf("system prompt does not say web is on:\n%s", reqs[0].System)
	}
	got := resultsOf(reqs[1])
	if !strings.Contains(got["page"], "status: 200") || !strings.Contains(got["page"], page) {
		t.Errorf("page result: %q", got["page"])
	}
	_, bigBody, _ := strings.Cut(got["big"], "cut):\n")
	if !strings.Contains(got["big"], fmt.Sprintf("first %d of %d bytes", outputBytes, 3*outputBytes)) ||
		strings.TrimSpace(bigBody) != strings.Repeat("x", outputBytes) {
		t.Errorf("big result not clipped to %d bytes: %.200q", outputBytes, got["big"])
	}
	if !strings.Contains(got["metadata"], "broker refused (403") {
		t.Errorf("metadata result: %q", got["metadata"])
	}
	if !strings.Contains(got["crm"], "not granted any connection") {
		t.Errorf("connection call on a web-only run: %q", got["crm"])
	}

	wantWeb := []string{
		fmt.Sprintf("GET %s → 200, %d B", site, len(page)),
		fmt.Sprintf("GET %s → 200, %d KB", site, 3*outputBytes/1000),
	}
	web := eventsIn(events, "Web")
	if len(web) != 3 || !slices.Contains(web, wantWeb[0]) || !slices.Contains(web, wantWeb[1]) ||
		!slices.ContainsFunc(web, func(m string) bool { return strings.HasPrefix(m, "GET 169.254.169.254 → 403 refused") }) {
		t.Errorf("web events %q, want %q and the refused one", web, wantWeb)
	}
	if !slices.Contains(messages(events), "MicroVM: worker started · shell on · web on") {
		t.Errorf("timeline: %q", messages(events))
	}
	if r.Usage.WebRequests != 2 || r.Cost.Web != 2*ledger.DefaultRates.WebMicrosPerRequest {
		t.Errorf("web usage %d, cost %d: want the two admitted requests", r.Usage.WebRequests, r.Cost.Web)
	}
	checkMoney(t, r)
}

// A run with a connection calls it through the broker, which adds the
// credentials; methods not granted are refused, and each call is on the
// timeline.
func TestConnectionRequestTool(t *testing.T) {
	e := newEnv(t, pageVM(),
		fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{
			connectionCall("list", "GET", "/customers?country=DE"),
			connectionCall("post", "POST", "/customers"),
			connectionCall("escape", "GET", "/customers/..;/admin"),
			connectionCall("folded", "GET", "/customers//./1"),
			{ID: "other", Name: ConnectionTool, Arguments: `{"connection":"billing","path":"/invoices"}`},
			webCall("web", "http://example.com/"),
		}},
		fakeprovider.Turn{Text: "listed"})
	e.broker = testBroker()
	spec := pageSpec("list the German customers")
	spec.Connections = []runs.Connection{{Name: examplecrm.Name, Methods: []string{"GET"}}}
	r, events := e.run(spec)
	if r.Status != store.Succeeded {
		t.Fatalf("status %s: %s", r.Status, r.ErrorMessage)
	}

	reqs := e.provider.Requests()
	if !slices.Equal(reqs[0].ToolNames, []string{ShellTool, ConnectionTool}) {
		t.Errorf("offered tools %v", reqs[0].ToolNames)
	}
	if !bytes.Contains(reqs[0].Body, []byte(`"enum":["example-crm"]`)) || !bytes.Contains(reqs[0].Body, []byte(`"enum":["GET"]`)) {
		t.Errorf("connection_request schema does not list the grant: %s", reqs[0].Body)
	}
	for _, want := range []string{"Web: off", "example-crm (GET)", "$EPHEMERAL_CONNECTIONS_URL", broker.ConnectionsURL} {
		if !strings.Contains(reqs[0].System, want) {
			t.Errorf("system prompt lacks %q:\n%s", want, reqs[0].System)
		}
	}
	got := resultsOf(reqs[1])
	if !strings.Contains(got["list"], "status: 200") || !strings.Contains(got["list"], "Ada Analytics GmbH") ||
		strings.Contains(got["list"], "Bergfeld") {
		t.Errorf("list result: %q", got["list"])
	}
	if !strings.Contains(got["post"], "broker refused (403") || !strings.Contains(got["other"], "broker refused (403") {
		t.Errorf("ungranted method or connection answered %q, %q", got["post"], got["other"])
	}
	if !strings.Contains(got["web"], "not granted web access") {
		t.Errorf("web call on a connections-only run: %q", got["web"])
	}
	// The tool shares the broker's path canonicaliser with the guest.
	if !strings.Contains(got["escape"], `broker refused (400 Bad Request): path segment "..;"`) {
		t.Errorf("..; through the tool answered %q", got["escape"])
	}
	if !strings.Contains(got["folded"], "status: 200") || !strings.Contains(got["folded"], "Ada Analytics GmbH") {
		t.Errorf("folded path answered %q", got["folded"])
	}
	for id, content := range got {
		if strings.Contains(content, examplecrm.DemoToken) {
			t.Errorf("result %s carries the connection's credential", id)
		}
	}

	conn := eventsIn(events, "Connection")
	refused := func(prefix string) bool {
		return slices.ContainsFunc(conn, func(m string) bool { return strings.HasPrefix(m, prefix+" refused") })
	}
	if len(conn) != 5 || !slices.Contains(conn, "GET example-crm /customers → 200") ||
		!slices.Contains(conn, "GET example-crm /customers/1 → 200") ||
		!refused("GET example-crm /customers/..;/admin → 400") || !refused("POST example-crm /customers → 403") {
		t.Errorf("connection events %q", conn)
	}
	if !slices.Contains(messages(events), "MicroVM: worker started · shell on · web off · connections example-crm") {
		t.Errorf("timeline: %q", messages(events))
	}
	if r.Usage.WebRequests != 0 || r.Cost.Web != 0 {
		t.Errorf("connection calls billed as web: %d requests, %d micros", r.Usage.WebRequests, r.Cost.Web)
	}
	checkMoney(t, r)
}

// Without grants the broker's tools are neither offered nor run, and no
// session is opened.
func TestEgressToolsNotGranted(t *testing.T) {
	e := newEnv(t, pageVM(),
		fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{webCall("web", "http://example.com/"), connectionCall("crm", "GET", "/customers")}},
		fakeprovider.Turn{Text: "nothing"})
	e.broker = testBroker()
	r, events := e.run(pageSpec("try the network"))
	if r.Status != store.Succeeded {
		t.Fatalf("status %s: %s", r.Status, r.ErrorMessage)
	}
	reqs := e.provider.Requests()
	if !slices.Equal(reqs[0].ToolNames, []string{ShellTool}) || !strings.Contains(reqs[0].System, "The VM has no network") {
		t.Errorf("offered %v; system prompt:\n%s", reqs[0].ToolNames, reqs[0].System)
	}
	got := resultsOf(reqs[1])
	if !strings.Contains(got["web"], "not granted web access") || !strings.Contains(got["crm"], "not granted any connection") {
		t.Errorf("results %q", got)
	}
	if n := len(eventsIn(events, "Web")) + len(eventsIn(events, "Connection")); n != 0 || r.Usage.WebRequests != 0 {
		t.Errorf("%d broker events, %d web requests billed", n, r.Usage.WebRequests)
	}
}

// A boot that leaves a granted run without a broker fails the run rather
// than offering tools that cannot work.
func TestGrantedRunWithoutBrokerFails(t *testing.T) {
	vm := pageVM()
	e := newEnv(t, vm, fakeprovider.Turn{Text: "never asked"})
	spec := pageSpec("fetch")
	spec.Web = true
	r, _ := e.run(spec)
	if r.Status != store.Failed || !strings.Contains(r.ErrorMessage, "without a broker") || vm.destroyed != 1 {
		t.Errorf("status %s (%s), destroyed %d", r.Status, r.ErrorMessage, vm.destroyed)
	}
	if len(e.provider.Requests()) != 0 {
		t.Error("the model was called")
	}
	checkMoney(t, r)
}

type fakeFirewall netns.Counters

func (f fakeFirewall) Counters() (netns.Counters, error) { return netns.Counters(f), nil }

// What the firewall dropped is on the timeline before the VM goes; a run
// that dropped nothing gets no entry.
func TestBlockedEgressOnTheTimeline(t *testing.T) {
	for _, tc := range []struct {
		name     string
		counters netns.Counters
		want     string // "" for no entry
	}{
		{"dropped", netns.Counters{DNS: netns.Counter{Packets: 1, Bytes: 60}, Other: netns.Counter{Packets: 2, Bytes: 120}},
			"Network: egress blocked: 3 packets (DNS 1, IPv6 0, other 2)"},
		{"nothing dropped", netns.Counters{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, pageVM(), fakeprovider.Turn{Text: "ok"})
			e.firewall = fakeFirewall(tc.counters)
			r, events := e.run(pageSpec("idle"))
			if r.Status != store.Succeeded {
				t.Fatalf("status %s: %s", r.Status, r.ErrorMessage)
			}
			got := messages(events)
			network := eventsIn(events, "Network")
			if tc.want == "" {
				if len(network) != 0 {
					t.Errorf("entries for nothing dropped: %q", network)
				}
				return
			}
			at := slices.Index(got, tc.want)
			if at < 0 || len(network) != 1 || got[at+1] != "MicroVM: microVM destroyed" {
				t.Errorf("timeline %q, want %q just before the VM is destroyed", got, tc.want)
			}
		})
	}
}

var webFetchArgCases = []struct {
	raw string
	ok  bool
}{
	{`{"url":"https://example.com/"}`, true},
	{`{"url":"http://example.com/x","method":"POST","headers":{"Content-Type":"application/json"},"body":"{}"}`, true},
	{`{"url":""}`, false},
	{`{"url":"http://a/\nb"}`, false},
	{`{"url":"http://a/","method":"GET /x HTTP/1.1"}`, false},
	{`{"url":"http://a/","headers":{"Bad Name":"x"}}`, false},
	{`{"url":"http://a/","headers":{"X":"a\r\nHost: evil"}}`, false},
	{`{"url":"http://a/","proxy":"x"}`, false},
	{`{"url":"http://a/"} {}`, false},
	{`[]`, false},
}

func TestParseWebFetchArgs(t *testing.T) {
	for _, tc := range webFetchArgCases {
		req, err := parseWebFetchArgs(tc.raw)
		if (err == nil) != tc.ok {
			t.Errorf("parseWebFetchArgs(%s) = %+v, %v", tc.raw, req, err)
		}
	}
	req, err := parseWebFetchArgs(webFetchArgCases[1].raw)
	if err != nil || req.Method != "POST" || req.URL != "http://example.com/x" || req.Header.Get("Content-Type") != "application/json" || string(req.Body) != "{}" {
		t.Errorf("parsed %+v, %v", req, err)
	}
}

func TestParseConnectionArgs(t *testing.T) {
	for raw, ok := range map[string]bool{
		`{"connection":"crm","path":"/v1/customers?limit=5"}`: true,
		`{"connection":"crm","path":"/x","method":"HEAD"}`:    true,
		`{"connection":"","path":"/x"}`:                       false,
		`{"connection":"crm"}`:                                false,
		`{"connection":"crm","path":"/x\u0000"}`:              false,
		`{"connection":"crm","path":"/x","url":"http://a/"}`:  false,
	} {
		name, req, err := parseConnectionArgs(raw)
		if (err == nil) != ok {
			t.Errorf("parseConnectionArgs(%s) = %q, %+v, %v", raw, name, req, err)
		}
	}
}

// Whatever a model sends, a web_fetch the parser accepts carries no
// control characters in its URL and nothing in its method or headers that
// could split a request.
func FuzzParseWebFetchArgs(f *testing.F) {
	for _, tc := range webFetchArgCases {
		f.Add(tc.raw)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		req, err := parseWebFetchArgs(raw)
		if err != nil {
			return
		}
		if checkText("url", req.URL) != nil || (req.Method != "" && !isToken(req.Method)) {
			t.Errorf("accepted %q: %+v", raw, req)
		}
		for name, values := range req.Header {
			for _, v := range values {
				if !isToken(name) || strings.ContainsAny(v, "\r\n\x00") {
					t.Errorf("accepted header %q: %q", name, v)
				}
			}
		}
	})
}

func TestEgressResultForTheModel(t *testing.T) {
	body := []byte("0123456789")
	call := &egressCall{maxBody: 4, resp: &broker.Response{Status: 200, Header: http.Header{"Content-Type": {"text/plain"}}, Body: body}}
	content, isErr := call.forModel()
	if isErr || content != "status: 200 OK\ncontent-type: text/plain\nbody (the first 4 of 10 bytes; the rest is cut):\n0123\n" {
		t.Errorf("clipped result %q, error %v", content, isErr)
	}
	call = &egressCall{maxBody: 4, resp: &broker.Response{Status: 204, Header: http.Header{}}}
	if content, _ := call.forModel(); content != "status: 204 No Content\nbody: (empty)\n" {
		t.Errorf("empty result %q", content)
	}
}

// The system prompt says what is granted and how to use it, and nothing
// that is not: no proxy variables without a shell to use them.
func TestSystemPromptStatesTheGrants(t *testing.T) {
	cfg := &Config{CommandTimeout: DefaultCommandTimeout, OutputBytes: DefaultOutputBytes}
	crm := []runs.Connection{{Name: "crm", Methods: []string{"GET", "HEAD"}}}
	for _, tc := range []struct {
		name      string
		spec      runs.Spec
		want, not []string
	}{
		{"web without shell", runs.Spec{Web: true},
			[]string{"Shell: off: no command", "Web: on", WebFetchTool, "Connections: none", "Use the tools"},
			[]string{"proxy variables", "no tools in this run"}},
		{"connections with shell", runs.Spec{Shell: true, Connections: crm},
			[]string{"Web: off. The only way out", "crm (GET, HEAD)", ConnectionTool, "$EPHEMERAL_CONNECTIONS_URL/<name>/<path>", "send none"},
			[]string{"Web: on"}},
		{"nothing granted", runs.Spec{},
			[]string{"no tools in this run", "The VM has no network"},
			[]string{WebFetchTool, ConnectionTool, "Use the"}},
	} {
		prompt := systemPrompt(tc.spec, "/tmp/scratch", 1000, time.Minute, cfg, false)
		for _, w := range tc.want {
			if !strings.Contains(prompt, w) {
				t.Errorf("%s: prompt lacks %q:\n%s", tc.name, w, prompt)
			}
		}
		for _, n := range tc.not {
			if strings.Contains(prompt, n) {
				t.Errorf("%s: prompt says %q:\n%s", tc.name, n, prompt)
			}
		}
	}
}
