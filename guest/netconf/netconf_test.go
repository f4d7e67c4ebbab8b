package netconf

import (
	"net"
	"net/netip"
	"reflect"
	"testing"

	"github.com/ephemeralhq/ephemeral/vsockproto"
)

func TestParseConfig(t *testing.T) {
	good := []struct {
		in   vsockproto.NetConfig
		want Plan
	}{
		{vsockproto.NetConfig{Address: "10.200.0.2/30", Gateway: "10.200.0.1", MTU: 1500},
			Plan{Interface: "eth0", Address: netip.MustParsePrefix("10.200.0.2/30"), Gateway: netip.MustParseAddr("10.200.0.1"), MTU: 1500}},
		{vsockproto.NetConfig{Interface: "eth1", Address: "fd00::2/64"},
			Plan{Interface: "eth1", Address: netip.MustParsePrefix("fd00::2/64")}},
		{vsockproto.NetConfig{Address: "10.200.0.2/30", MAC: "02:00:5e:00:53:01"},
			Plan{Interface: "eth0", Address: netip.MustParsePrefix("10.200.0.2/30"), MAC: net.HardwareAddr{2, 0, 0x5e, 0, 0x53, 1}}},
	}
	for _, c := range good {
		got, err := ParseConfig(c.in)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("ParseConfig(%+v) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	bad := []vsockproto.NetConfig{
		{Address: "10.0.0.2"},
		{Address: "10.0.0.2/24", Gateway: "fd00::1"},
		{Address: "10.0.0.2/24", Gateway: "nonsense"},
		{Address: "10.0.0.2/24", MTU: 70000},
		{Address: "10.0.0.2/24", MTU: 20},
		{Interface: "a-very-long-interface-name", Address: "10.0.0.2/24"},
		{Address: "10.0.0.2/24", MAC: "01:00:5e:00:00:01"},             // multicast
		{Address: "10.0.0.2/24", MAC: "00:00:00:00:fe:80:00:00:00:00"}, // not Ethernet
	}
	for _, c := range bad {
		if _, err := ParseConfig(c); err == nil {
			t.Errorf("ParseConfig(%+v): no error", c)
		}
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add("eth0", "10.200.0.2/30", "10.200.0.1", 1500)
	f.Add("", "fd00::2/64", "fd00::1", 0)
	f.Fuzz(func(t *testing.T, iface, addr, gw string, mtu int) {
		p, err := ParseConfig(vsockproto.NetConfig{Interface: iface, Address: addr, Gateway: gw, MTU: mtu})
		if err != nil {
			return
		}
		if !p.Address.IsValid() || p.MTU < 0 || p.MTU > maxMTU || (p.Gateway.IsValid() && p.Gateway.Is4() != p.Address.Addr().Is4()) {
			t.Errorf("accepted inconsistent plan %+v", p)
		}
	})
}
