package broker

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Whatever the broker refuses is on the run's timeline, also what
// net/http rejects before the broker's handler runs, with the status the
// guest saw.
func TestEveryRefusalIsRecorded(t *testing.T) {
	up := newUpstream(t, false, hello)
	cfg := webConfig(newTestResolver("site.test", "127.0.0.1"))
	cfg.Limits.MaxHeaderBytes = 4096
	p := startProxy(t, cfg, Grants{Web: true})
	target := "http://site.test:" + up.port() + "/"
	for _, c := range []struct {
		name    string
		request string
		status  int
		event   string // the event's message starts with this
	}{
		{"origin-form", "GET / HTTP/1.1\r\nHost: site.test\r\n\r\n",
			400, "GET site.test → 400 refused: send requests through the proxy in absolute form"},
		{"OPTIONS *", "OPTIONS * HTTP/1.1\r\nHost: site.test\r\n\r\n",
			400, "OPTIONS site.test → 400 refused: send requests through the proxy in absolute form"},
		{"double Content-Length", "POST " + target + " HTTP/1.1\r\nHost: site.test\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
			400, "POST → 400 refused: malformed request: Bad Request"},
		{"chunked, identity", "POST " + target + " HTTP/1.1\r\nHost: site.test\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
			501, "POST → 501 refused: malformed request: Unsupported transfer encoding"},
		{"malformed request line", "GET\r\n\r\n",
			400, "request → 400 refused: malformed request: Bad Request"},
		{"bad protocol", "GET " + target + " HTTP/9.9\r\nHost: site.test\r\n\r\n",
			505, "GET → 505 refused: malformed request: HTTP Version Not Supported"},
		{"missing Host", "GET " + target + " HTTP/1.1\r\n\r\n",
			400, "GET → 400 refused: malformed request: Bad Request: missing required Host header"},
		{"oversized head", "GET " + target + " HTTP/1.1\r\nHost: site.test\r\nX-Big: " + strings.Repeat("h", 16<<10) + "\r\n\r\n",
			431, "GET → 431 refused: request head exceeds 4096 bytes"},
		{"unsupported Expect", "GET " + target + " HTTP/1.1\r\nHost: site.test\r\nExpect: the-unexpected\r\n\r\n",
			417, "GET → 417 refused: unsupported Expect header"},
	} {
		before, _ := p.obs.snapshot()
		resp, body := p.raw(t, c.request)
		if resp.StatusCode != c.status {
			t.Errorf("%s: %d %q, want %d", c.name, resp.StatusCode, body, c.status)
		}
		// The broker records a refusal before it answers.
		events, _ := p.obs.snapshot()
		if len(events) != len(before)+1 {
			t.Errorf("%s: %d events, want one", c.name, len(events)-len(before))
			continue
		}
		if ev := events[len(before)]; ev.Status != resp.StatusCode || !strings.HasPrefix(ev.Message(), c.event) {
			t.Errorf("%s: event %q (status %d), want %q", c.name, ev.Message(), ev.Status, c.event)
		}
	}
	if reqs, _ := up.seen(); len(reqs) != 0 {
		t.Errorf("upstream reached %d times", len(reqs))
	}
	if _, charges := p.obs.snapshot(); charges != 0 {
		t.Errorf("%d refusals charged", charges)
	}

	// A request that reaches the handler once the run has ended.
	if err := p.session.Close(); err != nil {
		t.Fatal(err)
	}
	before, _ := p.obs.snapshot()
	rec := httptest.NewRecorder()
	p.session.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("after Close: %d", rec.Code)
	}
	if events, _ := p.obs.snapshot(); len(events) != len(before)+1 {
		t.Errorf("after Close: %d events, want one", len(events)-len(before))
	} else if ev := events[len(before)]; ev.Message() != "GET site.test:"+up.port()+" → 503 refused: the run has ended" {
		t.Errorf("after Close: event %q", ev.Message())
	}
}

// One request per guest connection: a second one pipelined behind the
// first is never read, so it cannot be framed differently by the broker
// and an upstream.
func TestOneRequestPerGuestConnection(t *testing.T) {
	up := newUpstream(t, false, hello)
	p := startProxy(t, webConfig(newTestResolver("site.test", "127.0.0.1")), Grants{Web: true})
	target := "http://site.test:" + up.port() + "/"
	resp, body := p.raw(t, "GET "+target+"a HTTP/1.1\r\nHost: site.test\r\n\r\nGET "+target+"b HTTP/1.1\r\nHost: site.test\r\n\r\n")
	if resp.StatusCode != 200 || body != "hello from upstream" || !resp.Close {
		t.Errorf("first request: %d %q, close %v", resp.StatusCode, body, resp.Close)
	}
	if reqs, _ := up.seen(); len(reqs) != 1 || reqs[0].URL.Path != "/a" {
		t.Errorf("upstream saw %d requests", len(reqs))
	}
}
