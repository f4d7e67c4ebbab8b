package api

import (
	"encoding/json"
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

// BenchmarkDecodeRunRequest compares the strict decoding of a run request
// (the key check, then encoding/json) with encoding/json alone, its
// baseline: the ratio of the two is what strictness costs.
func BenchmarkDecodeRunRequest(b *testing.B) {
	body := []byte(`{"prompt":"p","model":"anthropic/claude","shell":true,"web":true,"timeout_seconds":3600,
		"max_cost_micros":5000000,"connections":[{"name":"github","methods":["GET","POST"]}],
		"files":[{"path":"data/input.csv","content":"a,b\n1,2\n"},{"path":".env.example","content":""}]}`)
	b.Run("strict", func(b *testing.B) {
		for b.Loop() {
			var req runRequest
			if err := decodeBody(body, &req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		for b.Loop() {
			var req runRequest
			if err := json.Unmarshal(body, &req); err != nil {
				b.Fatal(err)
			}
		}
	})
}
