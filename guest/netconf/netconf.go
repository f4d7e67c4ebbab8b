// Package netconf configures the guest's network interface over netlink:
// hardware address, IP address, MTU, link state and default route. It never configures a
// resolver: the guest has no DNS by design.
package netconf

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// maxMTU bounds what the host may ask for: 64 KiB is the largest IP packet.
const maxMTU = 65535

// Plan is a validated NetConfig.
type Plan struct {
	Interface string
	Address   netip.Prefix
	Gateway   netip.Addr       // invalid: no default route
	MTU       int              // 0: leave as is
	MAC       net.HardwareAddr // nil: leave as is
}

// ParseConfig checks a host request before any netlink call.
func ParseConfig(cfg vsockproto.NetConfig) (Plan, error) {
	p := Plan{Interface: cfg.Interface, MTU: cfg.MTU}
	if p.Interface == "" {
		p.Interface = "eth0"
	}
	if len(p.Interface) >= unix.IFNAMSIZ {
		return Plan{}, fmt.Errorf("netconf: interface name %q too long", p.Interface)
	}
	var err error
	if p.Address, err = netip.ParsePrefix(cfg.Address); err != nil {
		return Plan{}, fmt.Errorf("netconf: address: %w", err)
	}
	if cfg.Gateway != "" {
		if p.Gateway, err = netip.ParseAddr(cfg.Gateway); err != nil {
			return Plan{}, fmt.Errorf("netconf: gateway: %w", err)
		}
		if p.Gateway.Is4() != p.Address.Addr().Is4() {
			return Plan{}, fmt.Errorf("netconf: gateway %s and address %s are of different families", p.Gateway, p.Address)
		}
	}
	if p.MTU < 0 || p.MTU > maxMTU || (p.MTU > 0 && p.MTU < 68) {
		return Plan{}, fmt.Errorf("netconf: MTU %d out of range", p.MTU)
	}
	if err := cfg.Validate(); err != nil {
		return Plan{}, fmt.Errorf("netconf: %w", err)
	}
	if cfg.MAC != "" {
		p.MAC, _ = net.ParseMAC(cfg.MAC) // checked by Validate
	}
	return p, nil
}

// Apply configures the interface. Re-applying the same plan is harmless.
func Apply(p Plan) error {
	link, err := netlink.LinkByName(p.Interface)
	if err != nil {
		return fmt.Errorf("netconf: find %s: %w", p.Interface, err)
	}
	if p.MAC != nil {
		// Before the link comes up, so that no frame leaves with the
		// old address (a clone's is its snapshot's).
		if err := netlink.LinkSetHardwareAddr(link, p.MAC); err != nil {
			return fmt.Errorf("netconf: set hardware address of %s: %w", p.Interface, err)
		}
	}
	if p.MTU > 0 {
		if err := netlink.LinkSetMTU(link, p.MTU); err != nil {
			return fmt.Errorf("netconf: set MTU of %s: %w", p.Interface, err)
		}
	}
	addr := &netlink.Addr{IPNet: prefixToIPNet(p.Address)}
	if p.Address.Addr().Is6() {
		// The host assigned the address; duplicate detection would
		// only delay its use by seconds.
		addr.Flags = unix.IFA_F_NODAD
	}
	if err := netlink.AddrReplace(link, addr); err != nil {
		return fmt.Errorf("netconf: set address of %s: %w", p.Interface, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("netconf: bring up %s: %w", p.Interface, err)
	}
	if p.Gateway.IsValid() {
		route := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: p.Gateway.AsSlice()}
		if p.Gateway.Is6() {
			route.Family = netlink.FAMILY_V6
		} else {
			route.Family = netlink.FAMILY_V4
		}
		if err := netlink.RouteReplace(route); err != nil {
			return fmt.Errorf("netconf: default route via %s: %w", p.Gateway, err)
		}
	}
	return nil
}

// LoopbackUp brings up lo, which programs in the guest use for local
// servers even without any network.
func LoopbackUp() error {
	link, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("netconf: find lo: %w", err)
	}
	if err := netlink.LinkSetUp(link); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("netconf: bring up lo: %w", err)
	}
	return nil
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	addr := p.Addr()
	return &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(p.Bits(), addr.BitLen())}
}
