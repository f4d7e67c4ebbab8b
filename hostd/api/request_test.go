package api

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/outputs"
	"github.com/ephemeralhq/ephemeral/hostd/webhook"
)

// FuzzRunRequest feeds hostile bodies to the decoder and validator of POST
// /v1/runs: they must never panic, and whatever they accept must satisfy
// every limit and re-encode to a canonical request that the same decoder
// accepts as the same request. The seed corpus is in
// testdata/fuzz/FuzzRunRequest.
var runRequestFields = []string{"prompt", "model", "shell", "web", "connections", "files", "timeout_seconds",
	"max_cost_micros", "zero_data_retention", "outputs", "webhook_url"}

func FuzzRunRequest(f *testing.F) {
	f.Add(productPageRequest)
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
		// Every key it took is a field's name exactly, never another
		// spelling encoding/json would also have matched.
		var top map[string]json.RawMessage
		if json.Unmarshal([]byte(body), &top) == nil {
			for key := range top {
				if !slices.Contains(runRequestFields, key) {
					t.Fatalf("accepted the key %q", key)
				}
			}
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
		for _, p := range c.Outputs {
			if msg := outputs.CheckPattern(p); msg != "" {
				t.Fatalf("accepted output pattern %q", p)
			}
		}
		if c.WebhookURL != "" {
			if _, err := webhook.ParseURL(c.WebhookURL); err != nil {
				t.Fatalf("accepted webhook_url %q", c.WebhookURL)
			}
		}
		paths := map[string]bool{}
		for _, file := range c.Files {
			if msg := checkRelativePath(file.Path); msg != "" || strings.HasPrefix(file.Path, "/") || strings.Contains("/"+file.Path+"/", "/../") {
				t.Fatalf("accepted path %q", file.Path)
			}
			paths[file.Path] = true
		}
		for p := range paths {
			for dir := path.Dir(p); dir != "."; dir = path.Dir(dir) {
				if paths[dir] {
					t.Fatalf("accepted %q inside the file %q", p, dir)
				}
			}
		}
		// The canonical form is what idempotency compares and what is
		// stored: it must decode, strictly, into the same request.
		canonical := c.encode()
		var again runRequest
		if apiErr := decodeBody(canonical, &again); apiErr != nil {
			t.Fatalf("canonical form %s is refused: %+v", canonical, apiErr)
		}
		back, apiErr := again.validate(lim)
		if apiErr != nil {
			t.Fatalf("canonical form %s does not validate: %+v", canonical, apiErr)
		}
		if !reflect.DeepEqual(back, c) || !bytes.Equal(back.encode(), canonical) {
			t.Fatalf("canonical form does not round-trip:\n%+v\n%+v", c, back)
		}
	})
}
