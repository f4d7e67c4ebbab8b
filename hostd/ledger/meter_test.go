package ledger

import (
	"errors"
	"testing"
	"time"
)

func TestMeterStopsAtLimitAndChargesNoMore(t *testing.T) {
	m := NewMeter(DefaultRates, 40000)
	if _, _, err := m.Charge(Usage{ModelCalls: 1, ModelMicros: 30000}); err != nil {
		t.Fatal(err)
	}
	if m.Remaining() != 10000 {
		t.Fatalf("remaining %d", m.Remaining())
	}
	usage, cost, err := m.Charge(Usage{ModelCalls: 1, ModelMicros: 15000, VMTime: 10 * time.Second})
	var be *BudgetExceededError
	if !errors.As(err, &be) || !errors.Is(err, ErrBudgetExceeded) || be.Limit != 40000 || be.Attempted != 47400 {
		t.Fatalf("err %v", err)
	}
	if usage.ModelCalls != 2 || usage.VMTime != 10*time.Second {
		t.Fatalf("usage that happened must still be recorded: %+v", usage)
	}
	if cost.Total() != 40000 || cost.Model != 40000 || cost.Compute != 0 {
		t.Fatalf("cost %+v: compute trimmed first, total at the limit", cost)
	}
	if !m.Exceeded() || m.Remaining() != 0 {
		t.Fatalf("exceeded %v remaining %d", m.Exceeded(), m.Remaining())
	}
	// Once exceeded, even a free charge fails: the run must stop.
	if _, _, err := m.Charge(Usage{}); !errors.Is(err, ErrBudgetExceeded) {
		t.Fatalf("charge after exceeding: %v", err)
	}
}

func TestMeterAllowsSpendingExactlyTheLimit(t *testing.T) {
	m := NewMeter(DefaultRates, 1000)
	if _, cost, err := m.Charge(Usage{ModelMicros: 1000}); err != nil || cost.Total() != 1000 {
		t.Fatalf("cost %+v err %v", cost, err)
	}
}

func TestComputeIsPricedFromTotalVMTime(t *testing.T) {
	rates := Rates{ComputeMicrosPerVMSecond: 240}
	// The product page: about 13.3 VM-seconds cost $0.0032.
	if c := rates.Price(Usage{VMTime: 13_333 * time.Millisecond}); c.Compute != 3200 {
		t.Fatalf("compute %d, want 3200", c.Compute)
	}
	// A thousand 1 ms reports cost what one second costs, not a thousand
	// rounded-up micro-dollars.
	m := NewMeter(rates, 1_000_000)
	var cost Cost
	for range 1000 {
		_, cost, _ = m.Charge(Usage{VMTime: time.Millisecond})
	}
	if cost.Compute != 240 {
		t.Fatalf("compute after 1000 × 1 ms: %d, want 240", cost.Compute)
	}
	if c := (Rates{WebMicrosPerRequest: 100}).Price(Usage{WebRequests: 3}); c.Web != 300 {
		t.Fatalf("web %d", c.Web)
	}
}

func TestCapCostKeepsPartsSummingToLimit(t *testing.T) {
	for _, c := range []Cost{{Model: 10, Web: 10, Compute: 10}, {Model: 100}, {Compute: 100}, {Web: 50, Compute: 5}} {
		for limit := int64(0); limit <= c.Total(); limit++ {
			got := capCost(c, limit)
			if got.Total() != limit || got.Model < 0 || got.Web < 0 || got.Compute < 0 ||
				got.Model > c.Model || got.Web > c.Web || got.Compute > c.Compute {
				t.Fatalf("capCost(%+v, %d) = %+v", c, limit, got)
			}
		}
	}
}
