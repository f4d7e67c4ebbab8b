package runs

import (
	"context"
	"errors"
	"sync"
	"time"
)

// A run is bounded in time twice. Its microVM must be ready within the
// boot limit (Config.BootTimeout); from that moment the run has its whole
// timeout (Spec.Timeout) to work. Neither the wait in the queue nor the
// boot counts against timeout_seconds: what a request asks for is time to
// work, and compute is charged from the same moment on. So a timeout
// shorter than a boot is not a request that cannot work.

// DefaultBootTimeout bounds a run's boot when Config.BootTimeout is zero.
const DefaultBootTimeout = time.Minute

// errBootTimeout ends a run whose microVM was not ready within the boot
// limit; its timeout had not started.
var errBootTimeout = errors.New("the microVM was not ready within the boot limit")

// runClock stops a run when its time is up: at the boot limit until the
// Executor starts the clock, at the timeout after that.
type runClock struct {
	stop    context.CancelCauseFunc
	timeout time.Duration

	mu    sync.Mutex
	timer *time.Timer
	// work is the context StartClock handed out, bounded by the
	// timeout; nil until the clock started.
	work context.Context
}

func newRunClock(stop context.CancelCauseFunc, bootTimeout, timeout time.Duration) *runClock {
	return &runClock{stop: stop, timeout: timeout, timer: time.AfterFunc(bootTimeout, func() { stop(errBootTimeout) })}
}

// start ends the boot limit and starts the timeout, once: it returns ctx
// bounded by the run's deadline, and stops the run there too, whatever
// context its work uses.
func (c *runClock) start(ctx context.Context) (context.Context, context.CancelFunc) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.work != nil {
		deadline, _ := c.work.Deadline()
		return context.WithDeadlineCause(ctx, deadline, errTimeout)
	}
	c.timer.Stop()
	c.timer = time.AfterFunc(c.timeout, func() { c.stop(errTimeout) })
	work, cancel := context.WithTimeoutCause(ctx, c.timeout, errTimeout)
	c.work = work
	return work, cancel
}

// expired reports whether the run's timeout was reached: the context
// StartClock handed out may end a moment before the run's own.
func (c *runClock) expired() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.work != nil && errors.Is(context.Cause(c.work), errTimeout)
}

// halt stops the clock once the run is over.
func (c *runClock) halt() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timer.Stop()
}
