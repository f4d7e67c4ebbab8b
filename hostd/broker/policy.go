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
// multicast, unspecified).
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
	{netip.MustParsePrefix("100::/64"), "discard-only"},
	{netip.MustParsePrefix("2001::/32"), "Teredo"},
	{netip.MustParsePrefix("2001:db8::/32"), "documentation"},
	{netip.MustParsePrefix("fec0::/10"), "site-local"},
}

// Prefixes that carry an IPv4 address inside an IPv6 one: the embedded
// address is checked as well.
var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// CheckAddress returns nil if a sandbox may be connected to a, and an
// error wrapping ErrForbiddenAddress saying why not otherwise.
func CheckAddress(a netip.Addr) error {
	if !a.IsValid() {
		return fmt.Errorf("invalid address: %w", ErrForbiddenAddress)
	}
	if a.Zone() != "" {
		return fmt.Errorf("%s: scoped address: %w", a, ErrForbiddenAddress)
	}
	a = a.Unmap() // ::ffff:127.0.0.1 is 127.0.0.1 to the kernel
	var what string
	switch {
	case a.IsUnspecified():
		what = "unspecified"
	case a.IsLoopback():
		what = "loopback"
	case a.IsPrivate():
		what = "private" // RFC 1918 and fc00::/7, which holds fd00:ec2::254
	case a.IsLinkLocalUnicast():
		what = "link-local" // holds 169.254.169.254
	case a.IsMulticast(), a.IsLinkLocalMulticast(), a.IsInterfaceLocalMulticast():
		what = "multicast"
	case !a.IsGlobalUnicast():
		what = "not global unicast"
	}
	if what == "" {
		for _, f := range forbidden {
			if f.prefix.Contains(a) {
				what = f.what
				break
			}
		}
	}
	if what != "" {
		return fmt.Errorf("%s is %s: %w", a, what, ErrForbiddenAddress)
	}
	if embedded, ok := embeddedIPv4(a); ok {
		if err := CheckAddress(embedded); err != nil {
			return fmt.Errorf("%s embeds %w", a, err)
		}
	}
	return nil
}

// embeddedIPv4 extracts the IPv4 address a NAT64 or 6to4 address stands for.
func embeddedIPv4(a netip.Addr) (netip.Addr, bool) {
	b := a.As16()
	switch {
	case nat64.Contains(a):
		return netip.AddrFrom4([4]byte(b[12:16])), true
	case sixToFour.Contains(a):
		return netip.AddrFrom4([4]byte(b[2:6])), true
	}
	return netip.Addr{}, false
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
