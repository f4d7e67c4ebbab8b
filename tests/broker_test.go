package tests

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/ephemeralhq/ephemeral/hostd/broker"
	"github.com/ephemeralhq/ephemeral/hostd/connections"
	"github.com/ephemeralhq/ephemeral/hostd/sandbox"
	"github.com/ephemeralhq/ephemeral/hostd/seal"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/netns"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

const brokerPort = 3128

// eventLog is the run's side of a broker session in these tests.
type eventLog struct {
	mu      sync.Mutex
	events  []broker.Event
	charges int
}

func (l *eventLog) ChargeWeb() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.charges++
	return nil
}

func (l *eventLog) Record(e broker.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

func (l *eventLog) snapshot() ([]broker.Event, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]broker.Event(nil), l.events...), l.charges
}

// brokeredSandbox boots a sandbox the way a run with grants g gets one:
// broker mode, the proxy variables, EPHEMERAL_CONNECTIONS_URL, and a
// session of b serving the sandbox's listener.
func brokeredSandbox(t *testing.T, m *sandbox.Manager, b *broker.Broker, g broker.Grants) (*sandbox.Sandbox, *eventLog) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := m.Create(ctx, sandbox.Options{
		Network: netns.Config{Mode: netns.Broker, BrokerPort: brokerPort},
		Env:     g.GuestEnv(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Destroy() })
	log := &eventLog{}
	session, err := b.Open(ctx, g, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { session.Close() })
	ln, err := sb.Network().Listen(ctx, brokerPort)
	if err != nil {
		t.Fatal(err)
	}
	if err := session.Serve(ln); err != nil {
		t.Fatal(err)
	}
	return sb, log
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// connectionUpstream is a plain-http server on the host's loopback that
// records the Authorization headers it receives.
type connectionUpstream struct {
	addr string
	mu   sync.Mutex
	auth []string
}

func newConnectionUpstream(t *testing.T) *connectionUpstream {
	t.Helper()
	u := &connectionUpstream{}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = ln.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.auth = append(u.auth, r.Header.Values("Authorization")...)
		u.mu.Unlock()
		fmt.Fprintf(w, `{"path":%q}`, r.URL.Path)
	})}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return u
}

func (u *connectionUpstream) authorizations() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.auth...)
}

// connectionBroker registers a connection "crm" with the canary secret in a
// real store (sealed) and returns a broker that loads it from there.
func connectionBroker(t *testing.T, up *connectionUpstream, secret string) (*broker.Broker, broker.Grants) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "ephemeral.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	org, err := st.CreateOrg(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	key, err := seal.NewKey([]byte(randomHex(16)))
	if err != nil {
		t.Fatal(err)
	}
	reg := connections.NewRegistry(st, key)
	_, port, _ := net.SplitHostPort(up.addr)
	base, err := connections.ParseBaseURL("http://crm.test:"+port+"/api", true)
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Add(ctx, org.ID, connections.Connection{Name: "crm", BaseURL: base, Methods: []string{"GET", "POST"},
		Headers: http.Header{"Authorization": {secret}}}); err != nil {
		t.Fatal(err)
	}
	b := broker.New(broker.Config{
		Resolver:    testResolver{"crm.test": netip.MustParseAddr("127.0.0.1")},
		Connections: reg,
		UnsafeTestHooks: &broker.TestHooks{
			AllowAddress:         func(a netip.Addr) bool { return a.IsLoopback() },
			PlainHTTPConnections: true,
		},
	})
	return b, broker.Grants{OrgID: org.ID, Connections: []broker.ConnectionGrant{{Name: "crm", Methods: []string{"GET"}}}}
}

// testResolver maps test names to addresses; it never asks DNS.
type testResolver map[string]netip.Addr

func (r testResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return []netip.Addr{a}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// searchGuest reads every file, every process's command line and
// environment and its own environment in the guest, as root, for each
// pattern, and returns where each was found. The patterns travel on stdin,
// so they appear in no command line or environment of the search itself.
func searchGuest(t *testing.T, sb *sandbox.Sandbox, patterns ...string) map[string]string {
	t.Helper()
	const script = `
import os, sys
pats = [l.strip().encode() for l in sys.stdin if l.strip()]
found = {p: [] for p in pats}
scanned = 0
def scan(path):
    global scanned
    scanned += 1
    try:
        with open(path, 'rb') as f:
            tail = b''
            while True:
                chunk = f.read(1 << 20)
                if not chunk:
                    break
                buf = tail + chunk
                for p in pats:
                    if p in buf and path not in found[p]:
                        found[p].append(path)
                tail = buf[-256:]
    except OSError:
        pass
for root, dirs, files in os.walk('/'):
    if root == '/':
        dirs[:] = [d for d in dirs if d not in ('proc', 'sys', 'dev')]
    for n in files:
        p = os.path.join(root, n)
        if not os.path.islink(p) and os.path.isfile(p):
            scan(p)
scan('/proc/cmdline')
for pid in os.listdir('/proc'):
    if pid.isdigit() and pid != str(os.getpid()):
        scan('/proc/%s/cmdline' % pid)
        scan('/proc/%s/environ' % pid)
for k, v in os.environ.items():
    for p in pats:
        if p in (k + '=' + v).encode():
            found[p].append('$' + k)
for p in pats:
    print(p.decode(), ' '.join(found[p]) or '-')
print('scanned', scanned)
`
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	st, err := sb.Exec(ctx, vsockproto.ExecRequest{Argv: []string{"python3", "-c", script}, User: "root", Timeout: 7 * time.Minute},
		strings.NewReader(strings.Join(patterns, "\n")+"\n"), &stdout, &stderr)
	if err != nil || st.Code != 0 {
		t.Fatalf("guest search: %v, exit %d, %s", err, st.Code, stderr.String())
	}
	where := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		p, locations, _ := strings.Cut(line, " ")
		where[p] = locations
	}
	return where
}

func curlStatus(t *testing.T, sb *sandbox.Sandbox, args string) string {
	t.Helper()
	r := run(t, sb, "curl -sS -m 20 -o /dev/null -w '%{http_code}' "+args)
	return r.stdout
}

// The secret of a connection reaches the upstream on every call, yet the
// guest — whose code made the calls — holds it nowhere.
func TestConnectionSecretNeverEntersTheGuest(t *testing.T) {
	m, _ := newManager(t)
	up := newConnectionUpstream(t)
	secret := "Bearer canary-" + randomHex(16)
	b, grants := connectionBroker(t, up, secret)
	sb, log := brokeredSandbox(t, m, b, grants)

	r := run(t, sb, `curl -sS -m 20 -H 'Authorization: Bearer guest-forged' "$EPHEMERAL_CONNECTIONS_URL/crm/v1/customers"`)
	if r.Code != 0 || r.stdout != `{"path":"/api/v1/customers"}` {
		t.Fatalf("GET through the connection: exit %d, %q %q", r.Code, r.stdout, r.stderr)
	}
	if got := up.authorizations(); len(got) != 1 || got[0] != secret {
		t.Fatalf("upstream received Authorization %q, want only the stored secret", got)
	}

	// Not granted: POST (the organisation allows it, the run did not ask),
	// and paths that climb out of the base URL (403) or that some server
	// could read as climbing out (400).
	if code := curlStatus(t, sb, `-X POST -d '{}' "$EPHEMERAL_CONNECTIONS_URL/crm/v1/customers"`); code != "403" {
		t.Errorf("POST: %s, want 403", code)
	}
	for path, want := range map[string]string{
		"/crm/../admin": "403", "/crm/%2e%2e/admin": "403",
		"/crm/v1/customers/..;/x": "400", "/crm/..%3b/admin": "400", "/crm/%C0%AE%C0%AE/admin": "400",
		"/crm/%EF%BC%8E%EF%BC%8E/admin": "400", "/crm/.../admin": "400", "/crm/v1%2f..%2f..%2fadmin": "400",
	} {
		if code := curlStatus(t, sb, `--path-as-is "$EPHEMERAL_CONNECTIONS_URL`+path+`"`); code != want {
			t.Errorf("%s: %s, want %s", path, code, want)
		}
	}
	if code := curlStatus(t, sb, `"$EPHEMERAL_CONNECTIONS_URL/billing/x"`); code != "403" {
		t.Errorf("ungranted connection: %s, want 403", code)
	}
	if n := len(up.authorizations()); n != 1 {
		t.Errorf("refused calls reached the upstream: %d calls", n)
	}
	events, _ := log.snapshot()
	var refusedPost bool
	for _, e := range events {
		refusedPost = refusedPost || (e.Method == "POST" && e.Status == 403 && e.Connection == "crm")
	}
	if !refusedPost {
		t.Errorf("no event for the refused POST: %+v", events)
	}

	// The search must be able to find things: a decoy in a file and in a
	// live process's environment is found, the secret is not.
	decoy := "decoy-" + randomHex(16)
	if r := run(t, sb, "printf %s "+decoy+" > /tmp/decoy.txt && (DECOY="+decoy+" setsid sleep 600 >/dev/null 2>&1 &)"); r.Code != 0 {
		t.Fatalf("plant decoy: %q", r.stderr)
	}
	found := searchGuest(t, sb, secret[len("Bearer "):], decoy)
	if !strings.Contains(found[decoy], "/tmp/decoy.txt") || !strings.Contains(found[decoy], "/environ") {
		t.Fatalf("the search missed the decoy (found at %q): it would miss the secret too", found[decoy])
	}
	t.Logf("the search read %s files", found["scanned"])
	if n, _ := strconv.Atoi(found["scanned"]); n < 1000 {
		t.Fatalf("the search read only %d files", n)
	}
	if where := found[secret[len("Bearer "):]]; where != "-" {
		t.Errorf("the connection's secret is in the guest: %s", where)
	}
}

// A run without web or connections gets no broker: the sandbox is sealed,
// has no proxy variables, and the broker will not open a session for it.
func TestWebOffGetsNoBroker(t *testing.T) {
	m, _ := newManager(t)
	grants := broker.Grants{OrgID: "org_x"}
	if grants.NeedsBroker() {
		t.Fatal("a run without grants asks for a broker")
	}
	if _, err := broker.New(broker.Config{}).Open(context.Background(), grants, &eventLog{}); !errors.Is(err, broker.ErrNothingGranted) {
		t.Fatalf("broker opened a session for a run without grants: %v", err)
	}
	sb := newSandbox(t, m) // what a run without grants boots
	r := run(t, sb, "env | grep -iE '^(https?|all|no)_proxy=|^EPHEMERAL_CONNECTIONS_URL=' || true")
	if r.stdout != "" {
		t.Errorf("sealed guest has proxy variables: %q", r.stdout)
	}
	r = run(t, sb, fmt.Sprintf("curl -sS -m 5 -x http://%s:%d http://example.com/", netns.GatewayAddr, brokerPort))
	if r.Code == 0 {
		t.Errorf("sealed guest reached a proxy: %q", r.stdout)
	}
}

// upstreamHost is a web server in a network namespace the test creates,
// linked to the host's namespace by a veth pair: the broker reaches it at
// addr, the way it reaches a site on the internet.
type upstreamHost struct {
	addr netip.Addr
}

func newUpstreamHost(t *testing.T, body string) *upstreamHost {
	t.Helper()
	return newUpstreamHostOn(t, body, 8080)
}

// newUpstreamHostOn is newUpstreamHost serving on port.
func newUpstreamHostOn(t *testing.T, body string, port int) *upstreamHost {
	t.Helper()
	ns, err := newUnnamedNamespace()
	if err != nil {
		t.Fatalf("upstream namespace: %v", err)
	}
	t.Cleanup(func() { ns.Close() })
	suffix := randomHex(3)
	// A /30 of 10.79.0.0/16 picked at random, so parallel runs differ.
	var third [1]byte
	rand.Read(third[:])
	hostSide := netip.AddrFrom4([4]byte{10, 79, third[0], 1})
	upSide := netip.AddrFrom4([4]byte{10, 79, third[0], 2})
	hostName, upName := "ubh"+suffix, "ubu"+suffix
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("upstream host: %s: %v", what, err)
		}
	}
	must("add veth", netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostName}, PeerName: upName}))
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(hostName); err == nil {
			netlink.LinkDel(l)
		}
	})
	peer, err := netlink.LinkByName(upName)
	must("find veth peer", err)
	must("move veth peer", netlink.LinkSetNsFd(peer, int(ns)))
	h, err := netlink.LinkByName(hostName)
	must("find veth", err)
	must("address", netlink.AddrAdd(h, mustAddr(hostSide.String()+"/30")))
	must("link up", netlink.LinkSetUp(h))

	nh, err := netlink.NewHandleAt(ns)
	must("netlink in upstream namespace", err)
	defer nh.Close()
	peer, err = nh.LinkByName(upName)
	must("find veth in upstream namespace", err)
	must("address", nh.AddrAdd(peer, mustAddr(upSide.String()+"/30")))
	must("link up", nh.LinkSetUp(peer))

	var ln net.Listener
	must("listen", inNamespace(ns, func() error {
		var err error
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(upSide, uint16(port)).String())
		return err
	}))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, body)
	})}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return &upstreamHost{addr: upSide}
}

// newUnnamedNamespace creates a network namespace that disappears with
// its last handle, on a thread that returns to the original one.
func newUnnamedNamespace() (vnetns.NsHandle, error) {
	type result struct {
		ns  vnetns.NsHandle
		err error
	}
	c := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := vnetns.Get()
		if err != nil {
			c <- result{err: err}
			return
		}
		defer orig.Close()
		ns, err := vnetns.New()
		if err != nil {
			c <- result{err: err}
			return
		}
		if err := vnetns.Set(orig); err != nil {
			c <- result{err: err} // the thread stays locked and dies with the goroutine
			return
		}
		runtime.UnlockOSThread()
		c <- result{ns: ns}
	}()
	r := <-c
	return r.ns, r.err
}

// A run with web fetches a page through the proxy variables from an
// upstream the broker reaches by name; names that resolve inside, and
// tunnels to inside, are refused.
func TestWebFetchThroughTheBroker(t *testing.T) {
	m, _ := newManager(t)
	page := "page-" + randomHex(8)
	up := newUpstreamHost(t, page)
	b := broker.New(broker.Config{
		Resolver: testResolver{
			"upstream.test": up.addr,
			"loopback.test": netip.MustParseAddr("127.0.0.1"),
			"metadata.test": netip.MustParseAddr("169.254.169.254"),
		},
		// The test upstream's address is private; only it is let through.
		UnsafeTestHooks: &broker.TestHooks{AllowAddress: func(a netip.Addr) bool { return a == up.addr }},
	})
	sb, log := brokeredSandbox(t, m, b, broker.Grants{OrgID: "org_x", Web: true})

	r := run(t, sb, "curl -sS -m 20 http://upstream.test:8080/hello")
	if r.Code != 0 || r.stdout != page {
		t.Fatalf("web fetch: exit %d, %q %q", r.Code, r.stdout, r.stderr)
	}
	events, charges := log.snapshot()
	if charges != 1 || len(events) != 1 || events[0].Message() != fmt.Sprintf("GET upstream.test:8080 → 200, %d B", len(page)) {
		t.Errorf("%d charges, events %+v", charges, events)
	}

	for _, url := range []string{"http://loopback.test/", "http://metadata.test/latest/meta-data/", "http://169.254.169.254/"} {
		if code := curlStatus(t, sb, url); code != "403" {
			t.Errorf("%s: %s, want 403", url, code)
		}
	}
	for _, url := range []string{"https://loopback.test/", "https://metadata.test/", "https://" + up.addr.String() + ":8080/"} {
		r := run(t, sb, "curl -sS -m 20 "+url)
		if r.Code == 0 || !strings.Contains(r.stderr, "403") {
			t.Errorf("CONNECT for %s: exit %d, %q", url, r.Code, r.stderr)
		}
	}
	if _, charges := log.snapshot(); charges != 1 {
		t.Errorf("refused requests were charged: %d charges", charges)
	}

	// Requests that are no proxy requests: origin-form, and a head that
	// net/http rejects before the broker's handler. Both are on the
	// timeline.
	before, _ := log.snapshot()
	if code := curlStatus(t, sb, `--noproxy '*' "$HTTP_PROXY/"`); code != "400" {
		t.Errorf("origin-form request to the broker: %s, want 400", code)
	}
	r = run(t, sb, `python3 -c "import os, socket, urllib.parse
p = urllib.parse.urlsplit(os.environ['HTTP_PROXY'])
s = socket.create_connection((p.hostname, p.port))
s.sendall(b'POST http://upstream.test:8080/ HTTP/1.1\r\nHost: upstream.test\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab')
print(s.recv(64).split(b'\r\n')[0].decode())"`)
	if r.stdout != "HTTP/1.1 400 Bad Request\n" {
		t.Errorf("doubled Content-Length: %q %q", r.stdout, r.stderr)
	}
	events, _ = log.snapshot()
	if got := events[len(before):]; len(got) != 2 || got[0].Status != 400 || !strings.Contains(got[0].Refused, "absolute form") ||
		got[1].Message() != "POST → 400 refused: malformed request: Bad Request" {
		t.Errorf("events of the malformed requests: %+v", got)
	}
}
