package api

import (
	"strings"
	"testing"
)

func TestMetricsReportRunsMoneyAndBootTimes(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	h.waitFinished(h.createRun(productPageRequest).ID)
	h.waitFinished(h.createRun(productPageRequest).ID)
	resp := h.get(h.metricsURL + "/metrics")
	if resp.status != 200 || !strings.HasPrefix(resp.header.Get("Content-Type"), "text/plain") {
		t.Fatalf("content type %q", resp.header.Get("Content-Type"))
	}
	body := string(resp.body)
	for _, want := range []string{
		`ephemeral_runs{status="succeeded"} 2`,
		`ephemeral_runs{status="running"} 0`,
		`ephemeral_microvm_boot_duration_seconds_bucket{le="2"} 0`,
		`ephemeral_microvm_boot_duration_seconds_bucket{le="3"} 2`,
		`ephemeral_microvm_boot_duration_seconds_count 2`,
		`ephemeral_microvm_boot_duration_seconds_sum 4.84`,
		"ephemeral_money_reserved_micros 0",
		"ephemeral_money_charged_micros_total 7060",
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
}

// /metrics sums up every organisation: the API does not serve it, with a
// key or without, and the metrics handler serves nothing else.
func TestMetricsAreNotOnTheAPI(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	for _, auth := range []string{"", "Bearer " + h.key} {
		if resp := h.do("GET", "/metrics", "", "Authorization", auth); resp.status != 404 || strings.Contains(string(resp.body), "ephemeral_") {
			t.Errorf("GET /metrics on the API with %q: %d %s", auth, resp.status, resp.body)
		}
	}
	for _, path := range []string{"/v1/balance", "/healthz", "/openapi.json"} {
		if resp := h.get(h.metricsURL + path); resp.status != 404 {
			t.Errorf("GET %s on the metrics address: %d", path, resp.status)
		}
	}
}

func TestHealthz(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	if resp := h.do("GET", "/healthz", "", "Authorization", ""); resp.status != 200 || !strings.Contains(string(resp.body), `"ok"`) {
		t.Fatalf("%d %s", resp.status, resp.body)
	}
}
