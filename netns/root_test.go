package netns

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	mdnetlink "github.com/mdlayher/netlink"
	"github.com/vishvananda/netlink"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/ephemeralhq/ephemeral/internal/sandboxid"
	"github.com/ephemeralhq/ephemeral/internal/testenv"
)

// The root tests build real namespaces. They target only addresses inside
// namespaces they create themselves.

// dropWait is how long a probe waits before calling a packet dropped. A
// dropped TCP SYN gets no answer at all, so the dial times out instead of
// being refused; the tests check for the timeout, not for the duration.
const dropWait = 400 * time.Millisecond

func requireRoot(t testing.TB) {
	t.Helper()
	testenv.RequireRoot(t)
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		testenv.Skip(t, "needs /dev/net/tun: load the tun module (`modprobe tun`)")
	}
}

func createNetwork(t testing.TB, cfg Config) *Network {
	t.Helper()
	n, err := Create(context.Background(), sandboxid.New(), cfg)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return n
}

// newAnonymousNamespace makes a network namespace that lives only as long
// as the returned file, with loopback up.
func newAnonymousNamespace(t *testing.T) *os.File {
	t.Helper()
	var ns *os.File
	err := onLockedThread(
		func() error { return os.NewSyscallError("unshare", unix.Unshare(unix.CLONE_NEWNET)) },
		func() (err error) { ns, err = os.Open("/proc/thread-self/ns/net"); return err },
	)
	if err != nil {
		t.Fatalf("new namespace: %v", err)
	}
	t.Cleanup(func() { ns.Close() })
	h := nsHandle(t, ns)
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	return ns
}

func nsHandle(t *testing.T, ns *os.File) *netlink.Handle {
	t.Helper()
	h, err := routeHandle(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// testbed replaces a sandbox's tap with a veth named like it whose other end
// is a stand-in guest (the VM's place), and links the sandbox to a test
// host through a second veth with routes both ways and forwarding on. Only
// the sandbox's nftables table stands between guest and host.
type testbed struct {
	guest, host *os.File
}

var (
	testHostAddr = "10.99.0.2"
	upstreamGW   = "10.99.0.1"
)

func newTestbed(t *testing.T, n *Network) testbed {
	t.Helper()
	tb := testbed{guest: newAnonymousNamespace(t), host: newAnonymousNamespace(t)}
	sb := nsHandle(t, n.ns)

	tap, err := sb.LinkByName(TapName)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.LinkDel(tap); err != nil {
		t.Fatalf("delete tap: %v", err)
	}
	link(t, sb, TapName, GatewayAddr.String()+"/30", tb.guest, GuestAddr.String()+"/30", GatewayAddr.String())
	link(t, sb, "up0", upstreamGW+"/30", tb.host, testHostAddr+"/30", upstreamGW)
	if err := runIn(n.ns, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0)
	}); err != nil {
		t.Fatalf("enable forwarding: %v", err)
	}
	return tb
}

// link creates a veth from the sandbox (name, addr) to eth0 (peerAddr,
// default route via gw) in peer.
func link(t *testing.T, sb *netlink.Handle, name, addr string, peer *os.File, peerAddr, gw string) {
	t.Helper()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: MTU}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(peer.Fd()))}
	if err := sb.LinkAdd(veth); err != nil {
		t.Fatalf("add veth %s: %v", name, err)
	}
	up(t, sb, name, addr)
	ph := nsHandle(t, peer)
	eth0 := up(t, ph, "eth0", peerAddr)
	if err := ph.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: net.ParseIP(gw)}); err != nil {
		t.Fatalf("route via %s: %v", gw, err)
	}
}

func up(t *testing.T, h *netlink.Handle, name, addr string) netlink.Link {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	a, err := netlink.ParseAddr(addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(l, a); err != nil {
		t.Fatalf("add %s to %s: %v", addr, name, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		t.Fatalf("set %s up: %v", name, err)
	}
	return l
}

func dialFrom(ns *os.File, network, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := runIn(ns, func() (err error) {
		c, err = (&net.Dialer{Timeout: timeout}).Dial(network, addr)
		return err
	})
	return c, err
}

func listenIn(t *testing.T, ns *os.File, network, addr string) (ln net.Listener, pc net.PacketConn) {
	t.Helper()
	err := runIn(ns, func() (err error) {
		if network == "udp4" {
			pc, err = net.ListenPacket(network, addr)
		} else {
			ln, err = net.Listen(network, addr)
		}
		return err
	})
	if err != nil {
		t.Fatalf("listen %s %s: %v", network, addr, err)
	}
	return ln, pc
}

// serveGreeting answers every connection on ln with greeting until ln is
// closed; the test's cleanup closes ln and waits for the server.
func serveGreeting(t *testing.T, ln net.Listener, greeting string) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, greeting)
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
}

// requireDropped dials from ns and expects no answer at all.
func requireDropped(t *testing.T, ns *os.File, addr string) {
	t.Helper()
	c, err := dialFrom(ns, "tcp4", addr, dropWait)
	if err == nil {
		c.Close()
		t.Fatalf("connected to %s, want the SYN dropped", addr)
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("dial %s: %v, want a timeout (silent drop)", addr, err)
	}
}

func requireGreeting(t *testing.T, ns *os.File, addr, want string) {
	t.Helper()
	c, err := dialFrom(ns, "tcp4", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer c.Close()
	got, err := io.ReadAll(c)
	if err != nil || string(got) != want {
		t.Fatalf("read from %s: %q, %v; want %q", addr, got, err, want)
	}
}

func sendUDP(t *testing.T, ns *os.File, addr, payload string) {
	t.Helper()
	c, err := dialFrom(ns, "udp4", addr, time.Second)
	if err != nil {
		t.Fatalf("udp to %s: %v", addr, err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, payload); err != nil {
		t.Fatalf("udp to %s: %v", addr, err)
	}
}

// receivedUDP returns what arrives on pc within dropWait, or "".
func receivedUDP(t *testing.T, pc net.PacketConn) string {
	t.Helper()
	buf := make([]byte, 512)
	_ = pc.SetReadDeadline(time.Now().Add(dropWait))
	n, _, err := pc.ReadFrom(buf)
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("udp read: %v", err)
	}
	return string(buf[:n])
}

func counters(t *testing.T, n *Network) Counters {
	t.Helper()
	c, err := n.Counters()
	if err != nil {
		t.Fatalf("Counters: %v", err)
	}
	return c
}

func TestCreateClose(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	id := sandboxid.New()
	n, err := Create(ctx, id, Config{Mode: Sealed})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	defer n.Close()
	if _, err := os.Stat(n.Path()); err != nil {
		t.Fatalf("namespace not visible to `ip netns`: %v", err)
	}

	h := nsHandle(t, n.ns)
	lo, err := h.LinkByName("lo")
	if err != nil || lo.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("loopback: %v, flags %v; want up", err, lo.Attrs().Flags)
	}
	tap, err := h.LinkByName(TapName)
	if err != nil {
		t.Fatalf("tap: %v", err)
	}
	if a := tap.Attrs(); a.Flags&net.FlagUp == 0 || a.MTU != MTU || !strings.Contains(a.Alias, id) || tap.Type() != "tuntap" {
		t.Errorf("tap %s: type %s, flags %v, MTU %d, alias %q; want an up tuntap, MTU %d, alias naming %s",
			a.Name, tap.Type(), a.Flags, a.MTU, a.Alias, MTU, id)
	}
	addrs, err := h.AddrList(tap, netlink.FAMILY_ALL)
	if err != nil || len(addrs) != 1 || addrs[0].IPNet.String() != GatewayAddr.String()+"/30" {
		t.Errorf("tap addresses %v (%v), want only %s/30 (no IPv6 link-local)", addrs, err, GatewayAddr)
	}
	var disabled []byte
	if err := runIn(n.ns, func() (err error) {
		disabled, err = os.ReadFile("/proc/sys/net/ipv6/conf/" + TapName + "/disable_ipv6")
		return err
	}); err != nil || strings.TrimSpace(string(disabled)) != "1" {
		t.Errorf("tap disable_ipv6 = %q (%v), want 1", disabled, err)
	}
	ifr, err := unix.NewIfreq("")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlIfreq(int(n.Tap().Fd()), unix.TUNGETIFF, ifr); err != nil {
		t.Fatalf("TUNGETIFF on Tap(): %v", err)
	}
	const wantFlags = unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR
	if ifr.Name() != TapName || ifr.Uint16()&wantFlags != wantFlags {
		t.Errorf("Tap() is %q flags %#x, want %s with %#x", ifr.Name(), ifr.Uint16(), TapName, wantFlags)
	}

	if _, err := Create(ctx, id, Config{Mode: Sealed}); err == nil {
		t.Fatal("second Create of the same id succeeded")
	}
	if _, err := os.Stat(n.Path()); err != nil {
		t.Fatalf("failed duplicate Create removed the first namespace: %v", err)
	}

	if err := n.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := os.Stat(n.Path()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Close %s: %v, want it gone", n.Path(), err)
	}
	if err := n.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := n.Set(Config{Mode: Sealed}); err == nil {
		t.Error("Set after Close succeeded")
	}
}

// nsInode identifies a network namespace.
func nsInode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func TestCreateConcurrently(t *testing.T) {
	requireRoot(t)
	const count = 8
	nets := make([]*Network, count)
	var g errgroup.Group
	for i := range nets {
		g.Go(func() (err error) {
			nets[i], err = Create(context.Background(), sandboxid.New(), Config{Mode: Broker, BrokerPort: 3128})
			return err
		})
	}
	err := g.Wait()
	for _, n := range nets {
		if n != nil {
			t.Cleanup(func() { n.Close() })
		}
	}
	if err != nil {
		t.Fatalf("concurrent Create: %v", err)
	}
	seen := map[uint64]bool{nsInode(t, "/proc/self/ns/net"): true}
	for _, n := range nets {
		ino := nsInode(t, n.Path())
		if seen[ino] {
			t.Fatalf("%s shares its network namespace with the host or another sandbox", n.Path())
		}
		seen[ino] = true
		if c, err := n.Counters(); err != nil || c.Total() != (Counter{}) {
			t.Errorf("%s: counters %+v, %v", n.ID(), c, err)
		}
	}
}

// rulesetGeneration is the namespace's nftables generation id, which every
// committed batch raises: equal before and after a Set means Set changed
// nothing.
func rulesetGeneration(t *testing.T, n *Network) uint32 {
	t.Helper()
	conn, err := mdnetlink.Dial(unix.NETLINK_NETFILTER, &mdnetlink.Config{NetNS: int(n.ns.Fd())})
	if err != nil {
		t.Fatalf("dial nfnetlink: %v", err)
	}
	defer conn.Close()
	msgs, err := conn.Execute(mdnetlink.Message{
		Header: mdnetlink.Header{
			Type:  mdnetlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN),
			Flags: mdnetlink.Request,
		},
		Data: []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0}, // struct nfgenmsg
	})
	if err != nil || len(msgs) != 1 || len(msgs[0].Data) < 4 {
		t.Fatalf("NFT_MSG_GETGEN: %d replies, %v", len(msgs), err)
	}
	attrs, err := mdnetlink.NewAttributeDecoder(msgs[0].Data[4:])
	if err != nil {
		t.Fatal(err)
	}
	attrs.ByteOrder = binary.BigEndian
	for attrs.Next() {
		if attrs.Type() == unix.NFTA_GEN_ID {
			return attrs.Uint32()
		}
	}
	t.Fatalf("NFT_MSG_GETGEN reply without a generation id (%v)", attrs.Err())
	return 0
}

func ruleCount(t *testing.T, n *Network) int {
	t.Helper()
	rs, _, err := readTable(n.nft)
	if err != nil {
		t.Fatal(err)
	}
	return len(rs)
}

func TestSetTwiceChangesNothing(t *testing.T) {
	requireRoot(t)
	n := createNetwork(t, Config{Mode: Sealed})
	broker := Config{Mode: Broker, BrokerPort: 3128}
	for _, cfg := range []Config{{Mode: Sealed}, broker} {
		if err := n.Set(cfg); err != nil {
			t.Fatal(err)
		}
		gen, count := rulesetGeneration(t, n), ruleCount(t, n)
		if count != len(rules(cfg)) {
			t.Errorf("%v: %d rules installed, want %d", cfg.Mode, count, len(rules(cfg)))
		}
		if err := n.Set(cfg); err != nil {
			t.Fatal(err)
		}
		if again := rulesetGeneration(t, n); again != gen {
			t.Errorf("%v: re-applying the same config committed a change (generation %d -> %d)", cfg.Mode, gen, again)
		}
		if again := ruleCount(t, n); again != count {
			t.Errorf("%v: re-applying the same config changed the rule count %d -> %d", cfg.Mode, count, again)
		}
	}
	// And a real change does commit, or the checks above prove nothing.
	gen := rulesetGeneration(t, n)
	if err := n.Set(Config{Mode: Sealed}); err != nil {
		t.Fatal(err)
	}
	if rulesetGeneration(t, n) == gen {
		t.Error("switching broker -> sealed did not change the ruleset generation")
	}
}

func TestSealedDropsEverything(t *testing.T) {
	requireRoot(t)
	n := createNetwork(t, Config{Mode: Sealed})
	tb := newTestbed(t, n)
	hostLn, _ := listenIn(t, tb.host, "tcp4", testHostAddr+":8080")
	serveGreeting(t, hostLn, "host")
	_, hostDNS := listenIn(t, tb.host, "udp4", testHostAddr+":53")
	t.Cleanup(func() { hostDNS.Close() })
	gwLn, err := n.Listen(context.Background(), 8080)
	if err != nil {
		t.Fatal(err)
	}
	serveGreeting(t, gwLn, "gateway")

	if c := counters(t, n); c.Total() != (Counter{}) {
		t.Fatalf("counters before any traffic: %+v", c)
	}
	requireDropped(t, tb.guest, testHostAddr+":8080")
	requireDropped(t, tb.guest, GatewayAddr.String()+":8080")
	sendUDP(t, tb.guest, testHostAddr+":53", "query")
	sendUDP(t, tb.guest, GatewayAddr.String()+":53", "query")
	if got := receivedUDP(t, hostDNS); got != "" {
		t.Errorf("test host received DNS datagram %q", got)
	}
	c := counters(t, n)
	if c.DNS.Packets != 2 || c.Other.Packets < 2 {
		t.Errorf("counters %+v, want 2 DNS packets and at least 2 others (the SYNs)", c)
	}

	// Control: without our table the same probes get through, so the
	// drops above are the firewall's doing and not a broken testbed.
	conn, err := nftables.New(nftables.WithNetNSFd(int(n.ns.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	conn.DelTable(&nftables.Table{Name: tableName, Family: nftables.TableFamilyINet})
	if err := conn.Flush(); err != nil {
		t.Fatalf("delete table: %v", err)
	}
	requireGreeting(t, tb.guest, testHostAddr+":8080", "host")
	requireGreeting(t, tb.guest, GatewayAddr.String()+":8080", "gateway")
	sendUDP(t, tb.guest, testHostAddr+":53", "query")
	if got := receivedUDP(t, hostDNS); got != "query" {
		t.Fatalf("control: test host got DNS datagram %q, want %q", got, "query")
	}

	// Set restores a table that was tampered with.
	if err := n.Set(Config{Mode: Sealed}); err != nil {
		t.Fatal(err)
	}
	requireDropped(t, tb.guest, testHostAddr+":8080")
}

func TestBrokerReachesOnlyTheBroker(t *testing.T) {
	requireRoot(t)
	const port = 3128
	n := createNetwork(t, Config{Mode: Broker, BrokerPort: port})
	tb := newTestbed(t, n)
	ctx := context.Background()

	brokerLn, err := n.Listen(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "broker saw "+r.Method+" "+r.URL.String())
	})}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = srv.Serve(brokerLn) }()
	t.Cleanup(func() { srv.Close(); wg.Wait() })
	otherLn, err := n.Listen(ctx, port+1)
	if err != nil {
		t.Fatal(err)
	}
	serveGreeting(t, otherLn, "other")
	hostLn, _ := listenIn(t, tb.host, "tcp4", fmt.Sprintf("%s:%d", testHostAddr, port))
	serveGreeting(t, hostLn, "host")

	// The guest uses the broker as its HTTP proxy.
	proxied := &http.Client{Transport: &http.Transport{
		Proxy: http.ProxyURL(mustURL(t, fmt.Sprintf("http://%s:%d", GatewayAddr, port))),
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialFrom(tb.guest, "tcp4", addr, 5*time.Second)
		},
	}}
	resp, err := proxied.Get("http://example.test/page")
	if err != nil {
		t.Fatalf("GET through the broker: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := "broker saw GET http://example.test/page"; string(body) != want {
		t.Errorf("broker answered %q, want %q", body, want)
	}

	before := counters(t, n)
	requireDropped(t, tb.guest, fmt.Sprintf("%s:%d", GatewayAddr, port+1))
	requireDropped(t, tb.guest, fmt.Sprintf("%s:%d", testHostAddr, port))
	sendUDP(t, tb.guest, GatewayAddr.String()+":53", "query")
	after := counters(t, n)
	if after.DNS.Packets != before.DNS.Packets+1 || after.Other.Packets < before.Other.Packets+2 {
		t.Errorf("counters went from %+v to %+v, want +1 DNS and at least +2 others", before, after)
	}

	// Moving the broker keeps the counts and cuts the old port off.
	if err := n.Set(Config{Mode: Broker, BrokerPort: port + 1}); err != nil {
		t.Fatal(err)
	}
	if moved := counters(t, n); moved != after {
		t.Errorf("counters changed from %+v to %+v by a rebuild", after, moved)
	}
	requireGreeting(t, tb.guest, fmt.Sprintf("%s:%d", GatewayAddr, port+1), "other")
	requireDropped(t, tb.guest, fmt.Sprintf("%s:%d", GatewayAddr, port))
}

func TestReconcileRemovesCrashedSandboxes(t *testing.T) {
	requireRoot(t)
	survivor := createNetwork(t, Config{Mode: Sealed})
	crashed := sandboxid.New()
	crashDaemon(t, crashed)
	if _, err := os.Stat(runDir + "/" + namePrefix + crashed); err != nil {
		t.Fatalf("crashed daemon left no namespace to reconcile: %v", err)
	}

	// Everything but the crashed sandbox counts as live, so namespaces of
	// other processes on this machine are never touched.
	live := func(id string) bool { return id != crashed }
	removed, err := Reconcile(context.Background(), live)
	if err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if !slices.Equal(removed, []string{crashed}) {
		t.Errorf("Reconcile removed %v, want [%s]", removed, crashed)
	}
	if _, err := os.Stat(runDir + "/" + namePrefix + crashed); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("crashed namespace still there: %v", err)
	}
	if _, err := survivor.Counters(); err != nil {
		t.Errorf("live sandbox broken by Reconcile: %v", err)
	}
	if _, err := os.Stat(survivor.Path()); err != nil {
		t.Errorf("live sandbox's namespace gone: %v", err)
	}

	again, err := Reconcile(context.Background(), live)
	if err != nil || len(again) != 0 {
		t.Errorf("second Reconcile: removed %v, %v; want nothing", again, err)
	}
}

const crashHelperEnv = "NETNS_TEST_CRASH_HELPER_ID"

func TestMain(m *testing.M) {
	if id := os.Getenv(crashHelperEnv); id != "" {
		os.Exit(runCrashHelper(id))
	}
	os.Exit(m.Run())
}

// runCrashHelper plays a daemon with one broker sandbox until it is killed.
func runCrashHelper(id string) int {
	ctx := context.Background()
	n, err := Create(ctx, id, Config{Mode: Broker, BrokerPort: 3128})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if _, err := n.Listen(ctx, 3128); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin) // the parent SIGKILLs us first
	return 0
}

// crashDaemon runs this test binary as a daemon that creates sandbox id,
// then kills it with SIGKILL.
func crashDaemon(t *testing.T, id string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashHelperEnv+"="+id)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("crash helper said %q (%v)", line, err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}

// BenchmarkCreate measures a broker sandbox's network set-up (namespace,
// IPv6 off, tap, table, addresses) and its teardown, and reports the median
// of each.
func BenchmarkCreate(b *testing.B) {
	requireRoot(b)
	ctx := context.Background()
	var creates, closes []time.Duration
	for b.Loop() {
		start := time.Now()
		n, err := Create(ctx, sandboxid.New(), Config{Mode: Broker, BrokerPort: 3128})
		if err != nil {
			b.Fatal(err)
		}
		created := time.Now()
		if err := n.Close(); err != nil {
			b.Fatal(err)
		}
		creates = append(creates, created.Sub(start))
		closes = append(closes, time.Since(created))
	}
	b.ReportMetric(median(creates).Seconds()*1e6, "create-median-µs")
	b.ReportMetric(median(closes).Seconds()*1e6, "close-median-µs")
}

func median(ds []time.Duration) time.Duration {
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[len(ds)/2]
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
