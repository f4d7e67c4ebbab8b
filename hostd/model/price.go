package model

import (
	"fmt"
	"math"
	"math/bits"
)

// tokensPerPriceUnit is the token count a Price is quoted for.
const tokensPerPriceUnit = 1_000_000

// Price is what a model costs, in integer micro-dollars per million tokens.
type Price struct {
	InputMicrosPerMTok int64 `json:"input_micros_per_mtok"`
	// CachedInputMicrosPerMTok is the rate for prompt tokens read from the
	// provider's cache; zero means "no cache discount": cached tokens are
	// charged at the input rate, so a missing entry never undercharges.
	CachedInputMicrosPerMTok int64 `json:"cached_input_micros_per_mtok,omitempty"`
	OutputMicrosPerMTok      int64 `json:"output_micros_per_mtok"`
}

// Validate rejects negative rates.
func (p Price) Validate() error {
	if p.InputMicrosPerMTok < 0 || p.CachedInputMicrosPerMTok < 0 || p.OutputMicrosPerMTok < 0 {
		return fmt.Errorf("price: negative rate in %+v", p)
	}
	return nil
}

func (p Price) cachedRate() int64 {
	if p.CachedInputMicrosPerMTok == 0 {
		return p.InputMicrosPerMTok
	}
	return p.CachedInputMicrosPerMTok
}

// Cost is what u costs in micro-dollars, rounded up to the next whole
// micro-dollar. Negative token counts (a hostile or broken provider) count
// as zero, cached tokens beyond the input count are capped to it, and a sum
// too large for int64 saturates, so the result is never negative.
func (p Price) Cost(u Usage) int64 {
	input := max(u.InputTokens, 0)
	cached := min(max(u.CachedInputTokens, 0), input)
	output := max(u.OutputTokens, 0)

	var sum uint128
	sum.addProduct(uint64(input-cached), uint64(max(p.InputMicrosPerMTok, 0)))
	sum.addProduct(uint64(cached), uint64(max(p.cachedRate(), 0)))
	sum.addProduct(uint64(output), uint64(max(p.OutputMicrosPerMTok, 0)))
	return sum.divCeil(tokensPerPriceUnit)
}

// AffordableOutputTokens is the largest number of output tokens whose cost,
// together with inputTokens uncached input tokens, fits in budgetMicros. The
// agent uses it to cap max_tokens to what is left of the budget; it is zero
// when not even the input can be paid for.
func (p Price) AffordableOutputTokens(budgetMicros, inputTokens int64) int64 {
	if budgetMicros <= 0 {
		return 0
	}
	// ceil((in*pin + n*pout) / 1e6) <= budget  ⇔  in*pin + n*pout <= budget*1e6,
	// so n = floor((budget*1e6 - in*pin) / pout), all in exact integers.
	var allowed, spent uint128
	allowed.addProduct(uint64(budgetMicros), tokensPerPriceUnit)
	spent.addProduct(uint64(max(inputTokens, 0)), uint64(max(p.InputMicrosPerMTok, 0)))
	if allowed.less(spent) {
		return 0
	}
	if p.OutputMicrosPerMTok <= 0 {
		return math.MaxInt64
	}
	return allowed.sub(spent).divFloor(uint64(p.OutputMicrosPerMTok))
}

// uint128 accumulates products of int64-sized factors without overflow.
type uint128 struct{ hi, lo uint64 }

func (s *uint128) addProduct(a, b uint64) {
	hi, lo := bits.Mul64(a, b)
	var carry uint64
	s.lo, carry = bits.Add64(s.lo, lo, 0)
	s.hi, _ = bits.Add64(s.hi, hi, carry)
}

func (s uint128) less(t uint128) bool {
	return s.hi < t.hi || (s.hi == t.hi && s.lo < t.lo)
}

// sub returns s-t; the caller ensures t <= s.
func (s uint128) sub(t uint128) uint128 {
	lo, borrow := bits.Sub64(s.lo, t.lo, 0)
	hi, _ := bits.Sub64(s.hi, t.hi, borrow)
	return uint128{hi, lo}
}

// divFloor returns floor(s/d), saturated to math.MaxInt64.
func (s uint128) divFloor(d uint64) int64 {
	if s.hi >= d {
		return math.MaxInt64
	}
	q, _ := bits.Div64(s.hi, s.lo, d)
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// divCeil returns ceil(s/d), saturated to math.MaxInt64.
func (s uint128) divCeil(d uint64) int64 {
	if s.hi >= d {
		return math.MaxInt64 // the quotient would not fit in 64 bits
	}
	q, r := bits.Div64(s.hi, s.lo, d)
	if r != 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}
