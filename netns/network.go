// Package netns gives every sandbox its own network namespace: a named
// namespace eph-<id> (bind-mounted under /run/netns, like `ip netns add`),
// a tap device for the VMM inside it, and an nftables table that drops
// everything except, in broker mode, TCP from the guest to one port of the
// gateway address, where the host broker listens on a socket opened inside
// the namespace.
//
// Nothing routes between a sandbox namespace and the host: there is no veth
// and no forwarding. The broker learns which sandbox is calling from the
// listener that accepted the connection. Every sandbox uses the same
// addresses (gateway 10.77.0.1, guest 10.77.0.2, /30) because no two of them
// share a namespace.
//
// Namespace switching happens only on dedicated, locked OS threads; netlink
// and nftables sockets are opened into the namespace by file descriptor.
package netns

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ephemeralhq/ephemeral/internal/cleanup"
	"github.com/ephemeralhq/ephemeral/internal/sandboxid"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// Addresses inside every sandbox namespace.
var (
	// GatewayAddr is the tap's address: the guest's default gateway and the
	// address broker listeners bind to.
	GatewayAddr = netip.MustParseAddr("10.77.0.1")
	// GuestAddr is the address the guest configures on its interface.
	GuestAddr = netip.MustParseAddr("10.77.0.2")
)

const (
	prefixLen = 30
	// MTU of the tap and the guest interface.
	MTU = 1500
	// TapName is the tap device's name inside the namespace; nftables
	// rules match it by name.
	TapName = "tap0"
	// guestInterface is the name the guest init gives its virtio-net device.
	guestInterface = "eth0"
)

// Mode says what the guest may reach.
type Mode int

const (
	// Sealed accepts nothing from the tap: web and connections are off.
	Sealed Mode = iota
	// Broker accepts TCP from the guest to GatewayAddr:BrokerPort only.
	Broker
)

func (m Mode) String() string {
	switch m {
	case Sealed:
		return "sealed"
	case Broker:
		return "broker"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Config is the firewall configuration of a sandbox network.
type Config struct {
	Mode Mode
	// BrokerPort is the TCP port on GatewayAddr the guest may connect to
	// in Broker mode; it must be 0 in Sealed mode.
	BrokerPort uint16
}

// Validate reports whether the configuration can be applied.
func (c Config) Validate() error {
	switch c.Mode {
	case Sealed:
		if c.BrokerPort != 0 {
			return fmt.Errorf("netns: sealed config with broker port %d", c.BrokerPort)
		}
	case Broker:
		switch c.BrokerPort {
		case 0:
			return errors.New("netns: broker config without a port")
		case dnsPort:
			// The DNS drop rules come first, so the broker could never be reached.
			return fmt.Errorf("netns: broker port %d is the DNS port", dnsPort)
		}
	default:
		return fmt.Errorf("netns: unknown mode %v", c.Mode)
	}
	return nil
}

// Network is one sandbox's network namespace with its tap and firewall.
// Its methods are safe for concurrent use.
type Network struct {
	id   string
	path string // bind mount under runDir
	mac  net.HardwareAddr

	mu        sync.Mutex
	closed    bool
	ns        *os.File // keeps an open handle to the namespace for setns and netlink
	tap       *os.File
	nft       *nftables.Conn
	listeners []net.Listener
	// teardown undoes Create, newest step first.
	teardown cleanup.Stack
}

// Create makes the namespace eph-<id> for the sandbox id (see package
// sandboxid) with loopback up, IPv6 disabled, the tap device carrying the
// gateway address, and the firewall for cfg. On failure nothing of it
// remains. It fails if the namespace already exists: run Reconcile first
// after a crash.
func Create(ctx context.Context, id string, cfg Config) (_ *Network, err error) {
	if err := sandboxid.Validate(id); err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("netns: create %s: %w", id, err)
	}
	n := &Network{id: id, path: filepath.Join(runDir, namePrefix+id), mac: guestMAC(id)}
	var undo cleanup.Stack
	defer func() {
		if err != nil {
			err = errors.Join(err, undo.Run())
		}
	}()

	owner, err := lockOwner(id)
	if err != nil {
		return nil, err
	}
	undo.AddErr(func() error { return unlockOwner(owner) })

	if err := prepareRunDir(); err != nil {
		return nil, err
	}
	if err := createNamed(n.path); err != nil {
		return nil, err
	}
	undo.AddErr(func() error { return removeNamed(n.path) })

	n.ns, err = os.Open(n.path)
	if err != nil {
		return nil, fmt.Errorf("netns: open %s: %w", n.path, err)
	}
	undo.AddErr(n.ns.Close)

	// IPv6 goes off before the tap exists, so the tap never gets a
	// link-local address; the firewall drops IPv6 as well.
	err = runIn(n.ns, func() error {
		if err := disableIPv6(); err != nil {
			return err
		}
		var err error
		n.tap, err = openTap(TapName)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netns: create %s: %w", id, err)
	}
	undo.AddErr(n.tap.Close)

	n.nft, err = nftables.New(nftables.WithNetNSFd(int(n.ns.Fd())), nftables.AsLasting())
	if err != nil {
		return nil, fmt.Errorf("netns: nftables conn in %s: %w", n.path, err)
	}
	undo.AddErr(n.nft.CloseLasting)
	// Rules go in before any interface comes up.
	if err := n.Set(cfg); err != nil {
		return nil, err
	}

	h, err := routeHandle(n.ns)
	if err != nil {
		return nil, fmt.Errorf("netns: create %s: %w", id, err)
	}
	defer h.Close()
	if err := configureLinks(h, id); err != nil {
		return nil, fmt.Errorf("netns: create %s: %w", id, err)
	}

	n.teardown = undo.Release()
	return n, nil
}

// routeHandle opens an rtnetlink socket inside ns. It opens it on a thread
// that runIn moved there: netlink.NewHandleAt would switch the calling
// goroutine's own thread instead.
func routeHandle(ns *os.File) (*netlink.Handle, error) {
	var h *netlink.Handle
	err := runIn(ns, func() (err error) {
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netlink handle: %w", err)
	}
	return h, nil
}

// configureLinks brings loopback up and gives the tap its MTU, an alias naming
// the sandbox (so a leftover is recognisable in `ip link`), the gateway address
// and the up state.
func configureLinks(h *netlink.Handle, id string) error {
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	tap, err := h.LinkByName(TapName)
	if err != nil {
		return fmt.Errorf("find %s: %w", TapName, err)
	}
	if err := h.LinkSetMTU(tap, MTU); err != nil {
		return fmt.Errorf("set %s mtu: %w", TapName, err)
	}
	if err := h.LinkSetAlias(tap, "ephemeral sandbox "+id); err != nil {
		return fmt.Errorf("set %s alias: %w", TapName, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: GatewayAddr.AsSlice(), Mask: net.CIDRMask(prefixLen, 32)}}
	if err := h.AddrAdd(tap, addr); err != nil {
		return fmt.Errorf("add %s to %s: %w", addr, TapName, err)
	}
	if err := h.LinkSetUp(tap); err != nil {
		return fmt.Errorf("set %s up: %w", TapName, err)
	}
	return nil
}

// ID is the sandbox id the network was created for.
func (n *Network) ID() string { return n.id }

// Path is the namespace's bind mount, for tools like `ip netns exec`.
func (n *Network) Path() string { return n.path }

// Tap is the tap device (IFF_TAP|IFF_NO_PI|IFF_VNET_HDR) to hand to the
// VMM, e.g. QEMU `-netdev tap,fd=N`. The Network keeps ownership; the VMM
// gets a duplicate. The tap, and with it the namespace, lives on while any
// process holds a duplicate, so kill the VMM before or after Close.
func (n *Network) Tap() *os.File { return n.tap }

// MAC is the guest interface's address: locally administered, derived from
// the sandbox id so it is stable across restarts of the same sandbox.
func (n *Network) MAC() net.HardwareAddr { return n.mac }

// GuestConfig is what the guest init configures on its interface. There is
// no resolver: the guest never gets DNS.
func (n *Network) GuestConfig() vsockproto.NetConfig {
	return vsockproto.NetConfig{
		Interface: guestInterface,
		Address:   netip.PrefixFrom(GuestAddr, prefixLen).String(),
		Gateway:   GatewayAddr.String(),
		MTU:       MTU,
	}
}

// Listen opens a TCP listener inside the namespace on GatewayAddr:port
// (port 0 picks one). The guest reaches it only if the port is the current
// Config's BrokerPort. The listener is closed by Close at the latest.
func (n *Network) Listen(ctx context.Context, port uint16) (net.Listener, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, fmt.Errorf("netns: listen in %s: %w", n.id, net.ErrClosed)
	}
	addr := netip.AddrPortFrom(GatewayAddr, port).String()
	var ln net.Listener
	err := runIn(n.ns, func() error {
		var err error
		ln, err = new(net.ListenConfig).Listen(ctx, "tcp4", addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netns: listen in %s: %w", n.id, err)
	}
	n.listeners = append(n.listeners, ln)
	return ln, nil
}

// Close closes the listeners opened by Listen, the tap and the sockets into
// the namespace, and removes the namespace's bind mount. The kernel frees
// the namespace, tap and table once nothing else refers to them (a VMM
// holding the tap, an accepted connection). Close is idempotent.
func (n *Network) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	var errs []error
	for _, ln := range n.listeners {
		if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("netns: close listener: %w", err))
		}
	}
	n.listeners = nil
	errs = append(errs, n.teardown.Run())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("netns: close %s: %w", n.id, err)
	}
	return nil
}

// guestMAC derives a locally administered unicast address from the id.
func guestMAC(id string) net.HardwareAddr {
	sum := sha256.Sum256([]byte(id))
	mac := net.HardwareAddr(sum[:6])
	mac[0] = mac[0]&^0x01 | 0x02 // clear multicast, set locally administered
	return mac
}
