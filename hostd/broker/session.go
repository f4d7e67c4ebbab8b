package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/connections"
)

// Session is one run's broker: the proxy on its sandbox's listener and the
// calls of its agent's tools. Close it when the run ends.
type Session struct {
	b           *Broker
	web         bool
	obs         Observer
	connections map[string]*grantedConnection

	// ctx ends at Close; tunnels and in-flight requests watch it.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	servers []*http.Server
	closed  bool
	wg      sync.WaitGroup // Serve loops and requests, tunnels included
}

type grantedConnection struct {
	name        string
	conn        connections.Connection
	methods     []string
	unavailable string // why calls answer 503; empty when usable
}

func newSession(b *Broker, web bool, obs Observer) *Session {
	ctx, cancel := context.WithCancel(context.Background())
	return &Session{b: b, web: web, obs: obs, connections: map[string]*grantedConnection{}, ctx: ctx, cancel: cancel}
}

// ErrSessionClosed is returned when a closed session is used.
var ErrSessionClosed = errors.New("broker: session closed")

// Serve serves the proxy on ln (the sandbox's listener) until Close, in a
// goroutine the session owns. The session closes ln.
func (s *Session) Serve(ln net.Listener) error {
	srv := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    s.b.limits.MaxHeaderBytes,
		// The guest controls what arrives here; its malformed requests
		// are its own business, not the daemon's log's.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		ln.Close()
		return ErrSessionClosed
	}
	s.servers = append(s.servers, srv)
	limited := newLimitListener(ln, s.b.limits.MaxConns)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		srv.Serve(limited)
	}()
	return nil
}

// Close stops serving, ends open tunnels and requests, and waits for them.
func (s *Session) Close() error {
	s.mu.Lock()
	s.closed = true
	servers := s.servers
	s.servers = nil
	s.mu.Unlock()
	s.cancel()
	var errs []error
	for _, srv := range servers {
		if err := srv.Close(); err != nil {
			errs = append(errs, fmt.Errorf("broker: close proxy: %w", err))
		}
	}
	s.wg.Wait()
	return errors.Join(errs...)
}

// track registers a request that Close must wait for; false when the
// session is already closed.
func (s *Session) track() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

// ServeHTTP is the proxy: CONNECT tunnels, absolute-form requests for the
// web and for connections.internal. Origin-form requests (GET / with a
// Host header) are refused: the broker is no web server.
func (s *Session) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// http.Server does not wait for its handlers; Close must, since they
	// report to the run.
	if !s.track() {
		writeRefusal(w, refuse(http.StatusServiceUnavailable, "the run has ended"))
		return
	}
	defer s.wg.Done()
	if r.Method == http.MethodConnect {
		s.serveConnect(w, r)
		return
	}
	start := time.Now()
	if !r.URL.IsAbs() {
		writeRefusal(w, refuse(http.StatusBadRequest, "send requests through the proxy in absolute form (http://host/path)"))
		return
	}
	host := strings.ToLower(r.URL.Hostname())
	if host == ConnectionsHost {
		s.proxyConnection(w, r, start)
		return
	}
	s.proxyWeb(w, r, start)
}

func writeRefusal(w http.ResponseWriter, r *refusal) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Ephemeral-Broker", "refused")
	w.Header().Set("Connection", "close")
	w.WriteHeader(r.status)
	fmt.Fprintf(w, "ephemeral broker: %s\n", r.reason)
}

// resolve returns the one address the broker will dial for a: the
// literal itself, or the first answer when every answer passes the policy.
func (s *Session) resolve(ctx context.Context, a authority) (netip.AddrPort, *refusal) {
	addrs := []netip.Addr{a.ip}
	if !a.ip.IsValid() {
		ctx, cancel := context.WithTimeout(ctx, s.b.limits.DialTimeout)
		defer cancel()
		var err error
		addrs, err = s.b.resolver.LookupNetIP(ctx, "ip", a.host)
		if err != nil || len(addrs) == 0 {
			return netip.AddrPort{}, refuse(http.StatusServiceUnavailable, "cannot resolve %s", a.host)
		}
	}
	for _, addr := range addrs {
		if err := s.checkAddress(addr); err != nil {
			return netip.AddrPort{}, refuse(http.StatusForbidden, "%s: %v", a.host, err)
		}
	}
	return netip.AddrPortFrom(addrs[0].Unmap(), a.port), nil
}

func (s *Session) checkAddress(a netip.Addr) error {
	err := CheckAddress(a)
	if err != nil && s.b.hooks.AllowAddress != nil && s.b.hooks.AllowAddress(a.Unmap()) {
		return nil
	}
	return err
}

type systemResolver struct{}

func (systemResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, network, host)
}

// limitListener lets at most n connections be open at once; Accept waits
// for a slot, so a guest opening many connections only queues them.
type limitListener struct {
	net.Listener
	slots chan struct{}
}

func newLimitListener(ln net.Listener, n int) *limitListener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, n)}
}

func (l *limitListener) Accept() (net.Conn, error) {
	l.slots <- struct{}{}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitedConn{Conn: c, release: sync.OnceFunc(func() { <-l.slots })}, nil
}

type limitedConn struct {
	net.Conn
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}
