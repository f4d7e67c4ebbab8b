package api

import (
	"net/http"
	"strings"
	"testing"
)

// A path the API serves, asked with a method it does not take, is 405
// with Allow naming the methods it takes; a path it does not serve is 404.
func TestWrongMethodIs405WithAllow(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	run := h.createRun(productPageRequest)
	for _, c := range []struct {
		method, path, allow string
	}{
		{"PUT", "/v1/runs", "GET, HEAD, POST"},
		{"DELETE", "/v1/runs", "GET, HEAD, POST"},
		{"POST", "/v1/runs/" + run.ID, "GET, HEAD, DELETE"},
		{"PATCH", "/v1/runs/run_00000000000000000000000000000000", "GET, HEAD, DELETE"},
		{"GET", "/v1/runs/" + run.ID + "/cancel", "POST"},
		{"POST", "/v1/runs/" + run.ID + "/events", "GET, HEAD"},
		{"DELETE", "/v1/runs/" + run.ID + "/outputs/a/b.txt", "GET, HEAD"},
		{"GET", "/v1/webhook_secret/rotate", "POST"},
		{"POST", "/v1/balance", "GET, HEAD"},
		{"POST", "/v1/models", "GET, HEAD"},
		{"POST", "/healthz", "GET, HEAD"},
		{"DELETE", "/openapi.json", "GET, HEAD"},
	} {
		resp := h.do(c.method, c.path, "")
		if e := resp.apiError(t); resp.status != http.StatusMethodNotAllowed || e.Code != "method_not_allowed" ||
			resp.header.Get("Allow") != c.allow || !strings.Contains(e.Message, c.allow) {
			t.Errorf("%s %s: %d Allow %q %s", c.method, c.path, resp.status, resp.header.Get("Allow"), resp.body)
		}
	}
	for _, path := range []string{"/v1/run", "/v1/runs/" + run.ID + "/nope", "/v2/runs"} {
		if resp := h.do("GET", path, ""); resp.status != http.StatusNotFound || resp.apiError(t).Code != "not_found" || resp.header.Get("Allow") != "" {
			t.Errorf("GET %s: %d %s", path, resp.status, resp.body)
		}
	}
	metrics := h.get(h.metricsURL + "/metrics")
	if metrics.status != http.StatusOK {
		t.Fatalf("metrics: %d", metrics.status)
	}
	req, _ := http.NewRequest("POST", h.metricsURL+"/metrics", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST /metrics: %v %v", resp, err)
	}
}

// A run request must be JSON: a form, text or a body without a type is
// 415 before anything is read or reserved.
func TestNonJSONBodyIs415(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
		"application/json; charset=latin1", "application/json-patch+json", "application/json; profile=x", "application/json;;"} {
		resp := h.do("POST", "/v1/runs", productPageRequest, "Content-Type", ct)
		if e := resp.apiError(t); resp.status != http.StatusUnsupportedMediaType || e.Code != "unsupported_media_type" || e.Param != "Content-Type" {
			t.Errorf("Content-Type %q: %d %s", ct, resp.status, resp.body)
		}
	}
	if a := h.balance(); a.Held != 0 {
		t.Errorf("a refused request reserved money: %+v", a)
	}
	for _, ct := range []string{"application/json", "application/json; charset=utf-8", "Application/JSON; charset=UTF-8"} {
		if resp := h.do("POST", "/v1/runs", productPageRequest, "Content-Type", ct); resp.status != http.StatusCreated {
			t.Errorf("Content-Type %q: %d %s", ct, resp.status, resp.body)
		}
	}
}

// Every endpoint refuses a query parameter it does not take, and one
// given twice, as unknown body fields are refused: a misspelt filter
// must not list everything.
func TestUnknownQueryParameterIs400(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	run := h.createRun(productPageRequest)
	h.waitFinished(run.ID)
	for _, c := range []struct {
		method, path, param, says string
	}{
		{"GET", "/v1/runs?Status=succeeded", "Status", `did you mean "status"?`},
		{"GET", "/v1/runs?state=succeeded", "state", "this endpoint takes limit, starting_after, status"},
		{"GET", "/v1/runs?limit=1&limit=2", "limit", "more than once"},
		{"POST", "/v1/runs?dry_run=1", "dry_run", "this endpoint takes none"},
		{"GET", "/v1/runs/" + run.ID + "?expand=events", "expand", "takes none"},
		{"DELETE", "/v1/runs/" + run.ID + "?force=1", "force", "takes none"},
		{"POST", "/v1/runs/" + run.ID + "/cancel?reason=x", "reason", "takes none"},
		{"GET", "/v1/runs/" + run.ID + "/events?since=2", "since", "this endpoint takes after"},
		{"GET", "/v1/runs/" + run.ID + "/recording?v=1", "v", "takes none"},
		{"GET", "/v1/runs/" + run.ID + "/outputs/report.md?download=1", "download", "takes none"},
		{"GET", "/v1/runs/" + run.ID + "/webhook_deliveries?limit=1", "limit", "takes none"},
		{"POST", "/v1/webhook_secret/rotate?force=1", "force", "takes none"},
		{"GET", "/v1/balance?currency=eur", "currency", "takes none"},
		{"GET", "/v1/models?provider=openai", "provider", "takes none"},
		{"GET", "/healthz?deep=1", "deep", "takes none"},
		{"GET", "/openapi.json?format=yaml", "format", "takes none"},
	} {
		body := ""
		if c.method == "POST" && strings.HasSuffix(c.path, "dry_run=1") {
			body = productPageRequest
		}
		resp := h.do(c.method, c.path, body)
		e := resp.apiError(t)
		code := "unknown_parameter"
		if strings.Contains(c.says, "more than once") {
			code = "duplicate_parameter"
		}
		if resp.status != http.StatusBadRequest || e.Code != code || e.Param != c.param || !strings.Contains(e.Message, c.says) {
			t.Errorf("%s %s: %d %s", c.method, c.path, resp.status, resp.body)
		}
	}
	if resp := h.do("GET", "/v1/runs?limit=%zz", ""); resp.status != http.StatusBadRequest || resp.apiError(t).Code != "invalid_query" {
		t.Errorf("malformed query: %d %s", resp.status, resp.body)
	}
	var list struct{ Data []runJSON }
	if resp := h.do("GET", "/v1/runs?status=succeeded&limit=5", ""); resp.status != http.StatusOK {
		t.Errorf("the parameters it takes: %d %s", resp.status, resp.body)
	} else if resp.decode(t, &list); len(list.Data) != 1 {
		t.Errorf("listed %d runs", len(list.Data))
	}
}

// Every 401 carries the challenge that says how to authenticate, also a
// browser's whose session has ended.
func TestUnauthorizedCarriesWWWAuthenticate(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	for _, headers := range [][]string{
		{"Authorization", "Bearer eph_wrong"},
		{"Authorization", ""},
		{"Authorization", "", "Cookie", "ephemeral_session=expired"},
	} {
		resp := h.do("GET", "/v1/balance", "", headers...)
		if resp.status != http.StatusUnauthorized || resp.header.Get("WWW-Authenticate") != `Bearer realm="ephemeral"` {
			t.Errorf("%q: %d %q", headers, resp.status, resp.header.Get("WWW-Authenticate"))
		}
	}
}

// Length limits count what the document says they count: a prompt's
// characters (not its bytes), a file path's bytes.
func TestLengthLimitsCountTheirUnit(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	prompt := func(s string) string { return `{"prompt":"` + s + `","max_cost_micros":40000}` }
	if resp := h.do("POST", "/v1/runs", prompt(strings.Repeat("é", MaxPromptChars))); resp.status != http.StatusCreated {
		t.Errorf("a prompt of %d two-byte characters: %d %s", MaxPromptChars, resp.status, resp.body)
	}
	if resp := h.do("POST", "/v1/runs", prompt(strings.Repeat("é", MaxPromptChars+1))); resp.status != http.StatusBadRequest ||
		!strings.Contains(string(resp.body), "characters") {
		t.Errorf("a prompt of %d characters: %d %s", MaxPromptChars+1, resp.status, resp.body)
	}
	model := func(s string) string { return `{"prompt":"p","model":"` + s + `","max_cost_micros":40000}` }
	if resp := h.do("POST", "/v1/runs", model(strings.Repeat("ü", MaxModelChars))); resp.status != http.StatusCreated {
		t.Errorf("a model name of %d characters: %d %s", MaxModelChars, resp.status, resp.body)
	}
	if resp := h.do("POST", "/v1/runs", model(strings.Repeat("ü", MaxModelChars+1))); resp.status != http.StatusBadRequest {
		t.Errorf("a model name of %d characters: %d %s", MaxModelChars+1, resp.status, resp.body)
	}
	path := func(s string) string {
		return `{"prompt":"p","max_cost_micros":40000,"files":[{"path":"` + s + `","content":""}]}`
	}
	if resp := h.do("POST", "/v1/runs", path(strings.Repeat("ü", MaxFilePathBytes/2))); resp.status != http.StatusCreated {
		t.Errorf("a path of %d bytes: %d %s", MaxFilePathBytes/2*2, resp.status, resp.body)
	}
	if resp := h.do("POST", "/v1/runs", path(strings.Repeat("ü", MaxFilePathBytes/2+1))); resp.status != http.StatusBadRequest ||
		!strings.Contains(string(resp.body), "bytes") {
		t.Errorf("a path of %d bytes: %d %s", (MaxFilePathBytes/2+1)*2, resp.status, resp.body)
	}
}
