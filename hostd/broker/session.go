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
	"strconv"
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
	conns   map[*guestConn]struct{} // open guest connections not hijacked
	closed  bool
	// wg counts Serve loops, guest connections until net/http is done
	// with them, and requests (tunnels included): all of them may
	// report to the run, so Close waits for them.
	wg sync.WaitGroup
}

type grantedConnection struct {
	name        string
	conn        connections.Connection
	methods     []string
	unavailable string // why calls answer 503; empty when usable
}

func newSession(b *Broker, web bool, obs Observer) *Session {
	ctx, cancel := context.WithCancel(context.Background())
	return &Session{b: b, web: web, obs: obs, connections: map[string]*grantedConnection{}, conns: map[*guestConn]struct{}{},
		ctx: ctx, cancel: cancel}
}

// ErrSessionClosed is returned when a closed session is used.
var ErrSessionClosed = errors.New("broker: session closed")

// Serve serves the proxy on ln (the sandbox's listener) until Close, in a
// goroutine the session owns. The session closes ln.
//
// Every guest connection carries one request (keep-alives are off, as
// upstream): what net/http refuses before the handler runs is then
// attributable to one request, and a guest cannot pipeline requests whose
// framing the broker and an upstream might read differently.
func (s *Session) Serve(ln net.Listener) error {
	var http1 http.Protocols
	http1.SetHTTP1(true)
	srv := &http.Server{
		Handler:           s,
		Protocols:         &http1,
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    s.b.limits.MaxHeaderBytes,
		// "OPTIONS *" reaches the handler (which refuses it) instead of
		// being answered by net/http.
		DisableGeneralOptionsHandler: true,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, guestConnKey{}, c)
		},
		ConnState: s.connState,
		// The guest controls what arrives here; its malformed requests
		// are its run's timeline's business, not the daemon's log's.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	srv.SetKeepAlivesEnabled(false)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		ln.Close()
		return ErrSessionClosed
	}
	s.servers = append(s.servers, srv)
	guests := &guestListener{Listener: ln, s: s, slots: make(chan struct{}, s.b.limits.MaxConns)}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		srv.Serve(guests)
	}()
	return nil
}

// Close stops serving, ends open connections, tunnels and requests, and
// waits for them.
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
	// net/http closes the connections it tracks; one accepted while it
	// was closing may have escaped it, and would hold Close until the
	// guest sends a request or the head timeout.
	s.mu.Lock()
	conns := make([]*guestConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.Close()
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
	start := time.Now()
	if c, ok := r.Context().Value(guestConnKey{}).(*guestConn); ok {
		c.handled()
	}
	// http.Server does not wait for its handlers; Close must, since they
	// report to the run. (A refusal after Close began is still recorded:
	// Close waits for the connection it came on.)
	if !s.track() {
		s.refuseRequest(w, r, start, refuse(http.StatusServiceUnavailable, "the run has ended"))
		return
	}
	defer s.wg.Done()
	if r.Method == http.MethodConnect {
		s.serveConnect(w, r)
		return
	}
	if !r.URL.IsAbs() {
		s.refuseRequest(w, r, start, refuse(http.StatusBadRequest, "send requests through the proxy in absolute form (http://host/path)"))
		return
	}
	host := strings.ToLower(r.URL.Hostname())
	if host == ConnectionsHost {
		s.proxyConnection(w, r, start)
		return
	}
	s.proxyWeb(w, r, start)
}

// requestEvent is the event of a guest's request as far as the request
// itself tells.
func requestEvent(r *http.Request, start time.Time) Event {
	if r.Method != http.MethodConnect && strings.EqualFold(r.URL.Hostname(), ConnectionsHost) {
		name, rest := splitConnectionPath(requestPath(r.URL))
		if rest == "" {
			rest = "/"
		}
		return Event{Start: start, Connection: name, Method: r.Method, Path: rest}
	}
	ev := Event{Start: start, Method: r.Method, Host: r.Host}
	if r.Method != http.MethodConnect && r.URL.IsAbs() {
		ev.Host = r.URL.Host
	}
	return ev
}

// refuseRequest answers a guest's request the broker will not forward,
// and records it.
func (s *Session) refuseRequest(w http.ResponseWriter, r *http.Request, start time.Time, ref *refusal) {
	ev := requestEvent(r, start)
	ev.Status, ev.Refused = ref.status, ref.reason
	s.obs.Record(ev)
	writeRefusal(w, ref)
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

// guestListener lets at most len(slots) guest connections be open at
// once (Accept waits for a slot, so a guest opening many connections only
// queues them) and registers each with the session.
type guestListener struct {
	net.Listener
	s     *Session
	slots chan struct{}
}

func (l *guestListener) Accept() (net.Conn, error) {
	// http.Server.Close waits for Serve to return before it closes the
	// connections holding the slots: waiting on in Accept would stall it.
	select {
	case l.slots <- struct{}{}:
	case <-l.s.ctx.Done():
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	gc := &guestConn{Conn: c, s: l.s, release: sync.OnceFunc(func() { <-l.slots })}
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if l.s.closed {
		gc.Close()
		return nil, net.ErrClosed
	}
	l.s.conns[gc] = struct{}{}
	l.s.wg.Add(1)
	return gc, nil
}

// connState ends the session's hold on a guest connection once net/http
// is done with it: closed, or handed to a CONNECT tunnel (which the
// request's own hold covers).
func (s *Session) connState(c net.Conn, state http.ConnState) {
	gc, ok := c.(*guestConn)
	if !ok || (state != http.StateClosed && state != http.StateHijacked) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.conns[gc]; ok {
		delete(s.conns, gc)
		s.wg.Done()
	}
}

type guestConnKey struct{}

// maxRequestSample is how much of a request's start a guestConn keeps to
// name its method.
const maxRequestSample = 64

// guestConn is one connection from the guest, carrying one request. It
// notices when net/http answers that request itself, before any handler
// runs: a head it cannot parse or that is too large (a malformed request
// line, a doubled Content-Length, "Transfer-Encoding: chunked, identity",
// a missing Host), an unsupported Expect. Such an answer is the first
// write on a connection whose request never reached ServeHTTP; the
// connection reports it as a refusal so that it reaches the timeline too.
type guestConn struct {
	net.Conn
	s       *Session
	release func() // the listener's slot

	mu       sync.Mutex
	start    time.Time // the request's first byte
	sample   []byte    // the request's first bytes
	handler  bool      // ServeHTTP has the request
	reported bool
}

func (c *guestConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	if n > 0 && c.start.IsZero() {
		c.start = time.Now()
	}
	if room := maxRequestSample - len(c.sample); room > 0 {
		c.sample = append(c.sample, p[:min(n, room)]...)
	}
	c.mu.Unlock()
	return n, err
}

func (c *guestConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	own := !c.handler && !c.reported
	c.reported = c.reported || own
	start, sample := c.start, c.sample
	c.mu.Unlock()
	if own {
		c.s.recordRejected(start, sample, p)
	}
	return c.Conn.Write(p)
}

// handled marks the request as ServeHTTP's.
func (c *guestConn) handled() {
	c.mu.Lock()
	c.handler = true
	c.mu.Unlock()
}

func (c *guestConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

// recordRejected records a request net/http refused itself, from the
// start of the request and of net/http's answer
// ("HTTP/1.1 400 Bad Request\r\n...\r\n\r\n400 Bad Request: why").
func (s *Session) recordRejected(start time.Time, request, answer []byte) {
	if start.IsZero() {
		start = time.Now()
	}
	ev := Event{Start: start, Status: http.StatusBadRequest}
	if method, _, ok := strings.Cut(string(request), " "); ok && isToken(method) {
		ev.Method = method
	}
	head, body, _ := strings.Cut(string(answer), "\r\n\r\n")
	statusLine, _, _ := strings.Cut(head, "\r\n")
	if _, rest, ok := strings.Cut(statusLine, " "); ok && len(rest) >= 3 {
		if code, err := strconv.Atoi(rest[:3]); err == nil {
			ev.Status = code
		}
	}
	switch ev.Status {
	case http.StatusRequestHeaderFieldsTooLarge:
		ev.Refused = fmt.Sprintf("request head exceeds %d bytes", s.b.limits.MaxHeaderBytes)
	case http.StatusExpectationFailed:
		ev.Refused = "unsupported Expect header"
	default:
		// net/http's own words, which never echo the request.
		why := strings.TrimPrefix(body, strconv.Itoa(ev.Status)+" ")
		if why == "" {
			why = http.StatusText(ev.Status)
		}
		ev.Refused = "malformed request: " + clipText(why)
	}
	s.obs.Record(ev)
}

// isToken reports whether s is an HTTP token, as a method is.
func isToken(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}
