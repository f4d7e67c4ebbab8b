package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/tools/ephemeral/internal/fakeapi"
)

const testKey = "eph_0123456789abcdef_secret"

// newTestClient serves api and returns a client of it that backs off for a
// millisecond and logs into the returned builder.
func newTestClient(t *testing.T, api http.Handler, opts Options) (*Client, *strings.Builder) {
	t.Helper()
	ts := httptest.NewServer(api)
	t.Cleanup(ts.Close)
	var log strings.Builder
	if opts.URL == "" {
		opts.URL = ts.URL
	}
	if opts.APIKey == "" {
		opts.APIKey = testKey
	}
	opts.Backoff = func(int) time.Duration { return time.Millisecond }
	opts.Logf = func(format string, args ...any) { fmt.Fprintf(&log, format+"\n", args...) }
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return c, &log
}

func TestNewRefusesBadSettings(t *testing.T) {
	for _, o := range []Options{
		{URL: "127.0.0.1:8080", APIKey: testKey}, // no scheme
		{URL: "ftp://host", APIKey: testKey},
		{URL: "http://user:pw@host", APIKey: testKey},
		{URL: "http://host?x=1", APIKey: testKey},
		{URL: "http://host"},
		{URL: "http://host", APIKey: "eph_0123456789abcdef_x\n"},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("%+v accepted", o)
		} else if strings.Contains(err.Error(), "eph_") {
			t.Errorf("the error names the key: %v", err)
		}
	}
}

// The API's errors come back typed, naming the field at fault; a page that
// is not the API's says so with its status and a clean excerpt.
func TestErrorsAreTheAPIsErrorShape(t *testing.T) {
	api := fakeapi.New(testKey)
	c, _ := newTestClient(t, api, Options{})
	ctx := context.Background()
	_, _, err := c.CreateRun(ctx, []byte(`{"prompt": "p"}`), "k1")
	var apiErr *Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Type != "invalid_request_error" ||
		apiErr.Code != "parameter_missing" || apiErr.Param != "max_cost_micros" {
		t.Fatalf("missing field: %#v", err)
	}
	if want := `max_cost_micros is required (HTTP 400, invalid_request_error/parameter_missing, param "max_cost_micros")`; err.Error() != want {
		t.Errorf("message %q, want %q", err.Error(), want)
	}
	if _, err := c.GetRun(ctx, "run_00000000000000000000000000000000"); !errors.As(err, &apiErr) || apiErr.Code != "run_not_found" {
		t.Errorf("unknown run: %v", err)
	}

	wrong, _ := newTestClient(t, api, Options{APIKey: "eph_0123456789abcdef_wrong"})
	_, err = wrong.Balance(ctx)
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || !strings.Contains(err.Error(), "send a valid API key") {
		t.Errorf("wrong key: %v", err)
	}
	if strings.Contains(err.Error(), "wrong") {
		t.Errorf("the error names the key: %v", err)
	}

	proxy := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusBadGateway)
		fmt.Fprint(w, "<html>\n<body>upstream   connect error</body></html>")
	})
	c, _ = newTestClient(t, proxy, Options{})
	_, err = c.Balance(ctx)
	if !errors.As(err, &apiErr) || !regexp.MustCompile(`^502 Bad Gateway from http://127\.0\.0\.1:\d+/v1/balance, not an API error: <html> <body>upstream connect error</body></html> \(HTTP 502\)$`).MatchString(err.Error()) {
		t.Errorf("a proxy's page: %v", err)
	}

	down, _ := newTestClient(t, api, Options{URL: "http://127.0.0.1:1"})
	if _, err := down.Balance(ctx); err == nil || !strings.Contains(err.Error(), "cannot reach the daemon at http://127.0.0.1:1 (is ephemeral serve running there?)") {
		t.Errorf("no daemon: %v", err)
	}
}

// After 429 a request that is safe to repeat is sent again after
// Retry-After, a bounded number of times; run creation only with its
// Idempotency-Key, the same one each time.
func TestRetriesAfter429(t *testing.T) {
	api := fakeapi.New(testKey)
	api.NewRun = func(id string, _ map[string]any) *fakeapi.Run { return fakeapi.PageRun(id) }
	c, log := newTestClient(t, api, Options{MaxRetries: 3})
	ctx := context.Background()

	api.Throttle(2, "0")
	if _, err := c.Balance(ctx); err != nil {
		t.Fatalf("after two 429s: %v", err)
	}
	if n := len(api.Requests()); n != 3 {
		t.Errorf("%d requests for one balance, want 3", n)
	}
	if !strings.Contains(log.String(), "GET /v1/balance: too many requests from this API key; retry after Retry-After seconds; retrying in") {
		t.Errorf("log:\n%s", log)
	}

	api.Throttle(1, "0")
	before := len(api.Requests())
	run, created, err := c.CreateRun(ctx, []byte(`{"prompt": "p", "max_cost_micros": 40000}`), "key-1")
	if err != nil || !created || run.Status != Queued {
		t.Fatalf("create after a 429: %+v %v %v", run, created, err)
	}
	reqs := api.Requests()[before:]
	if len(reqs) != 2 || reqs[0].IdempotencyKey != "key-1" || reqs[1].IdempotencyKey != "key-1" {
		t.Errorf("create requests %+v", reqs)
	}
	// The same key again is the same run, not a second one.
	again, created, err := c.CreateRun(ctx, []byte(`{"prompt": "p", "max_cost_micros": 40000}`), "key-1")
	if err != nil || created || again.ID != run.ID {
		t.Errorf("retry with the key: %s %v %v, want %s", again.ID, created, err, run.ID)
	}

	api.Throttle(1, "0")
	before = len(api.Requests())
	var apiErr *Error
	if _, _, err := c.CreateRun(ctx, []byte(`{"prompt": "p", "max_cost_micros": 40000}`), ""); !errors.As(err, &apiErr) || apiErr.StatusCode != 429 {
		t.Errorf("create without a key after a 429: %v", err)
	}
	if n := len(api.Requests()) - before; n != 1 {
		t.Errorf("a create without Idempotency-Key was sent %d times", n)
	}

	api.Throttle(10, "0")
	before = len(api.Requests())
	if _, err := c.Balance(ctx); !errors.As(err, &apiErr) || apiErr.StatusCode != 429 {
		t.Errorf("throttled throughout: %v", err)
	}
	if n := len(api.Requests()) - before; n != 4 {
		t.Errorf("%d tries, want 1 and 3 retries", n)
	}

	// A wait longer than MaxRetryWait is the caller's to decide on.
	api.Throttle(1, "3600")
	before = len(api.Requests())
	if _, err := c.Balance(ctx); !errors.As(err, &apiErr) || apiErr.RetryAfter != time.Hour || !strings.Contains(err.Error(), "retry after 1h0m0s") {
		t.Errorf("Retry-After an hour: %v", err)
	}
	if n := len(api.Requests()) - before; n != 1 {
		t.Errorf("waited for an hour's Retry-After: %d tries", n)
	}
	api.Throttle(0, "")

	for _, r := range api.Requests() {
		if r.Authorization != "Bearer "+testKey || !strings.HasPrefix(r.Agent, "ephemeral") {
			t.Errorf("request %+v", r)
		}
	}
	if strings.Contains(log.String(), "secret") {
		t.Errorf("the log shows the key:\n%s", log)
	}
}

// Pages of runs take the status filter, size and cursor, and say what
// comes next; a run id is one path segment whatever it holds.
func TestListRunsAndOthers(t *testing.T) {
	api := fakeapi.New(testKey)
	for i := 1; i <= 3; i++ {
		api.AddRun(fakeapi.PageRun(fmt.Sprintf("run_%032x", i)))
	}
	api.AddRun(fakeapi.Ended(fakeapi.PageRun(fmt.Sprintf("run_%032x", 4)), Failed, "model_error", "the model broke"))
	c, _ := newTestClient(t, api, Options{})
	ctx := context.Background()
	page, raw, err := c.ListRuns(ctx, ListParams{Status: Succeeded, Limit: 2})
	if err != nil || len(page.Data) != 2 || page.Data[0].ID != fmt.Sprintf("run_%032x", 3) || !page.HasMore ||
		page.NextCursor == nil || *page.NextCursor != fmt.Sprintf("run_%032x", 2) || !strings.Contains(string(raw), `"object":"list"`) {
		t.Fatalf("first page %+v %v", page, err)
	}
	if q := api.Requests()[0].Query; q != "limit=2&status=succeeded" {
		t.Errorf("query %q", q)
	}
	page, _, err = c.ListRuns(ctx, ListParams{Status: Succeeded, Limit: 2, StartingAfter: *page.NextCursor})
	if err != nil || len(page.Data) != 1 || page.HasMore || page.NextCursor != nil {
		t.Errorf("last page %+v %v", page, err)
	}
	run, err := c.GetRun(ctx, fmt.Sprintf("run_%032x", 4))
	if err != nil || run.Status != Failed || run.Error == nil || run.Error.Code != "model_error" || !strings.Contains(string(run.Raw), `"model_error"`) {
		t.Errorf("failed run %+v %v", run, err)
	}
	if _, err := c.GetRun(ctx, "../balance"); err == nil {
		t.Error("a run id with a slash reached another endpoint")
	}
	if last := api.Requests()[len(api.Requests())-1]; last.Path != "/v1/runs/../balance" {
		t.Errorf("path %q", last.Path)
	}
	b, err := c.Balance(ctx)
	if err != nil || b.Available != 4996470 || b.Credited != 5000000 {
		t.Errorf("balance %+v %v", b, err)
	}
	events, err := c.Events(ctx, fmt.Sprintf("run_%032x", 1), 0)
	if err != nil || len(events.Data) != 10 || events.RunStatus != Succeeded || events.Data[3].Rev != 6 {
		t.Errorf("events %+v %v", events, err)
	}
	if rec, err := c.Recording(ctx, fmt.Sprintf("run_%032x", 1)); err != nil || !strings.Contains(string(rec), `"version"`) {
		t.Errorf("recording %s %v", rec, err)
	}
	if deleted, err := c.DeleteRun(ctx, fmt.Sprintf("run_%032x", 1)); err != nil || deleted.PurgedAt == nil {
		t.Errorf("delete %+v %v", deleted, err)
	}
}

func TestIdempotencyKeysAreUUIDs(t *testing.T) {
	a, b := NewIdempotencyKey(), NewIdempotencyKey()
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	if !uuid.MatchString(a) || !uuid.MatchString(b) || a == b {
		t.Errorf("%s %s", a, b)
	}
}

// A daemon that does not answer is given RequestTimeout, then named.
func TestRequestTimeout(t *testing.T) {
	hang := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	c, _ := newTestClient(t, hang, Options{RequestTimeout: 50 * time.Millisecond})
	_, err := c.Balance(context.Background())
	if err == nil || !regexp.MustCompile(`^GET /v1/balance: no answer from http://127\.0\.0\.1:\d+ within 50ms$`).MatchString(err.Error()) {
		t.Errorf("%v", err)
	}
}
