package broker

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/connections"
	"github.com/ephemeralhq/ephemeral/hostd/examplecrm"
)

const canary = "Bearer canary-7f3a9e"

func crmConnection(t *testing.T, up *upstream, methods ...string) connections.Connection {
	t.Helper()
	scheme := "http"
	if up.TLS != nil {
		scheme = "https"
	}
	base, err := url.Parse(scheme + "://crm.test:" + up.port() + "/api")
	if err != nil {
		t.Fatal(err)
	}
	return connections.Connection{Name: "crm", BaseURL: base, Methods: methods,
		Headers: http.Header{"Authorization": {canary}, "X-Tenant": {"acme"}}}
}

func connGrant(name string, methods ...string) []ConnectionGrant {
	return []ConnectionGrant{{Name: name, Methods: methods}}
}

func connectionProxy(t *testing.T, up *upstream, orgAllows []string, grant ...string) *testProxy {
	t.Helper()
	cfg := Config{
		Resolver:        newTestResolver("crm.test", "127.0.0.1"),
		Connections:     testConnections{"org_test/crm": crmConnection(t, up, orgAllows...)},
		UnsafeTestHooks: &TestHooks{AllowAddress: allowLoopback, PlainHTTPConnections: true},
	}
	return startProxy(t, cfg, Grants{Connections: connGrant("crm", grant...)})
}

func TestConnectionInjectsStoredCredentialsOnly(t *testing.T) {
	up := newUpstream(t, false, func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "session", Value: "upstream-secret"})
		io.WriteString(w, `{"customers":[]}`)
	})
	p := connectionProxy(t, up, []string{"GET", "POST"}, "GET")
	resp, body := p.raw(t, "GET http://connections.internal/crm/v1/customers?limit=5 HTTP/1.1\r\n"+
		"Host: connections.internal\r\nAuthorization: Bearer guest-forged\r\nCookie: a=b\r\n"+
		"X-Api-Key: guest\r\nX-Tenant: evil\r\nAccept: application/json\r\n\r\n")
	if resp.StatusCode != 200 || body != `{"customers":[]}` {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	if resp.Header.Get("Set-Cookie") != "" {
		t.Error("the upstream's cookie reached the guest")
	}
	reqs, _ := up.seen()
	if len(reqs) != 1 {
		t.Fatalf("upstream saw %d requests", len(reqs))
	}
	r := reqs[0]
	if r.URL.Path != "/api/v1/customers" || r.URL.RawQuery != "limit=5" || r.Host != "crm.test:"+up.port() {
		t.Errorf("upstream got %s %s host %s", r.Method, r.URL, r.Host)
	}
	if got := r.Header.Values("Authorization"); len(got) != 1 || got[0] != canary {
		t.Errorf("upstream Authorization %q, want only the stored one", got)
	}
	if got := r.Header.Values("X-Tenant"); len(got) != 1 || got[0] != "acme" {
		t.Errorf("upstream X-Tenant %q", got)
	}
	if r.Header.Get("Cookie") != "" || r.Header.Get("X-Api-Key") != "" || r.Header.Get("Accept") != "application/json" {
		t.Errorf("upstream headers %v", r.Header)
	}
	if ev := p.obs.last(t); ev.Message() != "GET crm /v1/customers → 200" {
		t.Errorf("event %q", ev.Message())
	}
}

func TestConnectionMethodNotGrantedIsRefused(t *testing.T) {
	up := newUpstream(t, false, hello)
	// The organisation allows POST and the run asked for it, but since
	// then the organisation narrowed the connection to GET.
	p := connectionProxy(t, up, []string{"GET"}, "GET", "POST")
	for _, method := range []string{"POST", "DELETE"} {
		req, _ := http.NewRequest(method, "http://connections.internal/crm/v1/customers", strings.NewReader("{}"))
		resp, err := p.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", method, resp.StatusCode)
		}
		ev := p.obs.last(t)
		if ev.Status != 403 || ev.Connection != "crm" || !strings.Contains(ev.Message(), method+" crm /v1/customers → 403 refused: method "+method) {
			t.Errorf("event %q", ev.Message())
		}
	}
	if reqs, _ := up.seen(); len(reqs) != 0 {
		t.Errorf("upstream reached %d times", len(reqs))
	}
}

// The attacks on the base path, sent as a guest's curl --path-as-is
// would: each is refused with its own event, none reaches the upstream.
func TestConnectionPathMustStayUnderBase(t *testing.T) {
	up := newUpstream(t, false, hello)
	p := connectionProxy(t, up, []string{"GET"}, "GET")
	for path, want := range map[string]int{
		"/crm/../admin":                       403,
		"/crm/v1/../../admin":                 403,
		"/crm/%2e%2e/admin":                   403,
		"/crm/customers/..;/x":                400,
		"/crm/..;/admin":                      400,
		"/crm/..%3b/admin":                    400,
		"/crm/..%20/admin":                    400,
		"/crm/%C0%AE%C0%AE/admin":             400,
		"/crm/%EF%BC%8E%EF%BC%8E/admin":       400,
		"/crm/\xef\xbc\x8e\xef\xbc\x8e/admin": 400,
		"/crm/.../admin":                      400,
		"/crm/v1%2f..%2f..%2fadmin":           400,
		"/crm/%252e%252e/admin":               400,
		"/crm/v1\\..\\admin":                  400,
	} {
		resp, body := p.raw(t, "GET http://connections.internal"+path+" HTTP/1.1\r\nHost: connections.internal\r\n\r\n")
		if resp.StatusCode != want {
			t.Errorf("%s: %d %q, want %d", path, resp.StatusCode, body, want)
		}
		// The broker records a refusal before it answers.
		if ev := p.obs.last(t); ev.Connection != "crm" || ev.Status != want || ev.Refused == "" {
			t.Errorf("%s: event %q", path, ev.Message())
		}
	}
	if reqs, _ := up.seen(); len(reqs) != 0 {
		t.Errorf("upstream reached: %v", reqs[0].URL)
	}
}

// The upstream receives exactly the canonical path the broker checked,
// from the proxy and from the connection_request tool alike.
func TestConnectionForwardsTheCanonicalPath(t *testing.T) {
	up := newUpstream(t, false, hello)
	p := connectionProxy(t, up, []string{"GET"}, "GET")
	for sent, want := range map[string]string{
		"/crm/v1/customers":           "/api/v1/customers",
		"/crm":                        "/api",
		"/crm/":                       "/api/",
		"/crm/v1//customers//":        "/api/v1/customers/",
		"/crm/v1/../v2/%7eme?q=a%2Fb": "/api/v2/~me?q=a%2Fb",
		"/crm/caf%c3%a9/a%2cb;v=1":    "/api/caf%C3%A9/a%2Cb;v=1",
		"/crm/\xc3\xa9t\xc3\xa9/{id}": "/api/%C3%A9t%C3%A9/%7Bid%7D",
	} {
		resp, body := p.raw(t, "GET http://connections.internal"+sent+" HTTP/1.1\r\nHost: connections.internal\r\n\r\n")
		if resp.StatusCode != 200 {
			t.Errorf("%s: %d %q", sent, resp.StatusCode, body)
			continue
		}
		reqs, _ := up.seen()
		if got := reqs[len(reqs)-1].RequestURI; got != want {
			t.Errorf("%s: upstream got %s, want %s", sent, got, want)
		}
	}
	_, err := p.session.ConnectionRequest(context.Background(), "crm", Request{URL: "v1//a/./b%2d"})
	if err != nil {
		t.Fatal(err)
	}
	reqs, _ := up.seen()
	if got := reqs[len(reqs)-1].RequestURI; got != "/api/v1/a/b-" {
		t.Errorf("tool: upstream got %s", got)
	}
	if ev := p.obs.last(t); ev.Message() != "GET crm /v1/a/b- → 200" {
		t.Errorf("tool event %q", ev.Message())
	}
	_, err = p.session.ConnectionRequest(context.Background(), "crm", Request{URL: "/customers/..;/admin"})
	if status, ok := RefusedStatus(err); !ok || status != http.StatusBadRequest {
		t.Errorf("..; through the tool: %v", err)
	}
	if ev := p.obs.last(t); ev.Status != 400 || !strings.Contains(ev.Message(), `GET crm /customers/..;/admin → 400 refused: path segment "..;"`) {
		t.Errorf("tool refusal event %q", ev.Message())
	}
}

func TestConnectionNotGrantedOrUnloadable(t *testing.T) {
	up := newUpstream(t, false, hello)
	cfg := Config{
		Resolver:        newTestResolver("crm.test", "127.0.0.1"),
		Connections:     testConnections{"org_test/crm": crmConnection(t, up, "GET"), "other_org/billing": crmConnection(t, up, "GET")},
		UnsafeTestHooks: &TestHooks{AllowAddress: allowLoopback, PlainHTTPConnections: true},
	}
	// "gone" was granted but removed from the organisation since.
	p := startProxy(t, cfg, Grants{Connections: []ConnectionGrant{{Name: "crm", Methods: []string{"GET"}}, {Name: "gone", Methods: []string{"GET"}}}})
	for path, want := range map[string]int{"/billing/x": 403, "/gone/x": 503, "/crm/x": 200} {
		resp, err := p.client.Get("http://connections.internal" + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s: %d, want %d", path, resp.StatusCode, want)
		}
	}
}

func TestConnectionsForwardOverHTTPSOnly(t *testing.T) {
	up := newUpstream(t, false, hello)
	cfg := Config{
		Resolver:        newTestResolver("crm.test", "127.0.0.1"),
		Connections:     testConnections{"org_test/crm": crmConnection(t, up, "GET")},
		UnsafeTestHooks: &TestHooks{AllowAddress: allowLoopback}, // no PlainHTTPConnections
	}
	p := startProxy(t, cfg, Grants{Connections: connGrant("crm", "GET")})
	resp, err := p.client.Get("http://connections.internal/crm/x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("plain http connection: %d, want 503", resp.StatusCode)
	}
	if reqs, _ := up.seen(); len(reqs) != 0 {
		t.Error("upstream reached over plain http")
	}
}

func TestConnectionOverTLSAndThroughTheTool(t *testing.T) {
	up := newUpstream(t, true, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Method+" "+r.URL.RequestURI()+" "+r.Header.Get("Authorization"))
	})
	roots := newCertPool(up)
	conn := crmConnection(t, up, "GET", "POST")
	conn.BaseURL.Host = "example.com:" + up.port() // httptest's certificate name
	cfg := Config{
		Resolver:        newTestResolver("example.com", "127.0.0.1"),
		Connections:     testConnections{"org_test/crm": conn},
		UnsafeTestHooks: &TestHooks{AllowAddress: allowLoopback, RootCAs: roots},
	}
	p := startProxy(t, cfg, Grants{Connections: connGrant("crm", "POST")})
	got, err := p.session.ConnectionRequest(context.Background(), "crm", Request{Method: "POST", URL: "/v1/notes?x=1",
		Header: http.Header{"Authorization": {"Bearer model-made-this-up"}}, Body: []byte("note")})
	if err != nil {
		t.Fatal(err)
	}
	if want := "POST /api/v1/notes?x=1 " + canary; got.Status != 200 || string(got.Body) != want {
		t.Errorf("tool call: %d %q, want %q", got.Status, got.Body, want)
	}
	_, err = p.session.ConnectionRequest(context.Background(), "crm", Request{Method: "GET", URL: "/v1/notes"})
	if status, ok := RefusedStatus(err); !ok || status != http.StatusForbidden {
		t.Errorf("ungranted GET through the tool: %v", err)
	}
	_, err = p.session.ConnectionRequest(context.Background(), "crm", Request{Method: "POST", URL: "https://evil.test/x"})
	if status, ok := RefusedStatus(err); !ok || status != http.StatusBadRequest {
		t.Errorf("absolute URL through the tool: %v", err)
	}
}

func TestExampleConnectionIsServedInProcess(t *testing.T) {
	example := examplecrm.Connection()
	cfg := Config{
		Resolver:    newTestResolver(), // resolves nothing: the example must not need the network
		Connections: testConnections{"org_test/" + examplecrm.Name: example},
		InProcess:   map[string]http.Handler{examplecrm.Host: examplecrm.Handler()},
	}
	p := startProxy(t, cfg, Grants{Connections: connGrant(examplecrm.Name, "GET")})
	resp, err := p.client.Get("http://connections.internal/" + examplecrm.Name + "/customers/1")
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(resp)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(body, `"id":1`) {
		t.Errorf("example customer 1: %d %q", resp.StatusCode, body)
	}
}
