package broker

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/connections"
)

// testResolver answers from a table and counts lookups; it never asks DNS.
type testResolver struct {
	mu      sync.Mutex
	names   map[string][]netip.Addr
	lookups map[string]int
}

func newTestResolver(pairs ...string) *testResolver {
	r := &testResolver{names: map[string][]netip.Addr{}, lookups: map[string]int{}}
	for i := 0; i < len(pairs); i += 2 {
		r.names[pairs[i]] = append(r.names[pairs[i]], netip.MustParseAddr(pairs[i+1]))
	}
	return r
}

func (r *testResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lookups[host]++
	if a, ok := r.names[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func (r *testResolver) count(host string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lookups[host]
}

// testObserver keeps events and charges; budget < 0 is unlimited.
type testObserver struct {
	mu      sync.Mutex
	changed *sync.Cond // on mu, when events grow
	events  []Event
	charges int
	budget  int
}

func (o *testObserver) ChargeWeb() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.budget >= 0 && o.charges >= o.budget {
		return errors.New("budget exceeded")
	}
	o.charges++
	return nil
}

func (o *testObserver) Record(e Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.events = append(o.events, e)
	o.cond().Broadcast()
}

func (o *testObserver) cond() *sync.Cond {
	if o.changed == nil {
		o.changed = sync.NewCond(&o.mu)
	}
	return o.changed
}

// wait blocks until n events are recorded; the test's own deadline bounds it.
func (o *testObserver) wait(n int) []Event {
	o.mu.Lock()
	defer o.mu.Unlock()
	for len(o.events) < n {
		o.cond().Wait()
	}
	return append([]Event(nil), o.events...)
}

func (o *testObserver) snapshot() ([]Event, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]Event(nil), o.events...), o.charges
}

func (o *testObserver) last(t *testing.T) Event {
	t.Helper()
	ev, _ := o.snapshot()
	if len(ev) == 0 {
		t.Fatal("no event recorded")
	}
	return ev[len(ev)-1]
}

// testConnections is an in-memory registry keyed by org and name.
type testConnections map[string]connections.Connection

func (c testConnections) Lookup(ctx context.Context, orgID, name string) (connections.Connection, error) {
	conn, ok := c[orgID+"/"+name]
	if !ok {
		return connections.Connection{}, errors.New("no such connection")
	}
	return conn, nil
}

// allowLoopback is the test hook for upstreams on 127.0.0.1.
func allowLoopback(a netip.Addr) bool { return a.IsLoopback() }

type testProxy struct {
	session *Session
	obs     *testObserver
	addr    string // the stand-in for the sandbox's listener
	client  *http.Client
}

// startProxy serves a session on a loopback listener, standing in for the
// listener inside a sandbox's namespace.
func startProxy(t testing.TB, cfg Config, g Grants) *testProxy {
	t.Helper()
	if g.OrgID == "" {
		g.OrgID = "org_test"
	}
	obs := &testObserver{budget: -1}
	s, err := New(cfg).Open(context.Background(), g, obs)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(ln); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close session: %v", err)
		}
	})
	proxyURL := &url.URL{Scheme: "http", Host: ln.Addr().String()}
	tr := &http.Transport{Proxy: http.ProxyURL(proxyURL), DisableKeepAlives: true}
	if cfg.UnsafeTestHooks != nil && cfg.UnsafeTestHooks.RootCAs != nil {
		tr.TLSClientConfig = newTLSConfig(cfg.UnsafeTestHooks.RootCAs)
	}
	return &testProxy{session: s, obs: obs, addr: ln.Addr().String(), client: &http.Client{Transport: tr}}
}

// raw sends one request as written and reads the response, for requests
// an HTTP client would refuse or normalise.
func (p *testProxy) raw(t *testing.T, request string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp4", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(request)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the answer to %q: %v", strings.SplitN(request, "\r\n", 2)[0], err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	fmt.Fprint(&b, readAll(resp))
	return resp, b.String()
}

func readAll(resp *http.Response) string {
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}

// RefusedStatus reports the status of an error that means the broker
// refused the request.
func RefusedStatus(err error) (int, bool) {
	var r *refusal
	if errors.As(err, &r) {
		return r.status, true
	}
	return 0, false
}
