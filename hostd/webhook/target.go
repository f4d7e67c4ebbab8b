package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/broker"
)

// MaxURLBytes bounds a webhook URL.
const MaxURLBytes = 2048

// ParseURL checks a webhook URL as a run request names it: absolute http
// or https (plain http is allowed: the signature guards the body's
// integrity, not its secrecy), a DNS name or an address the broker's
// policy allows, port 80, 443 or 1024 and above (no well-known service
// port such as SMTP's), no user info and no fragment. The name is only
// resolved, and its addresses checked, when the delivery is made.
func ParseURL(s string) (*url.URL, error) {
	if len(s) > MaxURLBytes {
		return nil, fmt.Errorf("webhook URL exceeds %d bytes", MaxURLBytes)
	}
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return nil, errors.New("webhook URL is not a valid URL")
	case u.Scheme != "https" && u.Scheme != "http":
		return nil, errors.New("webhook URL must be http or https")
	case u.Opaque != "" || u.Host == "":
		return nil, errors.New("webhook URL needs a host")
	case u.User != nil:
		return nil, errors.New("webhook URL must not hold user info (sign with the webhook secret instead)")
	case u.Fragment != "" || strings.Contains(s, "#"):
		return nil, errors.New("webhook URL must not have a fragment")
	}
	if p := u.Port(); p != "" || strings.HasSuffix(u.Host, ":") {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 || (n != 80 && n != 443 && n < 1024) {
			return nil, errors.New("webhook URL's port must be 80, 443 or 1024 to 65535")
		}
	}
	host := u.Hostname()
	if ip, err := netip.ParseAddr(host); err == nil {
		if err := broker.CheckAddress(ip); err != nil {
			return nil, fmt.Errorf("webhook URL's address is not allowed: %w", err)
		}
		return u, nil
	}
	if err := checkHostname(host); err != nil {
		return nil, fmt.Errorf("webhook URL's host: %w", err)
	}
	if h := strings.ToLower(strings.TrimSuffix(host, ".")); h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return nil, fmt.Errorf("webhook URL's host %s is loopback: %w", host, broker.ErrForbiddenAddress)
	}
	return u, nil
}

// checkHostname accepts plain ASCII DNS names whose last label is not
// numeric, so that no resolver reads one as an address in a legacy
// notation (127.1, 0x7f000001).
func checkHostname(name string) error {
	name = strings.TrimSuffix(name, ".")
	if name == "" || len(name) > 253 {
		return errors.New("a host name is 1 to 253 characters")
	}
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("bad label %q", l)
		}
		for i := 0; i < len(l); i++ {
			c := l[i] | 0x20
			if !(c >= 'a' && c <= 'z' || l[i] >= '0' && l[i] <= '9' || l[i] == '-' || l[i] == '_') {
				return fmt.Errorf("label %q: only ASCII letters, digits, - and _", l)
			}
		}
	}
	if last := labels[len(labels)-1]; strings.Trim(last, "0123456789") == "" || strings.HasPrefix(strings.ToLower(last), "0x") {
		return errors.New("numeric top-level label")
	}
	return nil
}

// Resolver resolves a name to addresses (a *net.Resolver).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// TestHooks loosen the address policy for tests whose receiver lives on
// loopback. The daemon never sets them and no setting reaches them.
type TestHooks struct {
	// AllowAddress lets through an address broker.CheckAddress refuses.
	AllowAddress func(netip.Addr) bool
	// RootCAs replaces the system's roots for https receivers.
	RootCAs *x509.CertPool
}

// maxResponseBytes is how much of a receiver's answer is read (and
// dropped) before the connection is closed.
const maxResponseBytes = 64 << 10

// poster sends one delivery attempt.
type poster struct {
	resolver Resolver
	hooks    TestHooks
	timeout  time.Duration
}

// post resolves u's host once, checks every address it resolves to and
// POSTs body to the first, over a fresh connection to exactly that
// address, following no redirect. It returns the receiver's status.
func (p *poster) post(ctx context.Context, u *url.URL, header http.Header, body []byte) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	addr, err := p.resolve(ctx, u)
	if err != nil {
		return 0, err
	}
	dialer := &net.Dialer{}
	transport := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "tcp", addr.String())
		},
		TLSClientConfig:        &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: p.hooks.RootCAs},
		DisableKeepAlives:      true,
		MaxResponseHeaderBytes: 16 << 10,
	}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header = header
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseBytes))
	return resp.StatusCode, nil
}

func (p *poster) resolve(ctx context.Context, u *url.URL) (netip.AddrPort, error) {
	host := u.Hostname()
	port := uint16(443)
	if u.Scheme == "http" {
		port = 80
	}
	if s := u.Port(); s != "" {
		n, err := strconv.ParseUint(s, 10, 16)
		if err != nil {
			return netip.AddrPort{}, fmt.Errorf("bad port %q", s)
		}
		port = uint16(n)
	}
	addrs := []netip.Addr{}
	if ip, err := netip.ParseAddr(host); err == nil {
		addrs = append(addrs, ip)
	} else {
		var err error
		if addrs, err = p.resolver.LookupNetIP(ctx, "ip", host); err != nil || len(addrs) == 0 {
			return netip.AddrPort{}, fmt.Errorf("cannot resolve %s: %v", host, err)
		}
	}
	// Every address must pass, as in the broker: a name that also
	// resolves to a private address is refused whichever one would be
	// dialled.
	for _, a := range addrs {
		if err := broker.CheckAddress(a); err != nil && (p.hooks.AllowAddress == nil || !p.hooks.AllowAddress(a.Unmap())) {
			return netip.AddrPort{}, fmt.Errorf("%s: %w", host, err)
		}
	}
	return netip.AddrPortFrom(addrs[0].Unmap(), port), nil
}

type systemResolver struct{}

func (systemResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, network, host)
}
