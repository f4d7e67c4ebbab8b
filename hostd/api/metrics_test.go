package api

import (
	"strings"
	"testing"
)

func TestMetricsReportRunsMoneyAndBootTimes(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	h.waitFinished(h.createRun(productPageRequest).ID)
	h.waitFinished(h.createRun(productPageRequest).ID)
	resp := h.do("GET", "/metrics", "")
	if !strings.HasPrefix(resp.header.Get("Content-Type"), "text/plain") {
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

func TestHealthz(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	if resp := h.do("GET", "/healthz", "", "Authorization", ""); resp.status != 200 || !strings.Contains(string(resp.body), `"ok"`) {
		t.Fatalf("%d %s", resp.status, resp.body)
	}
}
