package broker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func newTLSConfig(roots *x509.CertPool) *tls.Config { return &tls.Config{RootCAs: roots} }

// upstream is a loopback test server that remembers what reached it.
type upstream struct {
	*httptest.Server
	mu       sync.Mutex
	requests []*http.Request
	conns    int
}

func newUpstream(t testing.TB, tlsOn bool, h http.HandlerFunc) *upstream {
	t.Helper()
	u := &upstream{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.requests = append(u.requests, r.Clone(context.Background()))
		u.mu.Unlock()
		h(w, r)
	}))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateNew {
			u.mu.Lock()
			u.conns++
			u.mu.Unlock()
		}
	}
	if tlsOn {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	u.Server = srv
	return u
}

func (u *upstream) seen() ([]*http.Request, int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]*http.Request(nil), u.requests...), u.conns
}

func (u *upstream) port() string {
	_, port, _ := net.SplitHostPort(u.Listener.Addr().String())
	return port
}

func hello(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello from upstream") }

func webConfig(res *testResolver) Config {
	return Config{Resolver: res, UnsafeTestHooks: &TestHooks{AllowAddress: allowLoopback}}
}

func TestWebRequestIsForwardedRecordedAndCharged(t *testing.T) {
	up := newUpstream(t, false, hello)
	res := newTestResolver("site.test", "127.0.0.1")
	p := startProxy(t, webConfig(res), Grants{Web: true})

	resp, err := p.client.Get("http://site.test:" + up.port() + "/page?q=1")
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(resp)
	resp.Body.Close()
	if resp.StatusCode != 200 || body != "hello from upstream" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	reqs, _ := up.seen()
	if len(reqs) != 1 || reqs[0].URL.RequestURI() != "/page?q=1" || reqs[0].Host != "site.test:"+up.port() {
		t.Fatalf("upstream saw %+v", reqs)
	}
	events, charges := p.obs.snapshot()
	if charges != 1 || len(events) != 1 {
		t.Fatalf("%d charges, events %+v", charges, events)
	}
	e := events[0]
	want := "GET site.test:" + up.port() + " → 200, 19 B"
	if e.Message() != want || e.Bytes != int64(len(body)) {
		t.Errorf("event %q (%d bytes), want %q", e.Message(), e.Bytes, want)
	}
	if res.count("site.test") != 1 {
		t.Errorf("resolved %d times, want once", res.count("site.test"))
	}
}

// The policy is checked on the resolved address: an allowed-looking name
// that points inside is refused before anything is dialled, and never
// charged.
func TestNamesResolvingInsideAreRefused(t *testing.T) {
	up := newUpstream(t, false, hello)
	res := newTestResolver(
		"loopback.test", "127.0.0.1",
		"metadata.test", "169.254.169.254",
		"mixed.test", "93.184.215.14", "mixed.test", "10.0.0.7",
		"mapped.test", "::ffff:127.0.0.1",
	)
	p := startProxy(t, Config{Resolver: res}, Grants{Web: true})
	for _, host := range []string{"loopback.test", "metadata.test", "mixed.test", "mapped.test", "127.0.0.1", "[::ffff:7f00:1]", "169.254.169.254"} {
		resp, err := p.client.Get("http://" + host + ":" + up.port() + "/")
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(resp)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "not allowed") {
			t.Errorf("%s: %d %q, want 403", host, resp.StatusCode, body)
		}
	}
	if reqs, conns := up.seen(); len(reqs) != 0 || conns != 0 {
		t.Errorf("upstream reached %d times", conns)
	}
	events, charges := p.obs.snapshot()
	if charges != 0 || len(events) != 7 || events[0].Refused == "" {
		t.Errorf("%d charges, events %+v", charges, events)
	}
}

// The broker dials the address it checked: a second lookup (which a
// rebinding DNS server would answer differently) never happens.
func TestResolvesOnceAndDialsTheCheckedAddress(t *testing.T) {
	up := newUpstream(t, false, hello)
	res := newTestResolver("rebind.test", "127.0.0.1")
	p := startProxy(t, webConfig(res), Grants{Web: true})
	for i := 0; i < 3; i++ {
		resp, err := p.client.Get("http://rebind.test:" + up.port() + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if n := res.count("rebind.test"); n != 3 {
		t.Errorf("3 requests resolved the name %d times", n)
	}
	// Keep-alive from the guest's side does not carry over upstream.
	if reqs, conns := up.seen(); len(reqs) != 3 || conns != 3 {
		t.Errorf("%d requests over %d upstream connections, want 3 over 3", len(reqs), conns)
	}
}

func TestResolverFailureFailsClosed(t *testing.T) {
	p := startProxy(t, webConfig(newTestResolver()), Grants{Web: true})
	resp, err := p.client.Get("http://unknown.test/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("status %d, want 503", resp.StatusCode)
	}
}

// hopByHopUpstream answers with hop-by-hop headers, one of them named
// in a Connection header that also says "close" (Go's client deletes
// such a Connection header before the broker sees the response).
func hopByHopUpstream(t *testing.T, tlsOn bool) *upstream {
	return newUpstream(t, tlsOn, func(w http.ResponseWriter, r *http.Request) {
		// Written raw: Go's server would replace this Connection header.
		c, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		buf.WriteString("HTTP/1.1 200 OK\r\nConnection: close, X-Upstream-Hop\r\nConnection: X-Other-Hop\r\n" +
			"X-Upstream-Hop: 1\r\nX-Other-Hop: 1\r\nKeep-Alive: timeout=5\r\nUpgrade: h2c\r\n" +
			"X-Upstream-End: kept\r\nContent-Length: 2\r\n\r\nok")
		buf.Flush()
	})
}

func checkUpstreamHopsStripped(t *testing.T, h http.Header) {
	t.Helper()
	for _, name := range []string{"X-Upstream-Hop", "X-Other-Hop", "Keep-Alive", "Upgrade"} {
		if h.Get(name) != "" {
			t.Errorf("the guest received %s: %q", name, h.Get(name))
		}
	}
	if h.Get("X-Upstream-End") != "kept" {
		t.Errorf("an end-to-end response header was dropped: %v", h)
	}
}

func TestHopByHopHeadersAreStripped(t *testing.T) {
	up := hopByHopUpstream(t, false)
	p := startProxy(t, webConfig(newTestResolver("site.test", "127.0.0.1")), Grants{Web: true})
	resp, _ := p.raw(t, "GET http://site.test:"+up.port()+"/ HTTP/1.1\r\nHost: site.test\r\n"+
		"Connection: close, X-Guest-Hop\r\nConnection: X-Guest-Other\r\nX-Guest-Hop: 1\r\nX-Guest-Other: 1\r\n"+
		"Keep-Alive: 300\r\nProxy-Authorization: Basic Zm9vOmJhcg==\r\nTE: trailers\r\nUpgrade: websocket\r\n"+
		"X-End-To-End: kept\r\n\r\n")
	reqs, _ := up.seen()
	if len(reqs) != 1 {
		t.Fatalf("upstream saw %d requests", len(reqs))
	}
	h := reqs[0].Header
	for _, name := range []string{"X-Guest-Hop", "X-Guest-Other", "Keep-Alive", "Proxy-Authorization", "Te", "Upgrade"} {
		if h.Get(name) != "" {
			t.Errorf("upstream received %s: %q", name, h.Get(name))
		}
	}
	if h.Get("X-End-To-End") != "kept" {
		t.Error("an end-to-end header was dropped")
	}
	checkUpstreamHopsStripped(t, resp.Header)
}

// The web_fetch tool over TLS, where the broker reads the response head
// from inside the TLS connection.
func TestHopByHopHeadersAreStrippedOverTLS(t *testing.T) {
	up := hopByHopUpstream(t, true)
	cfg := webConfig(newTestResolver("example.com", "127.0.0.1"))
	cfg.UnsafeTestHooks.RootCAs = newCertPool(up)
	p := startProxy(t, cfg, Grants{Web: true})
	got, err := p.session.Fetch(context.Background(), Request{URL: "https://example.com:" + up.port() + "/"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != 200 || string(got.Body) != "ok" {
		t.Fatalf("fetch: %d %q", got.Status, got.Body)
	}
	checkUpstreamHopsStripped(t, got.Header)
}

func TestTraceAndOriginFormAreRefused(t *testing.T) {
	up := newUpstream(t, false, hello)
	p := startProxy(t, webConfig(newTestResolver("site.test", "127.0.0.1")), Grants{Web: true})
	resp, _ := p.raw(t, "TRACE http://site.test:"+up.port()+"/ HTTP/1.1\r\nHost: site.test\r\n\r\n")
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("TRACE: %d", resp.StatusCode)
	}
	resp, _ = p.raw(t, "GET / HTTP/1.1\r\nHost: site.test:"+up.port()+"\r\n\r\n")
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("origin-form GET: %d", resp.StatusCode)
	}
	if reqs, _ := up.seen(); len(reqs) != 0 {
		t.Errorf("upstream reached: %d", len(reqs))
	}
}

func TestCaps(t *testing.T) {
	const limit = 1000
	up := newUpstream(t, false, func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		if r.URL.Query().Get("chunked") == "" {
			w.Header().Set("Content-Length", strconv.Itoa(n))
		}
		w.Write([]byte(strings.Repeat("x", n)))
	})
	cfg := webConfig(newTestResolver("site.test", "127.0.0.1"))
	cfg.Limits = Limits{MaxHeaderBytes: 4096, MaxRequestBytes: limit, MaxResponseBytes: limit}
	p := startProxy(t, cfg, Grants{Web: true})
	base := "http://site.test:" + up.port() + "/"

	resp, err := p.client.Post(base, "text/plain", strings.NewReader(strings.Repeat("y", limit+1)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized body: %d", resp.StatusCode)
	}
	if reqs, _ := up.seen(); len(reqs) != 0 {
		t.Error("an oversized request body reached upstream")
	}

	resp, err = p.client.Get(base + "?n=" + strconv.Itoa(limit))
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(resp); resp.StatusCode != 200 || len(body) != limit {
		t.Errorf("response at the cap: %d, %d bytes", resp.StatusCode, len(body))
	}
	resp.Body.Close()

	resp, err = p.client.Get(base + "?n=" + strconv.Itoa(limit+1))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("declared oversized response: %d", resp.StatusCode)
	}

	// Without a length the cut comes mid-body: the guest must see an
	// error, not a short body that looks complete.
	resp, err = p.client.Get(base + "?chunked=1&n=" + strconv.Itoa(3*limit))
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err == nil {
		t.Error("an oversized chunked response read as complete")
	}

	resp, _ = p.raw(t, "GET "+base+" HTTP/1.1\r\nHost: site.test\r\nX-Big: "+strings.Repeat("h", 16<<10)+"\r\n\r\n")
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("oversized head: %d", resp.StatusCode)
	}
}

func TestConnectTunnelsToAllowedPortsOnly(t *testing.T) {
	up := newUpstream(t, true, hello)
	port, _ := strconv.Atoi(up.port())
	roots := x509.NewCertPool()
	roots.AddCert(up.Certificate())
	res := newTestResolver("example.com", "127.0.0.1", "internal.test", "10.1.2.3", "metadata.test", "169.254.169.254")
	cfg := Config{Resolver: res, TunnelPorts: []uint16{uint16(port)},
		UnsafeTestHooks: &TestHooks{AllowAddress: func(a netip.Addr) bool { return a == netip.MustParseAddr("127.0.0.1") }, RootCAs: roots}}
	p := startProxy(t, cfg, Grants{Web: true})

	// httptest's certificate is valid for example.com.
	resp, err := p.client.Get("https://example.com:" + up.port() + "/")
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(resp)
	resp.Body.Close()
	if body != "hello from upstream" {
		t.Fatalf("through the tunnel: %d %q", resp.StatusCode, body)
	}
	ev := p.obs.wait(1)[0] // recorded when the tunnel has closed
	if ev.Method != "CONNECT" || ev.Status != 200 || ev.Bytes == 0 || ev.Host != "example.com" {
		t.Errorf("tunnel event %+v", ev)
	}

	for _, target := range []string{"internal.test:" + up.port(), "metadata.test:" + up.port(), "10.0.0.1:" + up.port(),
		"[::1]:" + up.port(), "example.com:22", "connections.internal:443"} {
		resp, _ := p.raw(t, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n")
		if resp.StatusCode == 200 {
			t.Errorf("CONNECT %s allowed", target)
		}
	}
	if _, charges := p.obs.snapshot(); charges != 1 {
		t.Errorf("%d web charges, want 1 (refused tunnels are free)", charges)
	}
}

func TestWebOffRefusesWebButServesConnections(t *testing.T) {
	up := newUpstream(t, false, hello)
	conns := testConnections{"org_test/crm": crmConnection(t, up, "GET")}
	cfg := Config{Resolver: newTestResolver("site.test", "127.0.0.1", "crm.test", "127.0.0.1"), Connections: conns,
		UnsafeTestHooks: &TestHooks{AllowAddress: allowLoopback, PlainHTTPConnections: true}}
	p := startProxy(t, cfg, Grants{Connections: connGrant("crm", "GET")})
	resp, err := p.client.Get("http://site.test:" + up.port() + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("web with web off: %d", resp.StatusCode)
	}
	resp, _ = p.raw(t, "CONNECT site.test:443 HTTP/1.1\r\nHost: site.test:443\r\n\r\n")
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("CONNECT with web off: %d", resp.StatusCode)
	}
	if _, err := p.session.Fetch(context.Background(), Request{Method: "GET", URL: "http://site.test:" + up.port() + "/"}); err == nil {
		t.Error("web_fetch with web off succeeded")
	}
	resp, err = p.client.Get("http://connections.internal/crm/v1/customers")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("connection with web off: %d", resp.StatusCode)
	}
	if _, charges := p.obs.snapshot(); charges != 0 {
		t.Errorf("%d web charges", charges)
	}
}

func TestNothingGrantedGetsNoSession(t *testing.T) {
	_, err := New(Config{}).Open(context.Background(), Grants{OrgID: "org"}, &testObserver{})
	if !errors.Is(err, ErrNothingGranted) {
		t.Fatalf("Open without grants: %v", err)
	}
	if (Grants{}).NeedsBroker() || (Grants{}).GuestEnv() != nil {
		t.Error("a run without grants would get a broker or connection variables")
	}
}

func TestFetchToolSharesThePolicyAndBudget(t *testing.T) {
	up := newUpstream(t, false, hello)
	res := newTestResolver("site.test", "127.0.0.1", "metadata.test", "169.254.169.254")
	p := startProxy(t, webConfig(res), Grants{Web: true})
	p.obs.budget = 1
	ctx := context.Background()
	got, err := p.session.Fetch(ctx, Request{Method: "GET", URL: "http://site.test:" + up.port() + "/x"})
	if err != nil || got.Status != 200 || string(got.Body) != "hello from upstream" {
		t.Fatalf("fetch: %+v, %v", got, err)
	}
	_, err = p.session.Fetch(ctx, Request{Method: "GET", URL: "http://metadata.test/latest/meta-data/"})
	if status, ok := RefusedStatus(err); !ok || status != http.StatusForbidden {
		t.Errorf("metadata fetch: %v", err)
	}
	_, err = p.session.Fetch(ctx, Request{Method: "GET", URL: "http://site.test:" + up.port() + "/again"})
	if status, ok := RefusedStatus(err); !ok || status != http.StatusPaymentRequired {
		t.Errorf("fetch past the budget: %v", err)
	}
	if reqs, _ := up.seen(); len(reqs) != 1 {
		t.Errorf("upstream saw %d requests, want 1", len(reqs))
	}
	if events, _ := p.obs.snapshot(); len(events) != 3 {
		t.Errorf("%d events, want 3", len(events))
	}
}

func TestCloseEndsOpenTunnels(t *testing.T) {
	// An upstream that accepts and never answers keeps the tunnel open.
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	_, portStr, _ := net.SplitHostPort(ln.Addr().String())
	port, _ := strconv.Atoi(portStr)
	cfg := webConfig(newTestResolver("slow.test", "127.0.0.1"))
	cfg.TunnelPorts = []uint16{uint16(port)}
	obs := &testObserver{budget: -1}
	s, err := New(cfg).Open(context.Background(), Grants{Web: true}, obs)
	if err != nil {
		t.Fatal(err)
	}
	pl, _ := net.Listen("tcp4", "127.0.0.1:0")
	s.Serve(pl)
	c, err := net.Dial("tcp4", pl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "CONNECT slow.test:"+portStr+" HTTP/1.1\r\nHost: slow.test\r\n\r\n")
	buf := make([]byte, 64)
	if n, _ := c.Read(buf); !strings.Contains(string(buf[:n]), " 200 ") {
		t.Fatalf("tunnel not established: %q", buf[:n])
	}
	up := <-accepted
	defer up.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Close returned, so the tunnel is gone: the guest's side reads EOF.
	if _, err := c.Read(buf); err == nil {
		t.Error("guest side of the tunnel still open after Close")
	}
	if ev, _ := obs.snapshot(); len(ev) != 1 || ev[0].Method != "CONNECT" {
		t.Errorf("events %+v", ev)
	}
}

func newCertPool(up *upstream) *x509.CertPool {
	roots := x509.NewCertPool()
	roots.AddCert(up.Certificate())
	return roots
}
