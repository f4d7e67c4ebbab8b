// Package forwarded believes what a trusted proxy says about a request:
// behind a load balancer every request comes from the balancer's address,
// over plain HTTP, so rate limits would count all clients as one and
// cookies could never be marked Secure. Only a proxy on the configured list
// is believed; anyone else's X-Forwarded-* headers are ignored, since any
// client can send them.
package forwarded

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// Proxies are the addresses whose X-Forwarded-For and X-Forwarded-Proto
// headers are believed.
type Proxies []netip.Prefix

// ParseProxies reads a comma-separated list of addresses and CIDR
// prefixes ("10.0.0.0/8, 192.0.2.7"); empty trusts none.
func ParseProxies(list string) (Proxies, error) {
	var out Proxies
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if p, err := netip.ParsePrefix(item); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(item)
		if err != nil {
			return nil, fmt.Errorf("forwarded: %q is neither an address nor a CIDR prefix", item)
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

func (p Proxies) trusts(a netip.Addr) bool {
	a = a.Unmap()
	for _, prefix := range p {
		if prefix.Contains(a) {
			return true
		}
	}
	return false
}

type secureKey struct{}

// Handler passes requests on to next; for a request from a trusted proxy
// it first sets RemoteAddr to the client X-Forwarded-For names (the
// nearest address not itself a trusted proxy) and notes whether the
// proxy received it over TLS (X-Forwarded-Proto: https, as the nearest
// proxy set it).
func (p Proxies) Handler(next http.Handler) http.Handler {
	if len(p) == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		peer, ok := addrOf(r.RemoteAddr)
		if !ok || !p.trusts(peer) {
			next.ServeHTTP(w, r)
			return
		}
		r2 := r.Clone(r.Context())
		if client, ok := p.client(r.Header.Values("X-Forwarded-For")); ok {
			r2.RemoteAddr = net.JoinHostPort(client.String(), "0")
		}
		if last(r.Header.Values("X-Forwarded-Proto")) == "https" {
			r2 = r2.WithContext(context.WithValue(r2.Context(), secureKey{}, true))
		}
		next.ServeHTTP(w, r2)
	})
}

// client walks X-Forwarded-For from the nearest hop back: the first
// address that is not a trusted proxy is the client. Anything unparsable
// on the way makes the header worthless.
func (p Proxies) client(headers []string) (netip.Addr, bool) {
	var hops []string
	for _, h := range headers {
		hops = append(hops, strings.Split(h, ",")...)
	}
	var found netip.Addr
	for i := len(hops) - 1; i >= 0; i-- {
		a, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			return netip.Addr{}, false
		}
		found = a.Unmap()
		if !p.trusts(found) {
			return found, true
		}
	}
	return found, found.IsValid()
}

// Secure reports whether the client reached us over TLS: directly, or
// through a trusted proxy that says so.
func Secure(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	secure, _ := r.Context().Value(secureKey{}).(bool)
	return secure
}

func addrOf(hostport string) (netip.Addr, bool) {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	a, err := netip.ParseAddr(host)
	return a, err == nil
}

func last(values []string) string {
	if len(values) == 0 {
		return ""
	}
	parts := strings.Split(values[len(values)-1], ",")
	return strings.ToLower(strings.TrimSpace(parts[len(parts)-1]))
}
