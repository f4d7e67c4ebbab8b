package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzRunRequest feeds hostile bodies to the decoder and validator: they
// must never panic, and whatever they accept must satisfy every limit.
func FuzzRunRequest(f *testing.F) {
	for _, seed := range []string{
		productPageRequest,
		`{"prompt":"p","max_cost_micros":1,"files":[{"path":"a/b.txt","content":"x"}]}`,
		`{"prompt":"p","max_cost_micros":1,"files":[{"path":"../x","content":""}]}`,
		`{"prompt":"p","max_cost_micros":1,"connections":[{"name":"gh","methods":["GET"]}]}`,
		`{"prompt":"p","max_cost_micros":1,"shel":true}`,
		`{"prompt":5}`, `[]`, `{} {}`, `{"timeout_seconds":1e400}`, "",
	} {
		f.Add(seed)
	}
	lim := limits{defaultModel: "m", maxCostMicros: 5_000_000}
	f.Fuzz(func(t *testing.T, body string) {
		r := httptest.NewRequest("POST", "/v1/runs", strings.NewReader(body))
		var req runRequest
		if apiErr := decodeStrict(r, httptest.NewRecorder(), &req); apiErr != nil {
			if apiErr.Status != http.StatusBadRequest && apiErr.Status != http.StatusRequestEntityTooLarge {
				t.Fatalf("status %d", apiErr.Status)
			}
			return
		}
		c, apiErr := req.validate(lim)
		if apiErr != nil {
			if apiErr.Param == "" {
				t.Fatalf("validation error names no field: %+v", apiErr)
			}
			return
		}
		if c.Prompt == "" || c.TimeoutSeconds < 1 || c.TimeoutSeconds > MaxTimeoutSeconds ||
			c.MaxCostMicros < 1 || c.MaxCostMicros > lim.maxCostMicros {
			t.Fatalf("accepted out-of-range request %+v", c)
		}
		for _, file := range c.Files {
			if msg := checkRelativePath(file.Path); msg != "" || strings.HasPrefix(file.Path, "/") || strings.Contains("/"+file.Path+"/", "/../") {
				t.Fatalf("accepted path %q", file.Path)
			}
		}
		// The canonical form must round-trip into an equal request, or
		// idempotency would compare the wrong bytes.
		var back canonicalRequest
		if err := json.Unmarshal(c.encode(), &back); err != nil || string(back.encode()) != string(c.encode()) {
			t.Fatalf("canonical form does not round-trip: %v", err)
		}
	})
}
