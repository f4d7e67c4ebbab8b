package ledger

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrBudgetExceeded is returned (wrapped in *BudgetExceededError) by a
// Meter once a run's usage reaches its max_cost_micros.
var ErrBudgetExceeded = errors.New("budget exceeded")

// BudgetExceededError says which charge hit the limit.
type BudgetExceededError struct {
	Limit     int64 // the run's max_cost_micros
	Attempted int64 // what the run would have cost with this charge
}

func (e *BudgetExceededError) Error() string {
	return fmt.Sprintf("budget exceeded: charge would bring the run to %d of %d micros", e.Attempted, e.Limit)
}

func (e *BudgetExceededError) Unwrap() error { return ErrBudgetExceeded }

// Rates price what the daemon itself meters; model prices come with each
// model call because they depend on the model.
type Rates struct {
	ComputeMicrosPerVMSecond int64 // default 240: the page's 13.4 VM-seconds cost $0.0032
	WebMicrosPerRequest      int64
}

// DefaultRates are used when the configuration names none.
var DefaultRates = Rates{ComputeMicrosPerVMSecond: 240, WebMicrosPerRequest: 100}

// Usage is what a run consumed. Executors report deltas; the Meter keeps the
// running total.
type Usage struct {
	ModelCalls    int64         `json:"model_calls"`
	InputTokens   int64         `json:"input_tokens"`
	OutputTokens  int64         `json:"output_tokens"`
	ModelMicros   int64         `json:"-"` // priced by the caller from its model price table
	WebRequests   int64         `json:"web_requests"`
	ShellCommands int64         `json:"shell_commands"`
	VMTime        time.Duration `json:"-"`
}

// Tokens is the total of input and output tokens.
func (u Usage) Tokens() int64 { return u.InputTokens + u.OutputTokens }

func (u Usage) add(d Usage) Usage {
	u.ModelCalls += d.ModelCalls
	u.InputTokens += d.InputTokens
	u.OutputTokens += d.OutputTokens
	u.ModelMicros += d.ModelMicros
	u.WebRequests += d.WebRequests
	u.ShellCommands += d.ShellCommands
	u.VMTime += d.VMTime
	return u
}

// Cost is a run's metered charge split by kind; Total is what is charged.
type Cost struct {
	Model   int64 `json:"model_micros"`
	Web     int64 `json:"web_micros"`
	Compute int64 `json:"compute_micros"`
}

// Total is the sum of the parts.
func (c Cost) Total() int64 { return c.Model + c.Web + c.Compute }

// Price turns usage into cost. Compute is priced from the total VM time
// (rounded up to the micro-dollar) so many small reports do not accumulate
// rounding error.
func (r Rates) Price(u Usage) Cost {
	ms := u.VMTime.Milliseconds()
	return Cost{
		Model:   u.ModelMicros,
		Web:     u.WebRequests * r.WebMicrosPerRequest,
		Compute: (ms*r.ComputeMicrosPerVMSecond + 999) / 1000,
	}
}

// Meter tracks one run's usage against its limit. It is the only place a
// run's spending is allowed to grow, so the budget is enforced here.
type Meter struct {
	rates Rates
	limit int64

	mu       sync.Mutex
	usage    Usage
	cost     Cost
	exceeded bool
}

// NewMeter starts metering a run whose cost may not exceed limit micros.
func NewMeter(rates Rates, limit int64) *Meter {
	return &Meter{rates: rates, limit: limit}
}

// Charge adds usage. When the new total would pass the limit, the usage is
// still recorded (it happened) but the cost is capped at the limit and a
// *BudgetExceededError is returned: the caller must stop the run. Once
// exceeded, every further charge fails the same way.
func (m *Meter) Charge(delta Usage) (Usage, Cost, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.usage = m.usage.add(delta)
	full := m.rates.Price(m.usage)
	if full.Total() <= m.limit && !m.exceeded {
		m.cost = full
		return m.usage, m.cost, nil
	}
	m.exceeded = true
	m.cost = capCost(full, m.limit)
	return m.usage, m.cost, &BudgetExceededError{Limit: m.limit, Attempted: full.Total()}
}

// Remaining is what the run may still spend.
func (m *Meter) Remaining() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.limit - m.cost.Total()
}

// Exceeded reports whether a charge has hit the limit.
func (m *Meter) Exceeded() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.exceeded
}

// Snapshot returns the usage and cost so far.
func (m *Meter) Snapshot() (Usage, Cost) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.usage, m.cost
}

// capCost trims c to limit, taking first from compute, then web, then model,
// so the parts still add up exactly to the charge.
func capCost(c Cost, limit int64) Cost {
	over := c.Total() - limit
	for _, part := range []*int64{&c.Compute, &c.Web, &c.Model} {
		cut := min(over, *part)
		*part -= cut
		over -= cut
	}
	return c
}
