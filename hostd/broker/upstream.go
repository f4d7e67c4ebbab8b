package broker

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// hopByHop are the headers that describe one connection, not the request
// (RFC 9110 section 7.6.1), plus the proxy's own.
var hopByHop = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// cleanHeader copies h without hop-by-hop headers, including those the
// Connection header names.
func cleanHeader(h http.Header) http.Header {
	out := h.Clone()
	if out == nil {
		out = http.Header{}
	}
	for _, v := range h.Values("Connection") {
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
// Host header and TLS server name). No connection is ever reused.
func (s *Session) transport(addr netip.AddrPort) *http.Transport {
	lim := s.b.limits
	dialer := &net.Dialer{Timeout: lim.DialTimeout}
	return &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "tcp", addr.String())
		},
		TLSClientConfig:        &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: s.b.hooks.RootCAs},
		TLSHandshakeTimeout:    lim.DialTimeout,
		DisableKeepAlives:      true,
		DisableCompression:     true, // pass bodies through as the upstream sent them
		MaxResponseHeaderBytes: int64(lim.MaxHeaderBytes),
		ResponseHeaderTimeout:  lim.RequestTimeout,
	}
}

// errResponseTooLarge ends a response body past the cap.
var errResponseTooLarge = errors.New("response body exceeds the broker's limit")

// send performs req against addr, or in-process with h when h is set. The
// response's headers are cleaned and its body capped: reading past the
// cap fails with errResponseTooLarge, never silently truncates.
func (s *Session) send(req *http.Request, addr netip.AddrPort, h http.Handler) (*http.Response, error) {
	var resp *http.Response
	var err error
	if h != nil {
		resp, err = serveInProcess(req, h, s.b.limits.MaxResponseBytes)
	} else {
		t := s.transport(addr)
		resp, err = t.RoundTrip(req)
		t.CloseIdleConnections()
	}
	if err != nil {
		return nil, err
	}
	max := s.b.limits.MaxResponseBytes
	if resp.ContentLength > max {
		resp.Body.Close()
		return nil, refuse(http.StatusBadGateway, "upstream response of %d bytes exceeds the limit of %d", resp.ContentLength, max)
	}
	resp.Header = cleanHeader(resp.Header)
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
