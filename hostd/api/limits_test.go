package api

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/store/storetest"
)

// slow is a rate that does not refill within a test: only the burst counts.
func slow(burst int) Rate { return Rate{PerSecond: 0.001, Burst: burst} }

func TestRunCreationsAreLimitedPerKey(t *testing.T) {
	h := newHarness(t, harnessConfig{limits: Limits{KeyRunCreations: slow(2)}})
	h.createRun(productPageRequest)
	h.createRun(productPageRequest)
	resp := h.do("POST", "/v1/runs", productPageRequest)
	if resp.status != http.StatusTooManyRequests || resp.header.Get("Retry-After") != "1000" {
		t.Fatalf("third creation at once: %d, Retry-After %q: %s", resp.status, resp.header.Get("Retry-After"), resp.body)
	}
	if e := resp.apiError(t); e.Type != rateLimit || e.Code != "rate_limited" || e.Message == "" {
		t.Fatalf("error %+v", e)
	}
	// Reads have a share of their own, and so has every other key.
	if resp := h.do("GET", "/v1/balance", ""); resp.status != http.StatusOK {
		t.Fatalf("read after the creations: %d", resp.status)
	}
	_, other := h.newOrg("other", 1_000_000)
	if resp := h.do("POST", "/v1/runs", productPageRequest, "Authorization", "Bearer "+other); resp.status != http.StatusCreated {
		t.Fatalf("another key's creation: %d %s", resp.status, resp.body)
	}
	var list struct{ Data []runJSON }
	h.do("GET", "/v1/runs", "").decode(t, &list)
	if len(list.Data) != 2 {
		t.Fatalf("%d runs of the limited key, want 2", len(list.Data))
	}
}

func TestReadsAreLimitedPerKey(t *testing.T) {
	h := newHarness(t, harnessConfig{limits: Limits{KeyReads: slow(3)}})
	for range 3 {
		if resp := h.do("GET", "/v1/runs", ""); resp.status != http.StatusOK {
			t.Fatalf("read within the burst: %d", resp.status)
		}
	}
	if resp := h.do("GET", "/v1/balance", ""); resp.status != http.StatusTooManyRequests || resp.header.Get("Retry-After") == "" {
		t.Fatalf("read past the burst: %d %v", resp.status, resp.header)
	}
}

// Requests are counted against their address before the key is looked up:
// a flood of bad keys gets 429s once the address's share is spent, and so
// does a good key from the same address.
func TestAddressIsLimitedBeforeTheKeyIsLookedUp(t *testing.T) {
	h := newHarness(t, harnessConfig{limits: Limits{AddressReads: slow(3)}})
	for range 3 {
		if resp := h.do("GET", "/v1/balance", "", "Authorization", "Bearer eph_0123456789abcdef_guess"); resp.status != http.StatusUnauthorized {
			t.Fatalf("bad key within the address's share: %d", resp.status)
		}
	}
	for _, auth := range []string{"Bearer eph_0123456789abcdef_guess", "Bearer " + h.key} {
		resp := h.do("GET", "/v1/balance", "", "Authorization", auth)
		if resp.status != http.StatusTooManyRequests || resp.apiError(t).Code != "rate_limited" {
			t.Fatalf("%.20s past the address's share: %d %s", auth, resp.status, resp.body)
		}
	}
	if resp := h.do("GET", "/healthz", ""); resp.status != http.StatusTooManyRequests {
		t.Fatalf("healthz past the address's share: %d", resp.status)
	}
}

// openStream opens the run's event stream with key; the caller closes it.
func openStream(t *testing.T, h *harness, runID, key string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("GET", h.url+"/v1/runs/"+runID+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Accept", "text/event-stream")
	// The timeout only turns a stream that never ends into a failure.
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestOpenStreamsAreLimitedPerKeyAndAddress(t *testing.T) {
	steps := make(chan string)
	h := newHarness(t, harnessConfig{executor: steppedExecutor(steps), limits: Limits{KeyStreams: 1, AddressStreams: 2}})
	_, keyB := h.newOrg("b", 1_000_000)
	_, keyC := h.newOrg("c", 1_000_000)
	runOf := func(key string) string {
		var run runJSON
		h.do("POST", "/v1/runs", productPageRequest, "Authorization", "Bearer "+key).decode(t, &run)
		return run.ID
	}
	runA, runB, runC := runOf(h.key), runOf(keyB), runOf(keyC)
	refused := func(runID, key string) {
		t.Helper()
		resp := openStream(t, h, runID, key)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		r := response{status: resp.StatusCode, header: resp.Header, body: body}
		if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" || r.apiError(t).Code != "too_many_streams" {
			t.Fatalf("stream past the cap: %d %v %s", r.status, r.header, body)
		}
	}
	first := openStream(t, h, runA, h.key)
	defer first.Body.Close()
	if first.StatusCode != http.StatusOK {
		t.Fatalf("first stream: %d", first.StatusCode)
	}
	refused(runA, h.key) // the key's cap
	second := openStream(t, h, runB, keyB)
	defer second.Body.Close()
	if second.StatusCode != http.StatusOK {
		t.Fatalf("another key's stream: %d", second.StatusCode)
	}
	refused(runC, keyC) // the address's cap, with a key that has none open

	// Streams that ended give their slots back.
	close(steps) // every run ends
	io.Copy(io.Discard, first.Body)
	io.Copy(io.Discard, second.Body)
	for runID, key := range map[string]string{runA: h.key, runC: keyC} {
		resp := openStream(t, h, runID, key)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stream after the others ended: %d", resp.StatusCode)
		}
	}
}

// An event stream opened with a key ends once the key is revoked, also
// when another process (ephemeral admin key revoke) revokes it.
func TestRevokedKeyEndsItsEventStreams(t *testing.T) {
	steps := make(chan string)
	defer close(steps)
	h := newHarness(t, harnessConfig{executor: steppedExecutor(steps), credentialRecheck: 20 * time.Millisecond})
	run := h.createRun(productPageRequest)
	resp := openStream(t, h, run.ID, h.key)
	defer resp.Body.Close()
	stream := newSSEReader(resp)
	if e := stream.next(t); e.event != "timeline" {
		t.Fatalf("first event %+v", e)
	}

	admin := storetest.Reopen(t, h.store, h.dbPath)
	id, _ := parseKeyID(t, h.key)
	if err := admin.RevokeKey(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	e := stream.next(t)
	if e.event != "revoked" {
		t.Fatalf("event after the revocation %+v, want revoked", e)
	}
	var body struct{ Error apiError }
	if err := jsonUnmarshal([]byte(e.data), &body); err != nil || body.Error.Code != "api_key_revoked" || body.Error.Type != authentication {
		t.Fatalf("revoked event data %s: %v", e.data, err)
	}
	if rest, err := io.ReadAll(resp.Body); err != nil || len(rest) != 0 {
		t.Fatalf("the stream goes on after the revoked event: %q %v", rest, err)
	}
	// The run itself goes on: revoking a key stops reading, not running.
	if r, err := h.store.GetRun(context.Background(), h.orgID, run.ID); err != nil || r.Status.Terminal() {
		t.Fatalf("run after the revocation: %v %v", r.Status, err)
	}
}

func TestClientAddress(t *testing.T) {
	for remote, want := range map[string]string{
		"192.0.2.1:1234":                 "192.0.2.1",
		"[::ffff:192.0.2.1]:1234":        "192.0.2.1",
		"[2001:db8:1:2:3:4:5:6]:443":     "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::1]:443":     "2001:db8:1:2::/64",
		"[2001:db8:1:3::1]:443":          "2001:db8:1:3::/64",
		"[fe80::1%eth0]:80":              "fe80::/64",
		"not an address":                 "not an address",
		"[::1]:80":                       "::/64",
		"203.0.113.9:1, 198.51.100.1:80": "203.0.113.9:1, 198.51.100.1:80",
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remote
		r.Header.Set("X-Forwarded-For", "198.51.100.77")
		if got := clientAddress(r); got != want {
			t.Errorf("%q: %q, want %q", remote, got, want)
		}
	}
}
