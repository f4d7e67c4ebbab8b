package netns

import (
	"errors"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestValidateID(t *testing.T) {
	tests := []struct {
		id string
		ok bool
	}{
		{"run_0123456789abcdef0123456789abcdef", true},
		{"sb-1", true},
		{"", false},
		{strings.Repeat("a", maxIDLen), true},
		{strings.Repeat("a", maxIDLen+1), false},
		{"../etc", false},
		{"a/b", false},
		{"a.b", false},
		{"a b", false},
		{"ä", false},
		{"a\x00", false},
	}
	for _, tt := range tests {
		if err := ValidateID(tt.id); (err == nil) != tt.ok {
			t.Errorf("ValidateID(%q) = %v, want ok=%v", tt.id, err, tt.ok)
		}
	}
}

// FuzzValidateID checks that an accepted id (it comes from API input) can
// only name a plain entry directly inside runDir.
func FuzzValidateID(f *testing.F) {
	for _, seed := range []string{"run_0123", "", "../x", "a/b", ".", "..", "eph-x", "\xff"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if ValidateID(id) != nil {
			return
		}
		name := namePrefix + id
		p := filepath.Join(runDir, name)
		if filepath.Dir(p) != runDir || filepath.Base(p) != name {
			t.Fatalf("id %q escapes %s: %s", id, runDir, p)
		}
		if len(id) > maxIDLen {
			t.Fatalf("id %q longer than %d accepted", id, maxIDLen)
		}
	})
}

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

func TestUndoStackRunsNewestFirst(t *testing.T) {
	var order []string
	var u undoStack
	u.push(func() error { order = append(order, "namespace"); return nil })
	u.push(func() error { order = append(order, "tap"); return errors.New("tap busy") })
	u.push(func() error { order = append(order, "table"); return nil })
	err := u.run()
	if want := []string{"table", "tap", "namespace"}; !slices.Equal(order, want) {
		t.Errorf("undo order %v, want %v", order, want)
	}
	if err == nil || !strings.Contains(err.Error(), "tap busy") {
		t.Errorf("run() = %v, want the failing step's error", err)
	}
	if err := u.run(); err != nil || len(order) != 3 {
		t.Errorf("second run() = %v after %d steps, want nothing undone twice", err, len(order))
	}
}
