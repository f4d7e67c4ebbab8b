package money

import (
	"math"
	"strings"
	"testing"
)

func TestFormatMatchesProductPage(t *testing.T) {
	tests := []struct {
		micros int64
		want   string
	}{
		{40000, "$0.04"},     // Budget $0.04 reserved
		{3530, "$0.00353"},   // charged
		{36470, "$0.03647"},  // released
		{330, "$0.00033"},    // model part
		{0, "$0.00"},         // web part
		{3200, "$0.0032"},    // compute part
		{1, "$0.000001"},     // smallest unit survives
		{1_000_000, "$1.00"}, // whole dollars keep two decimals
		{1_234_567_890, "$1,234.56789"},
		{-2500, "-$0.0025"},
		{math.MinInt64, "-$9,223,372,036,854.775808"},
	}
	for _, tt := range tests {
		if got := Format(tt.micros); got != tt.want {
			t.Errorf("Format(%d) = %q, want %q", tt.micros, got, tt.want)
		}
	}
}

func TestCount(t *testing.T) {
	tests := map[int64]string{0: "0", 7: "7", 999: "999", 1000: "1,000", 5214: "5,214", 1234567: "1,234,567", -5214: "-5,214"}
	for n, want := range tests {
		if got := Count(n); got != want {
			t.Errorf("Count(%d) = %q, want %q", n, got, want)
		}
	}
}

// FuzzFormat checks that formatting is lossless: the digits shown are exactly
// the micros, whatever the value.
func FuzzFormat(f *testing.F) {
	for _, seed := range []int64{0, 1, 3530, 40000, 1_234_567_890, -2500, math.MaxInt64} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, micros int64) {
		s := Format(micros)
		digits := strings.NewReplacer("$", "", ",", "", "-", "").Replace(s)
		whole, frac, ok := strings.Cut(digits, ".")
		if !ok || len(frac) < 2 || len(frac) > 6 {
			t.Fatalf("Format(%d) = %q: bad shape", micros, s)
		}
		frac += strings.Repeat("0", 6-len(frac))
		back := strings.TrimLeft(whole+frac, "0")
		mag := uint64(micros)
		if micros < 0 {
			mag = -mag
		}
		if want := strings.TrimLeft(uitoa(mag), "0"); back != want {
			t.Fatalf("Format(%d) = %q: digits %q, want %q", micros, s, back, want)
		}
	})
}

func uitoa(v uint64) string {
	if v == 0 {
		return ""
	}
	var b []byte
	for v > 0 {
		b = append([]byte{byte('0' + v%10)}, b...)
		v /= 10
	}
	return string(b)
}
