package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"
)

// Request is a call an agent tool makes on the run's behalf.
type Request struct {
	Method string // empty means GET
	// URL is absolute for Fetch; for ConnectionRequest it is the path
	// (with an optional query) under the connection's base URL.
	URL    string
	Header http.Header
	Body   []byte
}

// Response is an upstream's answer to a tool's Request.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// requestContext bounds one request by the broker's limit and the
// session's life.
func (s *Session) requestContext(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(parent, s.b.limits.RequestTimeout)
	stop := context.AfterFunc(s.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// webRequest checks a web request against the grants and the policy and,
// when it passes, charges and sends it.
func (s *Session) webRequest(ctx context.Context, method string, u *url.URL, header http.Header, body io.Reader, length int64, ev *Event) (*http.Response, *refusal) {
	if !s.web {
		return nil, refuse(http.StatusForbidden, "web access is not granted to this run")
	}
	if method == http.MethodTrace || method == "TRACK" || method == http.MethodConnect {
		return nil, refuse(http.StatusMethodNotAllowed, "method %s is not forwarded", method)
	}
	var defaultPort uint16
	switch u.Scheme {
	case "http":
		defaultPort = 80
	case "https":
		defaultPort = 443
	default:
		return nil, refuse(http.StatusBadRequest, "scheme %q: only http and https", u.Scheme)
	}
	a, err := parseAuthority(u.Host, defaultPort)
	if err != nil {
		return nil, refuse(http.StatusBadRequest, "%v", err)
	}
	ev.Host = a.host
	if a.port != defaultPort {
		ev.Host = a.String()
	}
	if length > s.b.limits.MaxRequestBytes {
		return nil, refuse(http.StatusRequestEntityTooLarge, "request body exceeds %d bytes", s.b.limits.MaxRequestBytes)
	}
	addr, ref := s.resolve(ctx, a)
	if ref != nil {
		return nil, ref
	}
	if err := s.obs.ChargeWeb(); err != nil {
		return nil, refuse(http.StatusPaymentRequired, "the run's budget does not cover another web request")
	}
	target := *u
	target.User = nil
	target.Fragment = ""
	out, err := http.NewRequestWithContext(ctx, method, target.String(), nil)
	if err != nil {
		return nil, refuse(http.StatusBadRequest, "request: %v", err)
	}
	out.Header = cleanHeader(header)
	setBody(out, body, length, s.b.limits.MaxRequestBytes)
	resp, err := s.send(out, addr, nil)
	if err != nil {
		return nil, upstreamFailure(a.host, err)
	}
	return resp, nil
}

// setBody attaches a body capped at max bytes.
func setBody(out *http.Request, body io.Reader, length, max int64) {
	if body == nil || length == 0 {
		return
	}
	out.Body = http.MaxBytesReader(nil, io.NopCloser(body), max)
	out.ContentLength = length // -1 (unknown) makes the transport chunk it
}

func upstreamFailure(host string, err error) *refusal {
	var ref *refusal
	if errors.As(err, &ref) {
		return ref
	}
	var maxErr *http.MaxBytesError
	if errors.As(err, &maxErr) {
		return refuse(http.StatusRequestEntityTooLarge, "request body exceeds %d bytes", maxErr.Limit)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return refuse(http.StatusGatewayTimeout, "%s did not answer in time", host)
	}
	return refuse(http.StatusBadGateway, "%s: %v", host, err)
}

// proxyWeb forwards an absolute-form request from the guest.
func (s *Session) proxyWeb(w http.ResponseWriter, r *http.Request, start time.Time) {
	ctx, cancel := s.requestContext(r.Context())
	defer cancel()
	ev := requestEvent(r, start)
	resp, ref := s.webRequest(ctx, r.Method, r.URL, r.Header, r.Body, r.ContentLength, &ev)
	s.relay(w, resp, ref, &ev)
}

// relay writes the upstream's response (or the refusal) to the guest and
// records the event.
func (s *Session) relay(w http.ResponseWriter, resp *http.Response, ref *refusal, ev *Event) {
	if ref != nil {
		ev.Status, ev.Refused = ref.status, ref.reason
		s.obs.Record(*ev)
		writeRefusal(w, ref)
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	if resp.ContentLength > 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	}
	w.WriteHeader(resp.StatusCode)
	n, err := io.Copy(w, resp.Body)
	ev.Status, ev.Bytes = resp.StatusCode, n
	if err != nil {
		ev.Err = err.Error()
		s.obs.Record(*ev)
		// The status is out already: cutting the connection is the only
		// way to tell the guest that the body is incomplete.
		panic(http.ErrAbortHandler)
	}
	s.obs.Record(*ev)
}

// Fetch is the web_fetch tool: the same policy, grants and metering as
// the guest's proxy requests. It follows no redirects.
func (s *Session) Fetch(ctx context.Context, req Request) (*Response, error) {
	if req.Method == "" {
		req.Method = http.MethodGet
	}
	ev := Event{Start: time.Now(), Method: req.Method, Host: req.URL}
	ctx, cancel := s.requestContext(ctx)
	defer cancel()
	u, err := url.Parse(req.URL)
	if err != nil || !u.IsAbs() {
		ref := refuse(http.StatusBadRequest, "url must be absolute http(s)")
		ev.Status, ev.Refused = ref.status, ref.reason
		s.obs.Record(ev)
		return nil, ref
	}
	ev.Host = u.Host
	resp, ref := s.webRequest(ctx, req.Method, u, req.Header, bodyReader(req.Body), int64(len(req.Body)), &ev)
	return s.collect(resp, ref, &ev)
}

func bodyReader(b []byte) io.Reader {
	if len(b) == 0 {
		return nil
	}
	return bytes.NewReader(b)
}

// collect reads a tool's response and records the event.
func (s *Session) collect(resp *http.Response, ref *refusal, ev *Event) (*Response, error) {
	if ref != nil {
		ev.Status, ev.Refused = ref.status, ref.reason
		s.obs.Record(*ev)
		return nil, ref
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	ev.Status, ev.Bytes = resp.StatusCode, int64(len(body))
	if err != nil {
		ev.Err = err.Error()
		s.obs.Record(*ev)
		return nil, fmt.Errorf("broker: read response: %w", err)
	}
	s.obs.Record(*ev)
	return &Response{Status: resp.StatusCode, Header: resp.Header, Body: body}, nil
}

// serveConnect opens a tunnel for HTTPS: to port 443 of a checked address
// only, with the download capped; the broker cannot see inside, so the
// tunnel is metered as one web request.
func (s *Session) serveConnect(w http.ResponseWriter, r *http.Request) {
	ev := requestEvent(r, time.Now())
	upstream, ref := s.dialTunnel(r, &ev)
	if ref != nil {
		ev.Status, ev.Refused = ref.status, ref.reason
		s.obs.Record(ev)
		writeRefusal(w, ref)
		return
	}
	guest, buffered, err := http.NewResponseController(w).Hijack()
	if err != nil {
		upstream.Close()
		ev.Status, ev.Err = http.StatusInternalServerError, err.Error()
		s.obs.Record(ev)
		return
	}
	ev.Status = http.StatusOK
	if _, err := guest.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		guest.Close()
		upstream.Close()
		ev.Err = err.Error()
		s.obs.Record(ev)
		return
	}
	ev.Bytes, err = s.splice(guest, buffered, upstream)
	if err != nil {
		ev.Err = err.Error()
	}
	s.obs.Record(ev)
}

func (s *Session) dialTunnel(r *http.Request, ev *Event) (net.Conn, *refusal) {
	if !s.web {
		return nil, refuse(http.StatusForbidden, "web access is not granted to this run")
	}
	a, err := parseAuthority(r.Host, 0)
	if err != nil {
		return nil, refuse(http.StatusBadRequest, "CONNECT %v", err)
	}
	if a.host == ConnectionsHost {
		return nil, refuse(http.StatusBadRequest, "connections are plain http: %s/<name>/", ConnectionsURL)
	}
	if !slices.Contains(s.b.tunnelPorts, a.port) {
		return nil, refuse(http.StatusForbidden, "CONNECT only to port %v", s.b.tunnelPorts)
	}
	ev.Host = a.host
	ctx, cancel := s.requestContext(r.Context())
	defer cancel()
	addr, ref := s.resolve(ctx, a)
	if ref != nil {
		return nil, ref
	}
	if err := s.obs.ChargeWeb(); err != nil {
		return nil, refuse(http.StatusPaymentRequired, "the run's budget does not cover another web request")
	}
	d := net.Dialer{Timeout: s.b.limits.DialTimeout}
	conn, err := d.DialContext(ctx, "tcp", addr.String())
	if err != nil {
		return nil, upstreamFailure(a.host, err)
	}
	return conn, nil
}

// splice copies both ways until either side is done, the tunnel's time is
// up or the session closes, and returns the bytes passed down to the guest.
func (s *Session) splice(guest net.Conn, fromGuest io.Reader, upstream net.Conn) (int64, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.b.limits.TunnelTimeout)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { guest.Close(); upstream.Close() })
	defer stop()

	up := make(chan struct{})
	go func() {
		defer close(up)
		io.Copy(upstream, fromGuest)
		if cw, ok := upstream.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
	}()
	max := s.b.limits.MaxResponseBytes
	n, err := io.CopyN(guest, upstream, max)
	if err == nil {
		var one [1]byte
		if k, _ := upstream.Read(one[:]); k > 0 {
			err = errResponseTooLarge
		} else {
			err = io.EOF
		}
	}
	guest.Close()
	upstream.Close()
	<-up
	switch {
	case errors.Is(err, errResponseTooLarge):
		return n, err
	case ctx.Err() != nil:
		return n, fmt.Errorf("tunnel ended: %w", context.Cause(ctx))
	case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed):
		return n, nil
	}
	return n, err
}
