package netns

import (
	"context"
	"net"
	"net/netip"
	"testing"
)

func TestGuestMAC(t *testing.T) {
	a, b := guestMAC("sb-a"), guestMAC("sb-b")
	for _, mac := range []net.HardwareAddr{a, b} {
		if len(mac) != 6 || mac[0]&0x02 == 0 || mac[0]&0x01 != 0 {
			t.Errorf("%v is not a locally administered unicast MAC", mac)
		}
	}
	if a.String() == b.String() {
		t.Errorf("two ids got the same MAC %v", a)
	}
	if again := guestMAC("sb-a"); again.String() != a.String() {
		t.Errorf("MAC of the same id changed: %v then %v", a, again)
	}
}

func TestGuestConfig(t *testing.T) {
	cfg := (&Network{}).GuestConfig()
	prefix, err := netip.ParsePrefix(cfg.Address)
	if err != nil {
		t.Fatalf("guest address %q: %v", cfg.Address, err)
	}
	gw, err := netip.ParseAddr(cfg.Gateway)
	if err != nil {
		t.Fatalf("gateway %q: %v", cfg.Gateway, err)
	}
	switch {
	case !prefix.Masked().Contains(gw):
		t.Errorf("gateway %v outside the guest's subnet %v", gw, prefix)
	case gw == prefix.Addr():
		t.Errorf("guest and gateway share the address %v", gw)
	case cfg.MTU != MTU || cfg.Interface == "":
		t.Errorf("interface %q MTU %d, want a name and MTU %d", cfg.Interface, cfg.MTU, MTU)
	}
}

// Create takes only sandbox ids: an id names a path under /run/netns and
// is what Reconcile recognises as its own.
func TestCreateRejectsForeignIDs(t *testing.T) {
	for _, id := range []string{"", "../etc", "test-0a1b2c3d4e5f", "0A1B2C3D4E5F"} {
		if n, err := Create(context.Background(), id, Config{Mode: Sealed}); err == nil {
			n.Close()
			t.Errorf("Create(%q) succeeded", id)
		}
	}
}
