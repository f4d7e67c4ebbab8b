package model

import (
	"math"
	"testing"
)

func TestCost(t *testing.T) {
	gpt4oMini := Price{InputMicrosPerMTok: 150_000, CachedInputMicrosPerMTok: 75_000, OutputMicrosPerMTok: 600_000}
	tests := []struct {
		name  string
		price Price
		usage Usage
		want  int64
	}{
		{"nothing used", gpt4oMini, Usage{}, 0},
		{"exact micro-dollars", gpt4oMini, Usage{InputTokens: 1_000_000, OutputTokens: 1_000_000}, 750_000},
		// 1 input token costs 0.15 micro-dollars: billed as 1.
		{"fraction rounds up", gpt4oMini, Usage{InputTokens: 1}, 1},
		// 5000*0.15 + 214*0.6 = 750 + 128.4 = 878.4 -> 879.
		{"sum rounds up once", gpt4oMini, Usage{InputTokens: 5000, OutputTokens: 214}, 879},
		// 4000 uncached*0.15 + 1000 cached*0.075 + 214*0.6 = 600 + 75 + 128.4 -> 804.
		{"cached tokens at cached rate", gpt4oMini, Usage{InputTokens: 5000, CachedInputTokens: 1000, OutputTokens: 214}, 804},
		{"no cached rate charges input rate", Price{InputMicrosPerMTok: 1_000_000}, Usage{InputTokens: 10, CachedInputTokens: 10}, 10},
		{"cached beyond input is capped", gpt4oMini, Usage{InputTokens: 1_000_000, CachedInputTokens: 5_000_000}, 75_000},
		{"negative tokens count as zero", gpt4oMini, Usage{InputTokens: -5_000_000, CachedInputTokens: -1, OutputTokens: -7}, 0},
		{"free local model", Price{}, Usage{InputTokens: 1 << 40, OutputTokens: 1 << 40}, 0},
		{"saturates instead of overflowing", Price{InputMicrosPerMTok: math.MaxInt64, OutputMicrosPerMTok: math.MaxInt64},
			Usage{InputTokens: math.MaxInt64, OutputTokens: math.MaxInt64}, math.MaxInt64},
		{"large but exact", Price{OutputMicrosPerMTok: 75_000_000}, Usage{OutputTokens: 1 << 40}, 82_463_372_083_200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.price.Cost(tt.usage); got != tt.want {
				t.Errorf("Cost(%+v) = %d, want %d", tt.usage, got, tt.want)
			}
		})
	}
}

func TestCostIsAdditiveWithinRounding(t *testing.T) {
	// Billing turn by turn may only round up, never lose money: the sum of
	// per-turn costs is at least the cost of the summed usage and at most
	// one micro-dollar per turn more.
	p := Price{InputMicrosPerMTok: 150_000, CachedInputMicrosPerMTok: 75_000, OutputMicrosPerMTok: 600_000}
	turns := []Usage{{InputTokens: 1234, OutputTokens: 56}, {InputTokens: 2345, CachedInputTokens: 1200, OutputTokens: 78}, {InputTokens: 3456, OutputTokens: 910}}
	var total Usage
	var perTurn int64
	for _, u := range turns {
		total = total.Add(u)
		perTurn += p.Cost(u)
	}
	whole := p.Cost(total)
	if perTurn < whole || perTurn > whole+int64(len(turns)) {
		t.Errorf("per-turn sum %d, whole %d: want whole <= sum <= whole+%d", perTurn, whole, len(turns))
	}
}

func TestPriceValidate(t *testing.T) {
	if err := (Price{InputMicrosPerMTok: 1, OutputMicrosPerMTok: 2}).Validate(); err != nil {
		t.Errorf("valid price refused: %v", err)
	}
	if err := (Price{CachedInputMicrosPerMTok: -1}).Validate(); err == nil {
		t.Error("negative cached rate accepted")
	}
}

func TestAffordableOutputTokens(t *testing.T) {
	prices := []Price{
		{InputMicrosPerMTok: 150_000, OutputMicrosPerMTok: 600_000},
		{InputMicrosPerMTok: 3_000_000, OutputMicrosPerMTok: 15_000_000},
		{InputMicrosPerMTok: 1, OutputMicrosPerMTok: 7},
	}
	for _, p := range prices {
		for _, budget := range []int64{0, 1, 7, 999, 40_000} {
			for _, input := range []int64{0, 1, 5000, 200_000} {
				n := p.AffordableOutputTokens(budget, input)
				if n < 0 {
					t.Fatalf("%+v budget %d input %d: negative %d", p, budget, input, n)
				}
				// n tokens fit and n+1 do not (unless nothing fits).
				if n > 0 && p.Cost(Usage{InputTokens: input, OutputTokens: n}) > budget {
					t.Errorf("%+v budget %d input %d: %d output tokens cost %d, over budget",
						p, budget, input, n, p.Cost(Usage{InputTokens: input, OutputTokens: n}))
				}
				if p.Cost(Usage{InputTokens: input}) <= budget && p.Cost(Usage{InputTokens: input, OutputTokens: n + 1}) <= budget {
					t.Errorf("%+v budget %d input %d: %d is not the maximum", p, budget, input, n)
				}
			}
		}
	}
	if n := (Price{InputMicrosPerMTok: 1}).AffordableOutputTokens(10, 0); n != math.MaxInt64 {
		t.Errorf("free output: got %d, want unbounded", n)
	}
	if n := (Price{InputMicrosPerMTok: 1_000_000, OutputMicrosPerMTok: 1}).AffordableOutputTokens(10, 11); n != 0 {
		t.Errorf("input alone over budget: got %d output tokens, want 0", n)
	}
}
