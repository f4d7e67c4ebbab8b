package broker

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// ErrForbiddenAddress is wrapped by errors for addresses no sandbox may reach.
var ErrForbiddenAddress = errors.New("address not allowed")

// forbidden lists what a sandbox may never reach beyond what
// netip.Addr's own predicates catch (loopback, private, link-local,
// multicast, unspecified) and, for IPv6, beyond everything outside
// 2000::/3.
var forbidden = []struct {
	prefix netip.Prefix
	what   string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "this-network"},
	{netip.MustParsePrefix("100.64.0.0/10"), "CGNAT"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignments"},
	{netip.MustParsePrefix("192.0.2.0/24"), "documentation"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("198.51.100.0/24"), "documentation"},
	{netip.MustParsePrefix("203.0.113.0/24"), "documentation"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	// Inside 2000::/3 but not global (IANA special-purpose registry).
	// Teredo (2001::/32) carries an IPv4 server and an XORed client
	// address; nothing should be tunnelled through it, so it is refused
	// whole along with the rest of 2001::/23.
	{netip.MustParsePrefix("2001::/32"), "Teredo"},
	{netip.MustParsePrefix("2001::/23"), "IETF protocol assignments"},
	{netip.MustParsePrefix("2001:db8::/32"), "documentation"},
	{netip.MustParsePrefix("3fff::/20"), "documentation"},
}

// IPv6 forms that name an IPv4 address. netip.Addr.Unmap handles
// ::ffff:a.b.c.d (IPv4-mapped).
var (
	globalUnicast6 = netip.MustParsePrefix("2000::/3")
	nat64          = netip.MustParsePrefix("64:ff9b::/96")   // well-known NAT64 prefix: a.b.c.d in the last 32 bits
	sixToFour      = netip.MustParsePrefix("2002::/16")      // 6to4: a.b.c.d in bits 16-47
	localNAT64     = netip.MustParsePrefix("64:ff9b:1::/48") // local-use NAT64: the IPv4 position depends on the prefix length chosen
	compatible     = netip.MustParsePrefix("::/96")          // deprecated IPv4-compatible ::a.b.c.d
	translated     = netip.MustParsePrefix("::ffff:0:0/96")  // SIIT IPv4-translated ::ffff:0:a.b.c.d
)

// CheckAddress returns nil if a sandbox may be connected to a, and an
// error wrapping ErrForbiddenAddress saying why not otherwise. An IPv6
// address must be global unicast (2000::/3) or the well-known NAT64 form
// of an allowed IPv4 address; an IPv4 address that a 6to4 address or an
// ISATAP interface id carries must be allowed too.
func CheckAddress(a netip.Addr) error {
	if !a.IsValid() {
		return fmt.Errorf("invalid address: %w", ErrForbiddenAddress)
	}
	if a.Zone() != "" {
		return fmt.Errorf("%s: scoped address: %w", a, ErrForbiddenAddress)
	}
	a = a.Unmap() // ::ffff:127.0.0.1 is 127.0.0.1 to the kernel
	if what := forbiddenAs(a); what != "" {
		return fmt.Errorf("%s is %s: %w", a, what, ErrForbiddenAddress)
	}
	for _, e := range embeddedIPv4(a) {
		if err := CheckAddress(e.addr); err != nil {
			return fmt.Errorf("%s embeds (%s) %w", a, e.how, err)
		}
	}
	return nil
}

// forbiddenAs names the class of address a is when no sandbox may reach
// it, and returns "" otherwise.
func forbiddenAs(a netip.Addr) string {
	switch {
	case a.IsUnspecified():
		return "unspecified"
	case a.IsLoopback():
		return "loopback"
	case a.IsPrivate():
		return "private" // RFC 1918 and fc00::/7, which holds fd00:ec2::254
	case a.IsLinkLocalUnicast():
		return "link-local" // holds 169.254.169.254
	case a.IsMulticast(), a.IsLinkLocalMulticast(), a.IsInterfaceLocalMulticast():
		return "multicast"
	case !a.IsGlobalUnicast():
		return "not global unicast"
	}
	if a.Is6() && !globalUnicast6.Contains(a) && !nat64.Contains(a) {
		switch {
		case localNAT64.Contains(a):
			return "local-use NAT64"
		case translated.Contains(a):
			return "IPv4-translated (SIIT)"
		case compatible.Contains(a):
			return "IPv4-compatible"
		}
		return "outside the IPv6 global unicast block 2000::/3"
	}
	for _, f := range forbidden {
		if f.prefix.Contains(a) {
			return f.what
		}
	}
	return ""
}

// embedding is an IPv4 address an IPv6 address carries, and how.
type embedding struct {
	addr netip.Addr
	how  string
}

// embeddedIPv4 extracts the IPv4 addresses an allowed-looking IPv6
// address stands for: the NAT64 or 6to4 prefix's, and an ISATAP interface
// id's (::0:5efe:a.b.c.d, ::200:5efe:a.b.c.d), which may come on top of
// a 6to4 prefix.
func embeddedIPv4(a netip.Addr) []embedding {
	if !a.Is6() {
		return nil
	}
	b := a.As16()
	var out []embedding
	switch {
	case nat64.Contains(a):
		return []embedding{{netip.AddrFrom4([4]byte(b[12:16])), "NAT64"}}
	case sixToFour.Contains(a):
		out = append(out, embedding{netip.AddrFrom4([4]byte(b[2:6])), "6to4"})
	}
	// The u/l and group bits of the interface id's first byte may be set.
	if b[8]&^0x03 == 0 && b[9] == 0 && b[10] == 0x5e && b[11] == 0xfe {
		out = append(out, embedding{netip.AddrFrom4([4]byte(b[12:16])), "ISATAP"})
	}
	return out
}

// authority is a parsed host and port a request names.
type authority struct {
	host string     // lower-case name without trailing dot, or an IP literal
	ip   netip.Addr // set when host is an IP literal
	port uint16
}

func (a authority) String() string {
	if a.ip.IsValid() {
		return netip.AddrPortFrom(a.ip, a.port).String()
	}
	return a.host + ":" + strconv.Itoa(int(a.port))
}

const maxHostLen = 253

// parseAuthority parses "host", "host:port", "[v6]" or "[v6]:port" as it
// appears in a URL or a CONNECT line. Names must be plain ASCII DNS names
// whose last label is not numeric, so that no resolver can read them as an
// address in some legacy notation (127.1, 0x7f000001).
func parseAuthority(s string, defaultPort uint16) (authority, error) {
	host, portStr := s, ""
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return authority{}, fmt.Errorf("authority %q: unclosed [", s)
		}
		host, portStr = s[1:end], s[end+1:]
		if portStr != "" && !strings.HasPrefix(portStr, ":") {
			return authority{}, fmt.Errorf("authority %q: junk after ]", s)
		}
		portStr = strings.TrimPrefix(portStr, ":")
		ip, err := netip.ParseAddr(host)
		if err != nil || !ip.Is6() || ip.Zone() != "" {
			return authority{}, fmt.Errorf("authority %q: bad IPv6 literal", s)
		}
	} else if i := strings.LastIndexByte(s, ':'); i >= 0 {
		host, portStr = s[:i], s[i+1:]
		if strings.Contains(host, ":") {
			return authority{}, fmt.Errorf("authority %q: IPv6 literals need brackets", s)
		}
	}
	a := authority{port: defaultPort}
	if portStr != "" || strings.HasSuffix(s, ":") {
		p, err := strconv.ParseUint(portStr, 10, 16)
		if err != nil || p == 0 || portStr[0] == '+' {
			return authority{}, fmt.Errorf("authority %q: bad port", s)
		}
		a.port = uint16(p)
	}
	if a.port == 0 {
		return authority{}, fmt.Errorf("authority %q: no port", s)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Zone() != "" {
			return authority{}, fmt.Errorf("authority %q: scoped address", s)
		}
		a.ip, a.host = ip, ip.String()
		return a, nil
	}
	name := strings.TrimSuffix(strings.ToLower(host), ".")
	if err := checkHostname(name); err != nil {
		return authority{}, fmt.Errorf("authority %q: %w", s, err)
	}
	a.host = name
	return a, nil
}

func checkHostname(name string) error {
	if name == "" || len(name) > maxHostLen {
		return errors.New("host name must be 1 to 253 characters")
	}
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("bad label %q", l)
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("label %q: only ASCII letters, digits, - and _", l)
			}
		}
	}
	last := labels[len(labels)-1]
	if strings.Trim(last, "0123456789") == "" || strings.HasPrefix(last, "0x") {
		return errors.New("numeric top-level label")
	}
	return nil
}
