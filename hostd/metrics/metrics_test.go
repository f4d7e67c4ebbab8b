package metrics

import (
	"strings"
	"testing"
	"time"
)

func TestHistogramBucketsAreCumulative(t *testing.T) {
	h := NewHistogram(0.5, 1, 2.5)
	for _, d := range []time.Duration{100 * time.Millisecond, 500 * time.Millisecond, 900 * time.Millisecond, 2 * time.Second, 10 * time.Second} {
		h.Observe(d)
	}
	var b strings.Builder
	if err := h.Write(&b, "ephemeral_boot_seconds", "Time to a ready microVM."); err != nil {
		t.Fatal(err)
	}
	want := `# HELP ephemeral_boot_seconds Time to a ready microVM.
# TYPE ephemeral_boot_seconds histogram
ephemeral_boot_seconds_bucket{le="0.5"} 2
ephemeral_boot_seconds_bucket{le="1"} 3
ephemeral_boot_seconds_bucket{le="2.5"} 4
ephemeral_boot_seconds_bucket{le="+Inf"} 5
ephemeral_boot_seconds_sum 13.5
ephemeral_boot_seconds_count 5
`
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestGaugesAndCounters(t *testing.T) {
	var b strings.Builder
	Gauge(&b, "ephemeral_money_reserved_micros", "Held.", 40000)
	Counter(&b, "ephemeral_money_charged_micros_total", "Charged.", 3530)
	LabeledGauge(&b, "ephemeral_runs", "Runs by status.", "status", []LabelValue{{"succeeded", 3}, {"timed_out", 1}})
	want := `# HELP ephemeral_money_reserved_micros Held.
# TYPE ephemeral_money_reserved_micros gauge
ephemeral_money_reserved_micros 40000
# HELP ephemeral_money_charged_micros_total Charged.
# TYPE ephemeral_money_charged_micros_total counter
ephemeral_money_charged_micros_total 3530
# HELP ephemeral_runs Runs by status.
# TYPE ephemeral_runs gauge
ephemeral_runs{status="succeeded"} 3
ephemeral_runs{status="timed_out"} 1
`
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
}
