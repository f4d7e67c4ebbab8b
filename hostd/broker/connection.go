package broker

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"
)

// credentialHeaders are dropped from every connection request the guest
// or the model sends, whether or not the connection sets them: only the
// stored headers may authenticate a call.
var credentialHeaders = []string{
	"Authorization", "Proxy-Authorization", "Cookie", "Cookie2",
	"X-Api-Key", "Api-Key", "X-Auth-Token", "X-Access-Token", "X-Amz-Security-Token",
	"X-Csrf-Token", "X-Xsrf-Token",
}

// splitConnectionPath splits "/crm/v1/x" into "crm" and "/v1/x".
func splitConnectionPath(escaped string) (name, rest string) {
	p := strings.TrimPrefix(escaped, "/")
	name, rest, found := strings.Cut(p, "/")
	if found {
		rest = "/" + rest
	}
	return name, rest
}

// connectionRequest checks a call against the run's grant for the
// connection and, when it passes, sends it with the stored credentials.
// rawPath is the escaped path under the connection, rawQuery its query.
func (s *Session) connectionRequest(ctx context.Context, name, method, rawPath, rawQuery string, header http.Header, body []byte, ev *Event) (*http.Response, *refusal) {
	gc := s.connections[name]
	switch {
	case gc == nil:
		// Whether the organisation has such a connection is not the run's business.
		return nil, refuse(http.StatusForbidden, "connection %q is not granted to this run", name)
	case gc.unavailable != "":
		return nil, refuse(http.StatusServiceUnavailable, "connection %q is unavailable: %s", name, gc.unavailable)
	case !slices.Contains(gc.methods, method):
		return nil, refuse(http.StatusForbidden, "method %s is not granted for connection %q (granted: %s)",
			method, name, strings.Join(gc.methods, ", "))
	}
	canonical, ref := canonicalSubpath(rawPath)
	if ref != nil {
		return nil, ref
	}
	// The timeline shows what was forwarded.
	ev.Path = canonical
	if ev.Path == "" {
		ev.Path = "/"
	}
	if int64(len(body)) > s.b.limits.MaxRequestBytes {
		return nil, refuse(http.StatusRequestEntityTooLarge, "request body exceeds %d bytes", s.b.limits.MaxRequestBytes)
	}
	base := gc.conn.BaseURL
	// Forward exactly the path that was checked: RawPath is the encoding
	// the request line carries, Path its decoded twin.
	target := *base
	target.RawPath = base.EscapedPath() + canonical
	var err error
	if target.Path, err = url.PathUnescape(target.RawPath); err != nil {
		return nil, refuse(http.StatusServiceUnavailable, "connection %q: base URL: %v", name, err)
	}
	target.RawQuery = rawQuery

	h := s.b.inProcess[base.Hostname()]
	var addr netip.AddrPort
	if h == nil {
		var defaultPort uint16 = 443
		if base.Scheme == "http" {
			defaultPort = 80
		}
		a, err := parseAuthority(base.Host, defaultPort)
		if err != nil {
			return nil, refuse(http.StatusServiceUnavailable, "connection %q: base URL: %v", name, err)
		}
		var ref *refusal
		if addr, ref = s.resolve(ctx, a); ref != nil {
			return nil, ref
		}
		plainOK := s.b.hooks.PlainHTTPConnections && addr.Addr().IsLoopback()
		if base.Scheme != "https" && !(base.Scheme == "http" && plainOK) {
			return nil, refuse(http.StatusServiceUnavailable, "connection %q forwards over https only", name)
		}
	}

	out, err := http.NewRequestWithContext(ctx, method, target.String(), nil)
	if err != nil {
		return nil, refuse(http.StatusBadRequest, "request: %v", err)
	}
	out.Header = cleanHeader(header)
	for _, k := range credentialHeaders {
		out.Header.Del(k)
	}
	for k, v := range gc.conn.Headers {
		out.Header[http.CanonicalHeaderKey(k)] = slices.Clone(v)
	}
	setBody(out, bodyReader(body), int64(len(body)), s.b.limits.MaxRequestBytes)
	resp, err := s.send(out, addr, h)
	if err != nil {
		return nil, upstreamFailure(base.Hostname(), err)
	}
	// An upstream's session cookie is a credential too.
	resp.Header.Del("Set-Cookie")
	return resp, nil
}

// proxyConnection serves http://connections.internal/<name>/<path> for
// the guest. The body is read whole first (capped), so a refused call
// never streams anything upstream.
func (s *Session) proxyConnection(w http.ResponseWriter, r *http.Request, start time.Time) {
	ctx, cancel := s.requestContext(r.Context())
	defer cancel()
	ev := requestEvent(r, start)
	_, rest := splitConnectionPath(requestPath(r.URL))
	body, err := readCapped(r.Body, s.b.limits.MaxRequestBytes)
	if errors.Is(err, errRequestTooLarge) {
		s.relay(w, nil, refuse(http.StatusRequestEntityTooLarge, "request body exceeds %d bytes", s.b.limits.MaxRequestBytes), &ev)
		return
	}
	if err != nil {
		s.relay(w, nil, refuse(http.StatusBadRequest, "read request body: %v", err), &ev)
		return
	}
	resp, ref := s.connectionRequest(ctx, ev.Connection, r.Method, rest, r.URL.RawQuery, r.Header, body, &ev)
	s.relay(w, resp, ref, &ev)
}

// ConnectionRequest is the connection_request tool: req.URL is the path
// (and query) under the connection, e.g. "/v1/customers?limit=5".
func (s *Session) ConnectionRequest(ctx context.Context, name string, req Request) (*Response, error) {
	if req.Method == "" {
		req.Method = http.MethodGet
	}
	ctx, cancel := s.requestContext(ctx)
	defer cancel()
	ev := Event{Start: time.Now(), Connection: name, Method: req.Method, Path: req.URL}
	u, err := url.Parse(req.URL)
	if err != nil || u.IsAbs() || u.Host != "" || u.User != nil {
		return s.collect(nil, refuse(http.StatusBadRequest, "url must be a path under the connection, like /v1/items"), &ev)
	}
	rawPath := requestPath(u)
	if rawPath != "" && !strings.HasPrefix(rawPath, "/") {
		rawPath = "/" + rawPath
	}
	ev.Path = rawPath
	resp, ref := s.connectionRequest(ctx, name, req.Method, rawPath, u.RawQuery, req.Header, req.Body, &ev)
	return s.collect(resp, ref, &ev)
}
