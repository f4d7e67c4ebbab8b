package httpcall

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/model"
)

// scripted answers the n-th request with answers[n] (the last one repeats).
func scripted(t *testing.T, answers ...func(w http.ResponseWriter)) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := int(calls.Add(1)) - 1
		answers[min(n, len(answers)-1)](w)
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

func status(code int, retryAfter, body string) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.WriteHeader(code)
		_, _ = w.Write([]byte(body))
	}
}

// fastRetries keeps backoff short so tests do not wait.
func fastRetries() Client {
	return Client{Provider: "test", BaseDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond}
}

// waits collects the retries a hook was asked about.
type waits struct {
	mu      sync.Mutex
	retries []model.Retry
}

func (w *waits) hook(_ context.Context, r model.Retry) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.retries = append(w.retries, r)
	return nil
}

func TestRetriesServerErrorsThenSucceeds(t *testing.T) {
	srv, calls := scripted(t,
		status(500, "", `{"error":{"type":"server_error","message":"boom"}}`),
		status(529, "", `{"type":"error","error":{"type":"overloaded_error","message":"busy"}}`),
		status(200, "", `{"ok":true}`))
	c := fastRetries()
	var w waits
	body, err := c.PostJSON(context.Background(), srv.URL, nil, []byte(`{}`), w.hook)
	if err != nil {
		t.Fatalf("PostJSON: %v", err)
	}
	if string(body) != `{"ok":true}` || calls.Load() != 3 {
		t.Errorf("got body %q after %d calls, want the success after 3", body, calls.Load())
	}
	if len(w.retries) != 2 || w.retries[0].Attempt != 2 || w.retries[1].Attempt != 3 {
		t.Fatalf("hook saw %+v, want attempts 2 and 3", w.retries)
	}
	var apiErr *model.APIError
	if !errors.As(w.retries[1].Err, &apiErr) || apiErr.StatusCode != 529 || apiErr.Type != "overloaded_error" {
		t.Errorf("hook's cause = %v, want the 529 overloaded error", w.retries[1].Err)
	}
}

func TestHonoursRetryAfter(t *testing.T) {
	srv, calls := scripted(t,
		status(429, "1", `{"error":{"type":"rate_limit_error","message":"slow down"}}`),
		status(200, "", `{}`))
	c := fastRetries()
	var w waits
	if _, err := c.PostJSON(context.Background(), srv.URL, nil, []byte(`{}`), w.hook); err != nil {
		t.Fatalf("PostJSON: %v", err)
	}
	if calls.Load() != 2 {
		t.Errorf("%d calls, want 2", calls.Load())
	}
	if len(w.retries) != 1 || w.retries[0].Wait != time.Second {
		t.Errorf("hook saw %+v, want one retry waiting the server's 1s", w.retries)
	}
}

func TestHookRefusesRetry(t *testing.T) {
	srv, calls := scripted(t, status(503, "", "down"))
	c := fastRetries()
	errBudget := errors.New("budget cannot pay for another attempt")
	_, err := c.PostJSON(context.Background(), srv.URL, nil, nil, func(context.Context, model.Retry) error { return errBudget })
	if !errors.Is(err, errBudget) {
		t.Fatalf("err = %v, want the hook's refusal", err)
	}
	var apiErr *model.APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 503 {
		t.Errorf("err = %v, want it to keep the 503 as the last failure", err)
	}
	if calls.Load() != 1 {
		t.Errorf("%d calls, want 1", calls.Load())
	}
}

func TestClientErrorsAreNotRetried(t *testing.T) {
	for _, code := range []int{400, 401, 403, 404, 422} {
		srv, calls := scripted(t, status(code, "", `{"error":{"type":"invalid_request_error","message":"bad"}}`))
		c := fastRetries()
		_, err := c.PostJSON(context.Background(), srv.URL, nil, nil, nil)
		var apiErr *model.APIError
		if !errors.As(err, &apiErr) || apiErr.StatusCode != code || apiErr.Message != "bad" {
			t.Errorf("HTTP %d: err = %v, want an APIError with the message", code, err)
		}
		if calls.Load() != 1 {
			t.Errorf("HTTP %d: %d calls, want 1", code, calls.Load())
		}
	}
}

func TestGivesUpAfterMaxAttempts(t *testing.T) {
	srv, calls := scripted(t, status(500, "", "boom"))
	c := fastRetries()
	c.MaxAttempts = 3
	_, err := c.PostJSON(context.Background(), srv.URL, nil, nil, nil)
	var apiErr *model.APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 500 {
		t.Errorf("err = %v, want the last 500", err)
	}
	if calls.Load() != 3 {
		t.Errorf("%d calls, want 3", calls.Load())
	}
}

func TestRetryAfterPastDeadlineStopsAtOnce(t *testing.T) {
	srv, calls := scripted(t, status(429, "30", "slow down"))
	c := fastRetries()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.PostJSON(ctx, srv.URL, nil, nil, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want DeadlineExceeded", err)
	}
	if ctx.Err() != nil {
		t.Error("the client waited for the deadline instead of giving up at once")
	}
	if calls.Load() != 1 {
		t.Errorf("%d calls, want 1", calls.Load())
	}
}

func TestContextEndsWaitForRetry(t *testing.T) {
	srv, calls := scripted(t, status(500, "", "boom"))
	c := Client{Provider: "test", BaseDelay: time.Hour, MaxDelay: time.Hour}
	ctx, cancel := context.WithCancel(context.Background())
	hook := func(context.Context, model.Retry) error { cancel(); return nil }
	_, err := c.PostJSON(ctx, srv.URL, nil, nil, hook)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want Canceled", err)
	}
	if calls.Load() != 1 {
		t.Errorf("%d calls, want 1", calls.Load())
	}
}

func TestRetriesDroppedConnection(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close() // the answer never comes
			}
			return
		}
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	c := fastRetries()
	if _, err := c.PostJSON(context.Background(), srv.URL, nil, []byte(`{}`), nil); err != nil {
		t.Fatalf("PostJSON: %v", err)
	}
	if calls.Load() != 2 {
		t.Errorf("%d calls, want 2", calls.Load())
	}
}

func TestCapsResponseBody(t *testing.T) {
	srv, calls := scripted(t, status(200, "", strings.Repeat("x", 1025)))
	c := fastRetries()
	c.MaxResponseBytes = 1024
	_, err := c.PostJSON(context.Background(), srv.URL, nil, nil, nil)
	if !errors.Is(err, model.ErrResponseTooLarge) {
		t.Errorf("err = %v, want ErrResponseTooLarge", err)
	}
	if calls.Load() != 1 {
		t.Errorf("%d calls, want 1 (a too large answer is not retried)", calls.Load())
	}
	srv, _ = scripted(t, status(200, "", strings.Repeat("x", 1024)))
	if body, err := c.PostJSON(context.Background(), srv.URL, nil, nil, nil); err != nil || len(body) != 1024 {
		t.Errorf("body at the cap: %d bytes, %v", len(body), err)
	}
}

func TestSendsHeadersAndBody(t *testing.T) {
	var got *http.Request
	var gotBody []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r
		gotBody = make([]byte, r.ContentLength)
		_, _ = r.Body.Read(gotBody)
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	c := fastRetries()
	h := http.Header{}
	h.Set("X-Api-Key", "k")
	if _, err := c.PostJSON(context.Background(), srv.URL+"/v1/x", h, []byte(`{"a":1}`), nil); err != nil {
		t.Fatal(err)
	}
	if got.Method != http.MethodPost || got.URL.Path != "/v1/x" || got.Header.Get("X-Api-Key") != "k" ||
		got.Header.Get("Content-Type") != "application/json" || string(gotBody) != `{"a":1}` {
		t.Errorf("server got %s %s %v %q", got.Method, got.URL.Path, got.Header, gotBody)
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 30, 4, 0, 0, 0, time.UTC)
	tests := []struct {
		header map[string]string
		want   time.Duration
	}{
		{nil, 0},
		{map[string]string{"Retry-After": "3"}, 3 * time.Second},
		{map[string]string{"Retry-After": " 0 "}, 0},
		{map[string]string{"Retry-After": "-5"}, 0},
		{map[string]string{"Retry-After": "99999999999999999"}, 24 * time.Hour},
		{map[string]string{"Retry-After": "Mon, 30 Nov 2026 04:00:07 GMT"}, 7 * time.Second},
		{map[string]string{"Retry-After": "Mon, 30 Nov 2026 03:00:00 GMT"}, 0},
		{map[string]string{"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}, 24 * time.Hour},
		{map[string]string{"Retry-After-Ms": "1e300"}, 24 * time.Hour},
		{map[string]string{"Retry-After-Ms": "NaN", "Retry-After": "2"}, 2 * time.Second},
		{map[string]string{"Retry-After": "soon"}, 0},
		{map[string]string{"Retry-After-Ms": "250", "Retry-After": "1"}, 250 * time.Millisecond},
		{map[string]string{"Retry-After-Ms": "nope", "Retry-After": "1"}, time.Second},
	}
	for _, tt := range tests {
		h := http.Header{}
		for k, v := range tt.header {
			h.Set(k, v)
		}
		if got := ParseRetryAfter(h, now); got != tt.want {
			t.Errorf("ParseRetryAfter(%v) = %v, want %v", tt.header, got, tt.want)
		}
	}
}

func FuzzParseRetryAfter(f *testing.F) {
	for _, v := range []string{"3", "-1", "Mon, 30 Nov 2026 04:00:07 GMT", "Fri, 31 Dec 9999 23:59:59 GMT", "1e300", "NaN", "Inf"} {
		f.Add(v, v)
	}
	now := time.Date(2026, 11, 30, 4, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, retryAfter, retryAfterMs string) {
		h := http.Header{}
		h.Set("Retry-After", retryAfter)
		h.Set("Retry-After-Ms", retryAfterMs)
		if d := ParseRetryAfter(h, now); d < 0 || d > 24*time.Hour {
			t.Fatalf("Retry-After %q / %q gave %v", retryAfter, retryAfterMs, d)
		}
	})
}

var errorBodies = []struct {
	body, wantType, wantMessage string
}{
	{`{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`, "requests", "Rate limit reached"},
	{`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, "overloaded_error", "Overloaded"},
	{`{"error":"model not found"}`, "", "model not found"},
	{"<html>\n<body>Bad Gateway</body></html>", "", "<html> <body>Bad Gateway</body></html>"},
	{"", "", ""},
	{"\x00\x1b[31mred\xff", "", "[31mred\uFFFD"},
}

func TestParseErrorBody(t *testing.T) {
	for _, tt := range errorBodies {
		gotType, gotMsg := ParseErrorBody([]byte(tt.body))
		if gotType != tt.wantType || gotMsg != tt.wantMessage {
			t.Errorf("ParseErrorBody(%q) = %q, %q; want %q, %q", tt.body, gotType, gotMsg, tt.wantType, tt.wantMessage)
		}
	}
	long := strings.Repeat("é", 1000)
	if _, msg := ParseErrorBody([]byte(long)); len([]rune(msg)) > maxErrorMessageRunes+1 {
		t.Errorf("message of %d runes not capped", len([]rune(msg)))
	}
}

func FuzzParseErrorBody(f *testing.F) {
	for _, tt := range errorBodies {
		f.Add([]byte(tt.body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		errType, msg := ParseErrorBody(body)
		for _, s := range []string{errType, msg} {
			if len([]rune(s)) > maxErrorMessageRunes+1 {
				t.Fatalf("%d runes, over the cap", len([]rune(s)))
			}
			if strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
				t.Fatalf("control character in %q", s)
			}
		}
	})
}
