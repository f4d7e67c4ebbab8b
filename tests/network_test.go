package tests

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/ephemeralhq/ephemeral/hostd/sandbox"
	"github.com/ephemeralhq/ephemeral/netns"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// testHost is a network namespace the test creates and links to a
// sandbox's namespace with a veth pair and routes, so that without the
// sandbox's firewall the guest could reach it at testHostAddr.
type testHost struct {
	ns   vnetns.NsHandle
	tcp  net.Listener   // testHostAddr:8080, answers "test-host"
	udp  net.PacketConn // testHostAddr:53
	srv  *http.Server
	done chan struct{}
}

const (
	testHostAddr = "10.78.0.2"
	testLinkAddr = "10.78.0.1" // the sandbox namespace's end of the link
)

// inNamespace runs fn on a locked OS thread inside ns. The thread is
// thrown away afterwards if switching back fails.
func inNamespace(ns vnetns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := vnetns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := vnetns.Set(ns); err != nil {
			errc <- err
			return
		}
		ferr := fn()
		if err := vnetns.Set(orig); err != nil {
			errc <- fmt.Errorf("restore namespace: %w", err)
			return // the thread stays locked and dies with the goroutine
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

func newTestHost(t *testing.T, sb *sandbox.Sandbox) *testHost {
	t.Helper()
	sbNS, err := vnetns.GetFromPath(sb.Network().Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sbNS.Close() })

	h := &testHost{done: make(chan struct{})}
	// A fresh, unnamed namespace: it disappears with its last handle.
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := vnetns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		h.ns, err = vnetns.New()
		if err != nil {
			errc <- err
			return
		}
		if err := vnetns.Set(orig); err != nil {
			errc <- err
			return
		}
		runtime.UnlockOSThread()
		errc <- nil
	}()
	if err := <-errc; err != nil {
		t.Fatalf("test host namespace: %v", err)
	}
	t.Cleanup(func() { h.ns.Close() })

	var suffix [3]byte
	rand.Read(suffix[:])
	inSandbox, inHost := "tha"+hex.EncodeToString(suffix[:]), "thb"+hex.EncodeToString(suffix[:])
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("test host: %s: %v", what, err)
		}
	}
	must("add veth", netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: inSandbox}, PeerName: inHost}))
	a, err := netlink.LinkByName(inSandbox)
	must("find veth", err)
	b, err := netlink.LinkByName(inHost)
	must("find veth peer", err)
	must("move veth", netlink.LinkSetNsFd(a, int(sbNS)))
	must("move veth peer", netlink.LinkSetNsFd(b, int(h.ns)))

	// The sandbox namespace's side: an address on the link and forwarding
	// on, so only its firewall stands between guest and test host.
	sbh, err := netlink.NewHandleAt(sbNS)
	must("netlink in sandbox namespace", err)
	defer sbh.Close()
	a, err = sbh.LinkByName(inSandbox)
	must("find veth in sandbox namespace", err)
	must("address", sbh.AddrAdd(a, mustAddr(testLinkAddr+"/30")))
	must("link up", sbh.LinkSetUp(a))
	must("forwarding", inNamespace(sbNS, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0)
	}))

	hh, err := netlink.NewHandleAt(h.ns)
	must("netlink in test host namespace", err)
	defer hh.Close()
	b, err = hh.LinkByName(inHost)
	must("find veth in test host namespace", err)
	lo, err := hh.LinkByName("lo")
	must("find lo", err)
	must("lo up", hh.LinkSetUp(lo))
	must("address", hh.AddrAdd(b, mustAddr(testHostAddr+"/30")))
	must("link up", hh.LinkSetUp(b))
	_, guestNet, _ := net.ParseCIDR("10.77.0.0/30")
	must("route back", hh.RouteAdd(&netlink.Route{Dst: guestNet, Gw: net.ParseIP(testLinkAddr)}))

	must("listen", inNamespace(h.ns, func() error {
		var err error
		if h.tcp, err = net.Listen("tcp4", testHostAddr+":8080"); err != nil {
			return err
		}
		h.udp, err = net.ListenPacket("udp4", testHostAddr+":53")
		return err
	}))
	h.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "test-host")
	})}
	go func() { defer close(h.done); h.srv.Serve(h.tcp) }()
	t.Cleanup(func() {
		h.srv.Close()
		<-h.done
		h.udp.Close()
	})
	return h
}

func mustAddr(cidr string) *netlink.Addr {
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		panic(err)
	}
	return a
}

// udpReceived reports whether any datagram reached the test host's port 53.
func (h *testHost) udpReceived() bool {
	h.udp.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	buf := make([]byte, 512)
	_, _, err := h.udp.ReadFrom(buf)
	return err == nil
}

// deleteFirewall removes the sandbox namespace's nftables table, to show
// that the test host is reachable without it.
func deleteFirewall(t *testing.T, sb *sandbox.Sandbox) {
	t.Helper()
	ns, err := os.Open(sb.Network().Path())
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	conn, err := nftables.New(nftables.WithNetNSFd(int(ns.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	conn.DelTable(&nftables.Table{Name: "ephemeral", Family: nftables.TableFamilyINet})
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
}

func counters(t *testing.T, sb *sandbox.Sandbox) netns.Counters {
	t.Helper()
	c, err := sb.Network().Counters()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A sealed sandbox reaches nothing: no name resolves, a test host with a
// working route stays unreachable, IPv6 and DNS go nowhere, and the drop
// counters say so.
func TestSealedSandboxReachesNothing(t *testing.T) {
	m, _ := newManager(t)
	sb := newSandbox(t, m)
	host := newTestHost(t, sb)
	before := counters(t, sb)

	r := run(t, sb, "curl -sS -m 5 https://example.com")
	if r.Code == 0 || !strings.Contains(r.stderr, "Could not resolve host") {
		t.Errorf("curl example.com: exit %d, stderr %q", r.Code, r.stderr)
	}
	r = run(t, sb, "curl -sS -m 3 http://"+testHostAddr+":8080/")
	if r.Code == 0 || strings.Contains(r.stdout, "test-host") {
		t.Errorf("sealed guest reached the test host: exit %d, stdout %q", r.Code, r.stdout)
	}
	r = run(t, sb, "ping -6 -c 1 -W 2 fd00::1")
	if r.Code == 0 {
		t.Errorf("ping -6 succeeded: %q", r.stdout)
	}
	r = run(t, sb, `python3 -c "import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'q', ('`+testHostAddr+`', 53))"`)
	if r.Code != 0 {
		t.Fatalf("sending a UDP packet from the guest failed locally: %q", r.stderr)
	}
	if host.udpReceived() {
		t.Error("a UDP packet to port 53 reached the test host")
	}
	after := counters(t, sb)
	if after.DNS.Packets <= before.DNS.Packets || after.Other.Packets <= before.Other.Packets {
		t.Errorf("drop counters did not rise: before %+v, after %+v", before, after)
	}

	// Control: the same route works once the firewall is gone, so the
	// checks above really tested the firewall; Set puts it back.
	deleteFirewall(t, sb)
	r = run(t, sb, "curl -sS -m 5 http://"+testHostAddr+":8080/")
	if r.stdout != "test-host" {
		t.Fatalf("without the firewall the test host should answer: exit %d, %q %q", r.Code, r.stdout, r.stderr)
	}
	if err := sb.Network().Set(netns.Config{Mode: netns.Sealed}); err != nil {
		t.Fatal(err)
	}
	r = run(t, sb, "curl -sS -m 3 http://"+testHostAddr+":8080/")
	if r.Code == 0 {
		t.Errorf("after Set the test host is reachable again: %q", r.stdout)
	}
}

// In broker mode the stand-in broker answers through the proxy variables;
// nothing else does, not even another port on the same address.
func TestBrokerModeReachesOnlyTheBroker(t *testing.T) {
	m, _ := newManager(t)
	const port = 3128
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := m.Create(ctx, sandbox.Options{Network: netns.Config{Mode: netns.Broker, BrokerPort: port}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Destroy() })
	newTestHost(t, sb)

	serve := func(port uint16, body string) {
		ln, err := sb.Network().Listen(ctx, port)
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s %s", body, r.URL.Host)
		})}
		done := make(chan struct{})
		go func() { defer close(done); srv.Serve(ln) }()
		t.Cleanup(func() { srv.Close(); <-done })
	}
	serve(port, "broker")
	serve(8081, "other-port")

	r := run(t, sb, "curl -sS -m 5 http://example.com/")
	if r.Code != 0 || r.stdout != "broker example.com" {
		t.Errorf("through the proxy variables: exit %d, stdout %q, stderr %q", r.Code, r.stdout, r.stderr)
	}
	for _, url := range []string{
		"http://10.77.0.1:8081/",
		"http://" + testHostAddr + ":8080/",
		fmt.Sprintf("http://%s:%d/", testHostAddr, port),
	} {
		r := run(t, sb, "curl --noproxy '*' -sS -m 3 "+url)
		if r.Code == 0 {
			t.Errorf("broker-mode guest reached %s: %q", url, r.stdout)
		}
	}
}

// Two sandboxes share addresses but no network: what one serves, the other
// cannot reach.
func TestSandboxesCannotReachEachOther(t *testing.T) {
	m, _ := newManager(t)
	a := newSandbox(t, m)
	b := newSandbox(t, m)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	server, err := a.Start(ctx, sandboxServe, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer server.Signal(9)
	// The server is up in a once it answers a's own loopback.
	if r := run(t, a, "for i in $(seq 50); do curl -s -m 1 http://127.0.0.1:8000/ && exit 0; sleep 0.2; done; exit 1"); r.stdout != "sandbox-a\n" {
		t.Fatalf("server in sandbox a did not come up: %q %q", r.stdout, r.stderr)
	}
	for _, addr := range []string{"10.77.0.2", "10.77.0.1", "127.0.0.1"} {
		r := run(t, b, "curl -sS -m 3 http://"+addr+":8000/")
		if strings.Contains(r.stdout, "sandbox-a") {
			t.Errorf("sandbox b reached sandbox a's server at %s", addr)
		}
	}
}

// sandboxServe serves "sandbox-a" on every address of a guest, port 8000.
var sandboxServe = vsockproto.ExecRequest{Shell: `mkdir -p www && echo sandbox-a > www/index.html && exec python3 -m http.server -d www -b 0.0.0.0 8000`}
