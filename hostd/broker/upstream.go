package broker

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"slices"
	"strings"
	"sync"
)

// hopByHop are the headers that describe one connection, not the request
// (RFC 9110 section 7.6.1), plus the proxy's own and HTTP2-Settings (an
// h2c upgrade's).
var hopByHop = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Http2-Settings",
}

// cleanHeader copies h without hop-by-hop headers: the standard ones,
// those h's Connection header names and those named in connection (the
// Connection header as the upstream sent it, when h no longer has it).
func cleanHeader(h http.Header, connection ...string) http.Header {
	out := h.Clone()
	if out == nil {
		out = http.Header{}
	}
	for _, v := range slices.Concat(h.Values("Connection"), connection) {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				out.Del(name)
			}
		}
	}
	for _, name := range hopByHop {
		out.Del(name)
	}
	return out
}

// transport sends one request over a fresh connection to exactly addr,
// whatever host the request's URL names (that name only goes into the
// Host header and TLS server name). No connection is ever reused, so the
// one connection it dials carries the request: dialed returns it.
func (s *Session) transport(addr netip.AddrPort) (_ *http.Transport, dialed func() *recordingConn) {
	lim := s.b.limits
	var mu sync.Mutex
	var conn *recordingConn
	dial := func(ctx context.Context) (net.Conn, error) {
		d := &net.Dialer{Timeout: lim.DialTimeout}
		return d.DialContext(ctx, "tcp", addr.String())
	}
	keep := func(c net.Conn) net.Conn {
		mu.Lock()
		defer mu.Unlock()
		conn = &recordingConn{Conn: c, max: 2*lim.MaxHeaderBytes + 4096}
		return conn
	}
	dialed = func() *recordingConn {
		mu.Lock()
		defer mu.Unlock()
		return conn
	}
	t := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			c, err := dial(ctx)
			if err != nil {
				return nil, err
			}
			return keep(c), nil
		},
		// TLS is done here rather than by the transport so that what
		// recordingConn sees is the plaintext response.
		DialTLSContext: func(ctx context.Context, network, hostport string) (net.Conn, error) {
			c, err := dial(ctx)
			if err != nil {
				return nil, err
			}
			host, _, _ := net.SplitHostPort(hostport)
			tc := tls.Client(c, &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: s.b.hooks.RootCAs, ServerName: host})
			hctx, cancel := context.WithTimeout(ctx, lim.DialTimeout)
			defer cancel()
			if err := tc.HandshakeContext(hctx); err != nil {
				c.Close()
				return nil, err
			}
			return keep(tc), nil
		},
		DisableKeepAlives:      true,
		DisableCompression:     true, // pass bodies through as the upstream sent them
		MaxResponseHeaderBytes: int64(lim.MaxHeaderBytes),
		ResponseHeaderTimeout:  lim.RequestTimeout,
	}
	return t, dialed
}

// recordingConn keeps the first bytes an upstream sends: the response
// head, whose Connection header Go's client deletes when it holds
// "close", taking with it the names of the hop-by-hop headers it lists.
type recordingConn struct {
	net.Conn
	max  int
	mu   sync.Mutex
	head []byte
}

func (c *recordingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	if room := c.max - len(c.head); room > 0 {
		c.head = append(c.head, p[:min(n, room)]...)
	}
	c.mu.Unlock()
	return n, err
}

// connectionHeader returns the Connection header values of the final
// (non-1xx) response head received.
func (c *recordingConn) connectionHeader() ([]string, error) {
	c.mu.Lock()
	head := bytes.Clone(c.head)
	c.mu.Unlock()
	r := textproto.NewReader(bufio.NewReader(bytes.NewReader(head)))
	for {
		line, err := r.ReadLine()
		if err != nil {
			return nil, fmt.Errorf("read response head: %w", err)
		}
		_, status, _ := strings.Cut(line, " ")
		h, err := r.ReadMIMEHeader()
		if err != nil {
			return nil, fmt.Errorf("read response head: %w", err)
		}
		if !strings.HasPrefix(status, "1") || strings.HasPrefix(status, "101") {
			return h.Values("Connection"), nil
		}
	}
}

// errResponseTooLarge ends a response body past the cap.
var errResponseTooLarge = errors.New("response body exceeds the broker's limit")

// send performs req against addr, or in-process with h when h is set. The
// response's headers are cleaned and its body capped: reading past the
// cap fails with errResponseTooLarge, never silently truncates.
func (s *Session) send(req *http.Request, addr netip.AddrPort, h http.Handler) (*http.Response, error) {
	var resp *http.Response
	var connection []string
	var err error
	if h != nil {
		resp, err = serveInProcess(req, h, s.b.limits.MaxResponseBytes)
	} else {
		t, dialed := s.transport(addr)
		resp, err = t.RoundTrip(req)
		t.CloseIdleConnections()
		if err == nil {
			if connection, err = dialed().connectionHeader(); err != nil {
				resp.Body.Close()
				return nil, err
			}
		}
	}
	if err != nil {
		return nil, err
	}
	max := s.b.limits.MaxResponseBytes
	if resp.ContentLength > max {
		resp.Body.Close()
		return nil, refuse(http.StatusBadGateway, "upstream response of %d bytes exceeds the limit of %d", resp.ContentLength, max)
	}
	resp.Header = cleanHeader(resp.Header, connection...)
	resp.Body = &cappedBody{r: resp.Body, left: max}
	return resp, nil
}

type cappedBody struct {
	r    io.ReadCloser
	left int64
	n    int64
}

func (c *cappedBody) Read(p []byte) (int, error) {
	if c.left == 0 {
		// One byte more tells "exactly at the cap" from "past it".
		var one [1]byte
		n, err := c.r.Read(one[:])
		if n > 0 {
			return 0, errResponseTooLarge
		}
		return 0, err
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	c.n += int64(n)
	return n, err
}

func (c *cappedBody) Close() error { return c.r.Close() }

// serveInProcess runs an example system's handler as if it were upstream.
func serveInProcess(req *http.Request, h http.Handler, max int64) (*http.Response, error) {
	rec := &bufferedResponse{header: http.Header{}, max: max}
	h.ServeHTTP(rec, req)
	if rec.overflow {
		return nil, errResponseTooLarge
	}
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	return &http.Response{
		Status:        fmt.Sprintf("%d %s", rec.status, http.StatusText(rec.status)),
		StatusCode:    rec.status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        rec.header,
		Body:          io.NopCloser(bytes.NewReader(rec.body.Bytes())),
		ContentLength: int64(rec.body.Len()),
		Request:       req,
	}, nil
}

type bufferedResponse struct {
	header   http.Header
	status   int
	body     bytes.Buffer
	max      int64
	overflow bool
}

func (b *bufferedResponse) Header() http.Header { return b.header }

func (b *bufferedResponse) WriteHeader(status int) {
	if b.status == 0 {
		b.status = status
	}
}

func (b *bufferedResponse) Write(p []byte) (int, error) {
	b.WriteHeader(http.StatusOK)
	if int64(b.body.Len()+len(p)) > b.max {
		b.overflow = true
		return 0, errResponseTooLarge
	}
	return b.body.Write(p)
}

// readCapped reads all of r, failing past max bytes.
func readCapped(r io.Reader, max int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, errRequestTooLarge
	}
	return b, nil
}

var errRequestTooLarge = errors.New("request body exceeds the broker's limit")
