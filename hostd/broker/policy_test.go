package broker

import (
	"errors"
	"net/netip"
	"net/url"
	"path"
	"strings"
	"testing"
)

func TestCheckAddress(t *testing.T) {
	allowed := []string{"93.184.215.14", "1.1.1.1", "8.8.8.8", "2606:4700:4700::1111", "2a00:1450:4001::200e", "::ffff:93.184.215.14"}
	forbidden := []string{
		"127.0.0.1", "127.8.9.10", "::1", // loopback
		"10.0.0.1", "172.16.5.4", "172.31.255.255", "192.168.1.1", // RFC 1918
		"169.254.169.254", "169.254.0.1", "fe80::1", // link-local, metadata
		"100.64.0.1", "100.127.255.254", // CGNAT
		"fc00::1", "fd00:ec2::254", // ULA, AWS IPv6 metadata
		"224.0.0.1", "239.255.255.250", "ff02::1", "ff0e::1", // multicast
		"0.0.0.0", "::", "0.1.2.3", // unspecified, this network
		"255.255.255.255", "240.0.0.1", // broadcast, reserved
		"::ffff:127.0.0.1", "::ffff:169.254.169.254", "::ffff:10.0.0.1", // IPv4-mapped
		"64:ff9b::a9fe:a9fe", "64:ff9b::7f00:1", // NAT64 of metadata and loopback
		"2002:7f00:1::1", "2002:a9fe:a9fe::1", // 6to4 of loopback and metadata
		"192.0.2.1", "198.18.0.1", "2001:db8::1", "fec0::1", "2001::1",
	}
	for _, s := range allowed {
		if err := CheckAddress(netip.MustParseAddr(s)); err != nil {
			t.Errorf("%s refused: %v", s, err)
		}
	}
	for _, s := range forbidden {
		if err := CheckAddress(netip.MustParseAddr(s)); !errors.Is(err, ErrForbiddenAddress) {
			t.Errorf("%s allowed (err %v)", s, err)
		}
	}
	if err := CheckAddress(netip.MustParseAddr("fe80::1%eth0")); err == nil {
		t.Error("scoped address allowed")
	}
	if err := CheckAddress(netip.Addr{}); err == nil {
		t.Error("zero address allowed")
	}
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

var subpathCases = []struct {
	raw string
	ok  bool
}{
	{"", true},
	{"/", true},
	{"/v1/customers", true},
	{"/v1/customers/42", true},
	{"/v1/a%20b", true},
	{"/v1//x", true},
	{"/..", false},
	{"/v1/../../admin", false},
	{"/./x", false},
	{"/%2e%2e/admin", false},
	{"/%2E%2E/admin", false},
	{"/.%2e/admin", false},
	{"/a%2fb", false},
	{"/a%2F..%2Fb", false},
	{"/a%5c..%5cb", false},
	{"/a\\..\\b", false},
	{"/a%00", false},
	{"/a%0d%0aX: y", false},
	{"/a%zz", false},
	{"/%252e%252e/admin", false},
	{"v1", false},
}

func TestCheckSubpath(t *testing.T) {
	for _, c := range subpathCases {
		if err := checkSubpath(c.raw); (err == nil) != c.ok {
			t.Errorf("%q: err %v, want ok=%v", c.raw, err, c.ok)
		}
	}
}

// Whatever checkSubpath accepts stays under the base path, however the
// upstream normalises it.
func FuzzCheckSubpath(f *testing.F) {
	for _, c := range subpathCases {
		f.Add(c.raw)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if checkSubpath(raw) != nil {
			return
		}
		decoded, err := url.PathUnescape(raw)
		if err != nil {
			t.Fatalf("%q accepted but does not decode", raw)
		}
		for _, p := range []string{decoded, strings.ReplaceAll(decoded, "\\", "/")} {
			if clean := path.Clean("/base" + p); clean != "/base" && !strings.HasPrefix(clean, "/base/") {
				t.Fatalf("%q escapes the base: %q", raw, clean)
			}
		}
		// Decoding twice (a careless upstream) must not escape either.
		twice, err := url.PathUnescape(decoded)
		if err == nil {
			if clean := path.Clean("/base" + twice); clean != "/base" && !strings.HasPrefix(clean, "/base/") {
				t.Fatalf("%q escapes the base when decoded twice: %q", raw, clean)
			}
		}
	})
}
