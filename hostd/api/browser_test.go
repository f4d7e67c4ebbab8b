package api

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/accounts"
)

// register signs a new account in and returns its session cookie header.
func (h *harness) register(email string) (cookie string, orgID string) {
	h.t.Helper()
	token, u, err := h.accounts.Register(context.Background(), email, "correct horse", "192.0.2.1", "")
	if err != nil {
		h.t.Fatal(err)
	}
	return accounts.CookieName + "=" + token, u.OrgID
}

// A browser calls the API with its session cookie instead of a key; what
// changes state must come from this origin's own pages.
func TestSessionCookieAuthenticatesBrowsers(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	cookie, orgID := h.register("ada@example.org")
	asBrowser := func(extra ...string) []string {
		return append([]string{"Authorization", "", "Cookie", cookie}, extra...)
	}

	var bal struct {
		Available int64 `json:"available_micros"`
	}
	resp := h.do("GET", "/v1/balance", "", asBrowser()...)
	resp.decode(t, &bal)
	if resp.status != http.StatusOK || bal.Available != 1_000_000 {
		t.Fatalf("balance with the cookie: %d %s", resp.status, resp.body)
	}

	// Sent by a page of this origin (fetch() sets Sec-Fetch-Site).
	resp = h.do("POST", "/v1/runs", productPageRequest, asBrowser("Sec-Fetch-Site", "same-origin")...)
	if resp.status != http.StatusCreated {
		t.Fatalf("POST /v1/runs from this origin: %d %s", resp.status, resp.body)
	}
	var run runJSON
	resp.decode(t, &run)
	if got, err := h.store.GetRun(context.Background(), orgID, run.ID); err != nil || got.OrgID != orgID {
		t.Fatalf("run not in the user's organisation: %+v %v", got, err)
	}
	// The event stream takes the cookie too (EventSource sends it).
	if resp := h.do("GET", "/v1/runs/"+run.ID+"/events", "", asBrowser("Accept", "text/event-stream")...); resp.status != http.StatusOK ||
		!strings.Contains(string(resp.body), "event: end") {
		t.Fatalf("event stream with the cookie: %d %s", resp.status, resp.body)
	}

	// Forged from another site, or another origin of this one.
	for _, forged := range [][]string{
		{"Sec-Fetch-Site", "cross-site"},
		{"Sec-Fetch-Site", "same-site"},
		{"Origin", "http://evil.example"},
	} {
		resp := h.do("POST", "/v1/runs", productPageRequest, asBrowser(forged...)...)
		if resp.status != http.StatusForbidden || resp.apiError(t).Code != "cross_origin_request" {
			t.Errorf("POST /v1/runs with %v: %d %s, want 403", forged, resp.status, resp.body)
		}
		resp = h.do("POST", "/v1/runs/"+run.ID+"/cancel", "", asBrowser(forged...)...)
		if resp.status != http.StatusForbidden {
			t.Errorf("cancel with %v: %d, want 403", forged, resp.status)
		}
	}
	var list struct {
		Data []runJSON `json:"data"`
	}
	h.do("GET", "/v1/runs", "", asBrowser()...).decode(t, &list)
	if len(list.Data) != 1 {
		t.Errorf("forged requests created runs: %d runs", len(list.Data))
	}

	// A key is not sent by browsers on their own: no forgery to refuse.
	if resp := h.do("POST", "/v1/runs", productPageRequest, "Sec-Fetch-Site", "cross-site"); resp.status != http.StatusCreated {
		t.Errorf("POST with a key from a cross-site page: %d %s", resp.status, resp.body)
	}

	// The cookie sees its own organisation only.
	other := h.createRun(productPageRequest)
	if resp := h.do("GET", "/v1/runs/"+other.ID, "", asBrowser()...); resp.status != http.StatusNotFound {
		t.Errorf("another organisation's run with the cookie: %d", resp.status)
	}

	token := strings.TrimPrefix(cookie, accounts.CookieName+"=")
	if err := h.accounts.SignOut(context.Background(), token); err != nil {
		t.Fatal(err)
	}
	resp = h.do("GET", "/v1/balance", "", asBrowser()...)
	if resp.status != http.StatusUnauthorized || resp.apiError(t).Code != "session_expired" {
		t.Errorf("after signing out: %d %s", resp.status, resp.body)
	}
}

func TestListModels(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	var page struct {
		Data []modelJSON `json:"data"`
	}
	resp := h.do("GET", "/v1/models", "", "Authorization", "")
	if resp.status != http.StatusOK {
		t.Fatalf("GET /v1/models without a key: %d %s", resp.status, resp.body)
	}
	resp.decode(t, &page)
	found := map[string]modelJSON{}
	for _, m := range page.Data {
		found[m.ID] = m
	}
	luna := found["openai/gpt-6-luna"]
	if !luna.Available || !luna.ProviderConfigured || !luna.Default || luna.Price == nil || luna.Price.InputMicrosPerMTok != 50_000 {
		t.Errorf("the product page's model: %+v", luna)
	}
	// The harness configures no Anthropic key.
	if claude := found["claude-haiku-4-5"]; claude.Available || claude.ProviderConfigured || claude.Price == nil {
		t.Errorf("a model of an unconfigured provider: %+v", claude)
	}
}

// A replay must ask what the example's recording answers.
func TestReplayRequestsMustMatchTheirExample(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	replay := strings.Replace(productPageRequest, `"web": false,`, `"web": false, "replay": "product-page",`, 1)
	run := h.createRun(replay)
	if !strings.Contains(string(run.Request), `"replay":"product-page"`) {
		t.Errorf("stored request %s does not say it is a replay", run.Request)
	}
	// Budget and timeout are the runner's to choose.
	h.createRun(strings.Replace(replay, `"timeout_seconds": 120`, `"timeout_seconds": 60`, 1))

	for _, tc := range []struct{ body, param, code string }{
		{strings.Replace(replay, "This is a sandbox test.", "Do something else.", 1), "prompt", "replay_mismatch"},
		{strings.Replace(replay, `"shell": true`, `"shell": false`, 1), "shell", "replay_mismatch"},
		{strings.Replace(replay, `"web": false`, `"web": true`, 1), "web", "replay_mismatch"},
		{strings.Replace(replay, `"timeout_seconds"`, `"model": "gpt-4o", "timeout_seconds"`, 1), "model", "replay_mismatch"},
		{strings.Replace(replay, `"timeout_seconds"`, `"files": [{"path": "a.txt", "content": "x"}], "timeout_seconds"`, 1), "files", "replay_mismatch"},
		{strings.Replace(replay, `"product-page"`, `"no-such-example"`, 1), "replay", "replay_not_found"},
		{strings.Replace(replay, `"product-page"`, `"../etc"`, 1), "replay", "parameter_invalid"},
	} {
		resp := h.do("POST", "/v1/runs", tc.body)
		if resp.status != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", tc.param, resp.status, resp.body)
			continue
		}
		if e := resp.apiError(t); e.Param != tc.param || e.Code != tc.code {
			t.Errorf("%s: error %+v, want param %s code %s", tc.param, e, tc.param, tc.code)
		}
	}
}

func TestListRunsByStatus(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	run := h.createRun(productPageRequest)
	h.waitFinished(run.ID)
	var page struct {
		Data []runJSON `json:"data"`
	}
	h.do("GET", "/v1/runs?status=succeeded", "").decode(t, &page)
	if len(page.Data) != 1 || page.Data[0].ID != run.ID {
		t.Errorf("succeeded runs: %+v", page.Data)
	}
	h.do("GET", "/v1/runs?status=failed", "").decode(t, &page)
	if len(page.Data) != 0 {
		t.Errorf("failed runs: %+v", page.Data)
	}
	if resp := h.do("GET", "/v1/runs?status=done", ""); resp.status != http.StatusBadRequest {
		t.Errorf("unknown status: %d", resp.status)
	}
}

// A browser's event stream is checked against its session, as a key's is
// against the key: it stays open while the session lives, through many
// re-checks, and ends once the browser signs out.
func TestSessionEventStreamEndsWithTheSession(t *testing.T) {
	steps := make(chan string)
	defer close(steps)
	h := newHarness(t, harnessConfig{executor: steppedExecutor(steps), credentialRecheck: 20 * time.Millisecond})
	cookie, _ := h.register("ada@example.org")
	resp := h.do("POST", "/v1/runs", productPageRequest, "Authorization", "", "Cookie", cookie, "Sec-Fetch-Site", "same-origin")
	if resp.status != http.StatusCreated {
		t.Fatalf("POST /v1/runs with the cookie: %d %s", resp.status, resp.body)
	}
	var run runJSON
	resp.decode(t, &run)
	req, _ := http.NewRequest("GET", h.url+"/v1/runs/"+run.ID+"/events", nil)
	req.Header.Set("Cookie", cookie)
	req.Header.Set("Accept", "text/event-stream")
	stream, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	events := newSSEReader(stream)
	if e := events.next(t); e.event != "timeline" {
		t.Fatalf("first event %+v", e)
	}
	for i := range 3 {
		time.Sleep(100 * time.Millisecond) // several re-checks of the session
		steps <- fmt.Sprint("step ", i)
		if e := events.next(t); e.event != "timeline" || !strings.Contains(e.data, fmt.Sprint("step ", i)) {
			t.Fatalf("event %d with the session live: %+v", i, e)
		}
	}
	if err := h.accounts.SignOut(context.Background(), strings.TrimPrefix(cookie, accounts.CookieName+"=")); err != nil {
		t.Fatal(err)
	}
	e := events.next(t)
	var body struct{ Error apiError }
	if e.event != "revoked" || jsonUnmarshal([]byte(e.data), &body) != nil || body.Error.Code != "session_expired" {
		t.Fatalf("event after signing out %+v, want revoked (session_expired)", e)
	}
}
