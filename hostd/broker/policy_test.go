package broker

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// addressCases are addresses with whether a sandbox may reach them,
// grouped by how an IPv6 address can carry an IPv4 one.
var addressCases = []struct {
	addr    string
	allowed bool
}{
	{"93.184.215.14", true}, {"1.1.1.1", true}, {"8.8.8.8", true},
	{"2606:4700:4700::1111", true}, {"2a00:1450:4001::200e", true}, {"2001:4860:4860::8888", true},
	{"127.0.0.1", false}, {"127.8.9.10", false}, {"::1", false}, // loopback
	{"10.0.0.1", false}, {"172.16.5.4", false}, {"172.31.255.255", false}, {"192.168.1.1", false}, // RFC 1918
	{"169.254.169.254", false}, {"169.254.0.1", false}, {"fe80::1", false}, // link-local, metadata
	{"100.64.0.1", false}, {"100.127.255.254", false}, // CGNAT
	{"fc00::1", false}, {"fd00:ec2::254", false}, // ULA, AWS IPv6 metadata
	{"224.0.0.1", false}, {"239.255.255.250", false}, {"ff02::1", false}, {"ff0e::1", false}, // multicast
	{"0.0.0.0", false}, {"::", false}, {"0.1.2.3", false}, // unspecified, this network
	{"255.255.255.255", false}, {"240.0.0.1", false}, // broadcast, reserved
	{"192.0.2.1", false}, {"198.18.0.1", false}, {"2001:db8::1", false}, {"3fff::1", false}, // documentation, benchmarking
	{"fec0::1", false}, {"100::1", false}, {"4000::1", false}, {"5f00::1", false}, // site-local, discard, outside 2000::/3
	{"2001:2::1", false}, {"2001:1::1", false}, // IETF protocol assignments

	// IPv4-mapped ::ffff:a.b.c.d
	{"::ffff:93.184.215.14", true},
	{"::ffff:127.0.0.1", false}, {"::ffff:169.254.169.254", false}, {"::ffff:10.0.0.1", false},
	// IPv4-compatible ::a.b.c.d (deprecated; refused whatever it carries)
	{"::127.0.0.1", false}, {"::10.0.0.1", false}, {"::169.254.169.254", false}, {"::8.8.8.8", false},
	// SIIT IPv4-translated ::ffff:0:a.b.c.d (refused whatever it carries)
	{"::ffff:0:127.0.0.1", false}, {"::ffff:0:10.0.0.1", false}, {"::ffff:0:8.8.8.8", false},
	// Well-known NAT64 64:ff9b::a.b.c.d
	{"64:ff9b::8.8.8.8", true},
	{"64:ff9b::169.254.169.254", false}, {"64:ff9b::127.0.0.1", false}, {"64:ff9b::10.0.0.1", false}, {"64:ff9b::100.64.0.1", false},
	// Local-use NAT64 64:ff9b:1::/48 (the IPv4's position depends on the
	// operator's prefix length; refused whatever it carries)
	{"64:ff9b:1::127.0.0.1", false}, {"64:ff9b:1:7f00:0:100::", false}, {"64:ff9b:1::8.8.8.8", false},
	// 6to4 2002:a.b.c.d::/48
	{"2002:808:808::1", true},
	{"2002:7f00:1::1", false}, {"2002:a9fe:a9fe::1", false}, {"2002:a00:1::1", false}, {"2002:c0a8:101::1", false},
	// Teredo 2001:0:server:flags:port:client XOR ffff:ffff (refused whatever it carries)
	{"2001:0:4136:e378:8000:63bf:3fff:fdd2", false}, // RFC 4380's example: server 65.54.227.120, client 192.0.2.45
	{"2001:0:808:808:0:0:80ff:fffe", false},         // client 127.0.0.1
	{"2001:0:808:808:0:0:f7f7:f7f7", false},         // client 8.8.8.8
	// ISATAP interface ids ::0:5efe:a.b.c.d and ::200:5efe:a.b.c.d
	{"2a00:1450:4001:1:0:5efe:8.8.8.8", true}, {"2a00:1450:4001:1:200:5efe:8.8.8.8", true},
	{"2a00:1450:4001:1:0:5efe:127.0.0.1", false}, {"2a00:1450:4001:1:200:5efe:169.254.169.254", false},
	{"2a00:1450:4001:1:300:5efe:10.0.0.1", false}, {"2a00:1450:4001:1:100:5efe:192.168.0.1", false},
	{"2002:808:808:1:0:5efe:127.0.0.1", false}, // 6to4 prefix fine, ISATAP id loopback
	{"fe80::5efe:8.8.8.8", false},
}

func TestCheckAddress(t *testing.T) {
	for _, c := range addressCases {
		err := CheckAddress(netip.MustParseAddr(c.addr))
		switch {
		case c.allowed && err != nil:
			t.Errorf("%s refused: %v", c.addr, err)
		case !c.allowed && !errors.Is(err, ErrForbiddenAddress):
			t.Errorf("%s allowed (err %v)", c.addr, err)
		}
	}
	if err := CheckAddress(netip.MustParseAddr("fe80::1%eth0")); err == nil {
		t.Error("scoped address allowed")
	}
	if err := CheckAddress(netip.Addr{}); err == nil {
		t.Error("zero address allowed")
	}
}

// An address the check allows carries no refused IPv4 address in any
// form an IPv6 address can carry one, and nothing panics. The forms are
// extracted here independently of embeddedIPv4.
func FuzzCheckAddress(f *testing.F) {
	for _, c := range addressCases {
		f.Add(netip.MustParseAddr(c.addr).AsSlice())
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		a, ok := netip.AddrFromSlice(b)
		if !ok || CheckAddress(a) != nil {
			return
		}
		if a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsMulticast() || a.IsUnspecified() {
			t.Fatalf("%s allowed", a)
		}
		u := a.Unmap()
		if u.Is6() && !netip.MustParsePrefix("2000::/3").Contains(u) && !netip.MustParsePrefix("64:ff9b::/96").Contains(u) {
			t.Fatalf("%s allowed outside 2000::/3", a)
		}
		for form, v4 := range carriedIPv4(u) {
			if err := CheckAddress(v4); err != nil {
				t.Fatalf("%s allowed, but as %s it carries %s: %v", a, form, v4, err)
			}
		}
	})
}

// carriedIPv4 lists every IPv4 address a could stand for, by form.
func carriedIPv4(a netip.Addr) map[string]netip.Addr {
	out := map[string]netip.Addr{}
	if !a.Is6() {
		return out
	}
	b := a.As16()
	v4 := func(p ...byte) netip.Addr { return netip.AddrFrom4([4]byte(p)) }
	in := func(prefix string) bool { return netip.MustParsePrefix(prefix).Contains(a) }
	last := v4(b[12], b[13], b[14], b[15])
	if in("::/96") {
		out["IPv4-compatible"] = last
	}
	if in("::ffff:0:0/96") {
		out["SIIT"] = last
	}
	if in("64:ff9b::/96") {
		out["NAT64"] = last
	}
	if in("64:ff9b:1::/48") { // RFC 6052 positions for each prefix length
		out["local NAT64 /48"] = v4(b[6], b[7], b[9], b[10])
		out["local NAT64 /56"] = v4(b[7], b[9], b[10], b[11])
		out["local NAT64 /64"] = v4(b[9], b[10], b[11], b[12])
		out["local NAT64 /96"] = last
	}
	if in("2002::/16") {
		out["6to4"] = v4(b[2], b[3], b[4], b[5])
	}
	if in("2001::/32") {
		out["Teredo server"] = v4(b[4], b[5], b[6], b[7])
		out["Teredo client"] = v4(^b[12], ^b[13], ^b[14], ^b[15])
	}
	if b[8]&^3 == 0 && b[9] == 0 && b[10] == 0x5e && b[11] == 0xfe {
		out["ISATAP"] = last
	}
	return out
}

var authorityCases = []struct {
	in      string
	host    string
	port    uint16
	literal bool
}{
	{"example.com", "example.com", 80, false},
	{"Example.COM.:8080", "example.com", 8080, false},
	{"93.184.215.14:443", "93.184.215.14", 443, true},
	{"[2606:4700::1111]", "2606:4700::1111", 80, true},
	{"[::ffff:127.0.0.1]:80", "::ffff:127.0.0.1", 80, true},
	{"under_score.example.org", "under_score.example.org", 80, false},
	{"example.com:", "", 0, false},
	{"example.com:0", "", 0, false},
	{"example.com:65536", "", 0, false},
	{"example.com:+80", "", 0, false},
	{"127.1", "", 0, false},
	{"0x7f000001", "", 0, false},
	{"2130706433", "", 0, false},
	{"a..b", "", 0, false},
	{"-a.com", "", 0, false},
	{"exa mple.com", "", 0, false},
	{"ex\u00e4mple.com", "", 0, false},
	{"::1", "", 0, false},
	{"[::1", "", 0, false},
	{"[::1]x", "", 0, false},
	{"[127.0.0.1]", "", 0, false},
	{"[fe80::1%25eth0]", "", 0, false},
	{"", "", 0, false},
	{strings.Repeat("a.", 127) + "com", "", 0, false},
}

func TestParseAuthority(t *testing.T) {
	for _, c := range authorityCases {
		a, err := parseAuthority(c.in, 80)
		if c.host == "" {
			if err == nil {
				t.Errorf("%q accepted as %+v", c.in, a)
			}
			continue
		}
		if err != nil || a.host != c.host || a.port != c.port || a.ip.IsValid() != c.literal {
			t.Errorf("%q: got %+v, %v; want host %q port %d literal %v", c.in, a, err, c.host, c.port, c.literal)
		}
	}
}

// An accepted authority is a plain name or literal that reads back the
// same; a name never hides an address.
func FuzzParseAuthority(f *testing.F) {
	for _, c := range authorityCases {
		f.Add(c.in)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := parseAuthority(s, 443)
		if err != nil {
			return
		}
		if a.port == 0 {
			t.Fatalf("%q: port 0 accepted", s)
		}
		if !a.ip.IsValid() {
			if _, err := netip.ParseAddr(a.host); err == nil {
				t.Fatalf("%q: name %q is an address", s, a.host)
			}
			if a.host != strings.ToLower(a.host) || strings.ContainsAny(a.host, ":[]%/ ") {
				t.Fatalf("%q: odd name %q", s, a.host)
			}
		}
		again, err := parseAuthority(a.String(), 1)
		if err != nil || again.host != a.host || again.port != a.port {
			t.Fatalf("%q: %s reparses as %+v, %v", s, a, again, err)
		}
	})
}
