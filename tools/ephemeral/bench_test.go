package main

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/sandbox"
)

func TestSummarize(t *testing.T) {
	s := summarize([]float64{5, 1, 4, 2, 3})
	if s.n != 5 || s.median != 3 || s.p25 != 2 || s.p75 != 4 {
		t.Errorf("summarize(1..5) = %+v, want median 3, quartiles 2 and 4", s)
	}
	if got := summarize([]float64{10, 20}).median; got != 15 {
		t.Errorf("median of 10 and 20 = %v, want 15 (interpolated)", got)
	}
	if !math.IsNaN(summarize(nil).median) {
		t.Error("the median of nothing is a number")
	}
	// A p95 of fewer than 20 values would be its largest or close: none.
	if got := summarize(make([]float64, minP95-1)).format(fmtMillis); !strings.HasSuffix(got, "\t—") {
		t.Errorf("format with n=%d = %q, want no p95", minP95-1, got)
	}
	if got := summarize(make([]float64, minP95)).format(fmtMillis); strings.HasSuffix(got, "\t—") {
		t.Errorf("format with n=%d = %q, want a p95", minP95, got)
	}
}

// Each variant's ratio is the median of its per-round ratios to the raw
// boot and to the cold create of the same round, so a round slowed by
// the machine slows the baseline with it.
func TestPrintStartRatiosArePerRound(t *testing.T) {
	ms := func(d int) time.Duration { return time.Duration(d) * time.Millisecond }
	sample := func(ready, first int, restored bool) startSample {
		s := startSample{ready: ms(ready), firstDone: ms(first), second: ms(30)}
		if ready > 0 {
			s.timings = sandbox.BootTimings{Ready: ms(ready), Restored: restored, Hello: ms(ready / 2), Kernel: ms(ready / 8), Init: ms(ready / 8)}
		}
		return s
	}
	variants := []startVariant{{name: rawVariant}, {name: coldVariant}, {name: "restore"}}
	samples := [][]startSample{
		{sample(2000, 2100, false), sample(4000, 4200, false), sample(2000, 2100, false)},
		{sample(2100, 2200, false), sample(4200, 4400, false), sample(2100, 2200, false)},
		{sample(200, 420, true), sample(400, 840, true), sample(200, 420, true)},
	}
	samples[0][0].timings, samples[0][1].timings, samples[0][2].timings = sandbox.BootTimings{}, sandbox.BootTimings{}, sandbox.BootTimings{}
	var out bytes.Buffer
	printStart(&out, variants, samples)
	text := out.String()
	for _, want := range []string{
		"restore  ", "0.100 (0.100–0.100)", // to ready: 200/2000 in every round
		"0.200 (0.200–0.200)", // to first command: 420/2100
		"1.050 (1.050–1.050)", // cold to raw, to ready
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
}
