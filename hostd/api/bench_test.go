package api

import (
	"net/http"
	"strings"
	"testing"
)

// BenchmarkCreateRun measures POST /v1/runs end to end over HTTP: decoding,
// validation, the reservation transaction and the first timeline entry.
func BenchmarkCreateRun(b *testing.B) {
	h := newHarness(b, harnessConfig{credit: 1 << 50, maxActivePerOrg: 1 << 30, executor: blockUntil(nil)})
	for b.Loop() {
		req, _ := http.NewRequest("POST", h.url+"/v1/runs", strings.NewReader(productPageRequest))
		req.Header.Set("Authorization", "Bearer "+h.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusCreated {
			b.Fatalf("create: %v %v", err, resp.Status)
		}
		resp.Body.Close()
	}
}
