// Package client talks to an Ephemeral daemon's runs API (/v1) the way a
// program should: a typed method per endpoint, the API's JSON errors as
// *Error, bounded retries after 429 for requests that are safe to repeat,
// timeouts on every request, and an event-stream follower that resumes
// with Last-Event-ID after a dropped connection (events.go). It knows the
// API only by its wire format, not by the daemon's packages.
package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Options configure a Client. Only URL and APIKey are required.
type Options struct {
	URL    string // the daemon's base URL, e.g. http://127.0.0.1:8080
	APIKey string // a member's key, eph_...; sent as Authorization: Bearer, never logged

	// RequestTimeout bounds each request but event streams, body included
	// (default 30 s), and the wait for an event stream's response headers.
	RequestTimeout time.Duration
	// MaxRetries is how often a request that is safe to repeat is sent
	// again after 429 Too Many Requests (default 3; negative: never).
	// MaxRetryWait is the longest Retry-After honoured (default 30 s): a
	// longer one is returned as the error, with its RetryAfter.
	MaxRetries   int
	MaxRetryWait time.Duration
	// StreamIdle is how long an event stream may stay silent before it
	// counts as dropped (default 45 s: three of the daemon's 15 s
	// keep-alives).
	StreamIdle time.Duration
	// Reconnects is how many reconnections in a row an event stream may
	// fail, none of them delivering an event, before FollowEvents gives up
	// (default 8).
	Reconnects int
	// Backoff is the wait before reconnection attempt n (1, 2, ...);
	// default 250 ms doubling up to 8 s.
	Backoff func(n int) time.Duration
	// Logf, when set, hears what the caller cannot see: each request and
	// its Idempotency-Key, retries and reconnections. Never the key.
	Logf func(format string, args ...any)
	// UserAgent is sent with every request.
	UserAgent string
}

// Client calls one daemon with one API key. It is safe for concurrent use.
type Client struct {
	base *url.URL
	key  string
	http *http.Client
	opts Options
}

// New checks opts and returns a client.
func New(opts Options) (*Client, error) {
	base, err := url.Parse(strings.TrimRight(opts.URL, "/"))
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" || base.RawQuery != "" || base.Fragment != "" {
		return nil, fmt.Errorf("the daemon's URL must be http(s)://host[:port][/path], not %q", opts.URL)
	}
	if base.User != nil {
		return nil, fmt.Errorf("the daemon's URL must not carry credentials; the API key goes in its own setting")
	}
	if opts.APIKey == "" {
		return nil, errors.New("no API key")
	}
	for _, r := range opts.APIKey {
		if r <= ' ' || r == 0x7f || r >= utf8.RuneSelf {
			return nil, errors.New("the API key holds a space, control or non-ASCII character; copy it again")
		}
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = 30 * time.Second
	}
	if opts.MaxRetries < 0 {
		opts.MaxRetries = 0
	} else if opts.MaxRetries == 0 {
		opts.MaxRetries = 3
	}
	if opts.MaxRetryWait <= 0 {
		opts.MaxRetryWait = 30 * time.Second
	}
	if opts.StreamIdle <= 0 {
		opts.StreamIdle = 45 * time.Second
	}
	if opts.Reconnects <= 0 {
		opts.Reconnects = 8
	}
	if opts.Backoff == nil {
		opts.Backoff = defaultBackoff
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	if opts.UserAgent == "" {
		opts.UserAgent = "ephemeral-client"
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	transport.TLSHandshakeTimeout = 10 * time.Second
	return &Client{base: base, key: opts.APIKey, http: &http.Client{Transport: transport}, opts: opts}, nil
}

// defaultBackoff waits 250 ms, 500 ms, ... up to 8 s.
func defaultBackoff(n int) time.Duration {
	return 250 * time.Millisecond << min(n-1, 5)
}

// NewIdempotencyKey returns a random UUID (version 4) for Idempotency-Key.
func NewIdempotencyKey() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand panics rather than return an error)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// Error is an error the API answered with: {"error": {"type", "code",
// "message", "param"}} and the HTTP status, or a response that was not the
// API's (a proxy's page), with its status and the start of its body as the
// message.
type Error struct {
	StatusCode int
	Type       string // e.g. invalid_request_error, authentication_error, rate_limit_error
	Code       string // e.g. parameter_missing, invalid_api_key, rate_limited
	Message    string
	Param      string        // the request field or header at fault, if any
	RetryAfter time.Duration // from Retry-After, when the answer had one
}

func (e *Error) Error() string {
	var details []string
	details = append(details, fmt.Sprintf("HTTP %d", e.StatusCode))
	switch {
	case e.Type != "" && e.Code != "":
		details = append(details, e.Type+"/"+e.Code)
	case e.Type != "" || e.Code != "":
		details = append(details, e.Type+e.Code)
	}
	if e.Param != "" {
		details = append(details, fmt.Sprintf("param %q", e.Param))
	}
	if e.RetryAfter > 0 {
		details = append(details, "retry after "+e.RetryAfter.String())
	}
	return e.Message + " (" + strings.Join(details, ", ") + ")"
}

// Largest bodies read: an error, and any other answer (a recording is
// capped at 8 MiB by default, a page of runs is far smaller).
const (
	maxErrorBytes = 64 << 10
	maxBodyBytes  = 64 << 20
)

// request is one call to the API.
type request struct {
	method string
	path   string // escaped, from /v1
	query  url.Values
	body   []byte
	header http.Header
	// repeatable requests are sent again after a 429: reads, cancel and
	// delete (idempotent), and run creation with an Idempotency-Key.
	repeatable bool
}

// do sends req and returns the response's status and body, or an *Error
// for a status of 400 or more.
func (c *Client) do(ctx context.Context, req request) (int, []byte, error) {
	for attempt := 0; ; attempt++ {
		status, body, err := c.once(ctx, req)
		var apiErr *Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || !req.repeatable || attempt >= c.opts.MaxRetries {
			return status, body, err
		}
		wait := apiErr.RetryAfter
		if wait <= 0 {
			wait = c.opts.Backoff(attempt + 1)
		}
		if wait > c.opts.MaxRetryWait {
			return status, body, err
		}
		c.opts.Logf("%s %s: %s; retrying in %s", req.method, req.path, apiErr.Message, wait)
		if err := sleep(ctx, wait); err != nil {
			return 0, nil, err
		}
	}
}

func (c *Client) once(ctx context.Context, req request) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.RequestTimeout)
	defer cancel()
	resp, err := c.send(ctx, req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		return resp.StatusCode, nil, readError(resp)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBodyBytes+1))
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: read the answer: %w", req.method, req.path, err)
	}
	if len(body) > maxBodyBytes {
		return 0, nil, fmt.Errorf("%s %s: the answer exceeds %d bytes", req.method, req.path, maxBodyBytes)
	}
	return resp.StatusCode, body, nil
}

// send sends req with the key and returns the response, whatever its status.
func (c *Client) send(ctx context.Context, req request) (*http.Response, error) {
	// req.path is escaped (a run id is one segment whatever it holds):
	// RawPath keeps it so.
	path, err := url.PathUnescape(req.path)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", req.method, req.path, err)
	}
	u := *c.base
	u.Path, u.RawPath = strings.TrimRight(u.Path, "/")+path, strings.TrimRight(u.EscapedPath(), "/")+req.path
	u.RawQuery = req.query.Encode()
	var body io.Reader
	if req.body != nil {
		body = bytes.NewReader(req.body)
	}
	hr, err := http.NewRequestWithContext(ctx, req.method, u.String(), body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", req.method, req.path, err)
	}
	for k, v := range req.header {
		hr.Header[k] = v
	}
	hr.Header.Set("Authorization", "Bearer "+c.key)
	hr.Header.Set("User-Agent", c.opts.UserAgent)
	if req.body != nil {
		hr.Header.Set("Content-Type", "application/json")
	}
	if hr.Header.Get("Accept") == "" {
		hr.Header.Set("Accept", "application/json")
	}
	if key := hr.Header.Get("Idempotency-Key"); key != "" {
		c.opts.Logf("%s %s (Idempotency-Key %s)", req.method, u.Redacted(), key)
	} else {
		c.opts.Logf("%s %s", req.method, u.Redacted())
	}
	resp, err := c.http.Do(hr)
	if err != nil {
		if errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
			return nil, fmt.Errorf("%s %s: no answer from %s within %s", req.method, req.path, c.base.Redacted(), c.opts.RequestTimeout)
		}
		if ctx.Err() != nil {
			return nil, context.Cause(ctx) // the caller gave up
		}
		return nil, fmt.Errorf("%s %s: cannot reach the daemon at %s (is ephemeral serve running there?): %w",
			req.method, req.path, c.base.Redacted(), unwrapURLError(err))
	}
	return resp, nil
}

// unwrapURLError drops url.Error's repetition of the method and URL.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// readError turns an error response into an *Error.
func readError(resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBytes))
	e := &Error{StatusCode: resp.StatusCode, RetryAfter: retryAfter(resp.Header.Get("Retry-After"))}
	var body struct {
		Error *struct {
			Type    string `json:"type"`
			Code    string `json:"code"`
			Message string `json:"message"`
			Param   string `json:"param"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &body) == nil && body.Error != nil && body.Error.Message != "" {
		e.Type, e.Code, e.Message, e.Param = body.Error.Type, body.Error.Code, body.Error.Message, body.Error.Param
		return e
	}
	// Not the API's answer: a proxy's or a load balancer's page.
	text := strings.Join(strings.Fields(string(raw)), " ")
	if len(text) > 200 {
		text = strings.ToValidUTF8(text[:200], "") + "…"
	}
	e.Message = fmt.Sprintf("%s from %s, not an API error", resp.Status, resp.Request.URL.Redacted())
	if text != "" {
		e.Message += ": " + text
	}
	return e
}

// retryAfter reads Retry-After in seconds (the API's form) or as an HTTP
// date.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
