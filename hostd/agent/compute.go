package agent

import (
	"sync"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
)

// computeTick is how often VM time is charged while the VM runs, so a long
// command is stopped by the budget close to the limit rather than after.
const computeTick = time.Second

// computeMeter charges the run's VM-seconds from the moment the VM is ready
// until it is destroyed. Its goroutine is owned by stop, which waits for it.
type computeMeter struct {
	rec   *runs.Recorder
	since time.Time
	quit  chan struct{}
	done  chan struct{}

	mu      sync.Mutex
	charged time.Time // VM time is charged up to here
}

func startComputeMeter(rec *runs.Recorder, ready time.Time) *computeMeter {
	c := &computeMeter{rec: rec, since: ready, charged: ready, quit: make(chan struct{}), done: make(chan struct{})}
	go c.loop()
	return c
}

func (c *computeMeter) loop() {
	defer close(c.done)
	tick := time.NewTicker(computeTick)
	defer tick.Stop()
	for {
		select {
		case <-c.quit:
			return
		case now := <-tick.C:
			// A budget error here stops the run through the Recorder;
			// a store error is retried by the next charge, which
			// persists the running total.
			_ = c.chargeUntil(now)
		}
	}
}

func (c *computeMeter) chargeUntil(now time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !now.After(c.charged) {
		return nil
	}
	d := now.Sub(c.charged)
	c.charged = now
	return c.rec.Charge(ledger.Usage{VMTime: d})
}

// stop ends the meter once the VM is gone, charges the last stretch and
// returns the VM's whole metered lifetime.
func (c *computeMeter) stop() time.Duration {
	close(c.quit)
	<-c.done
	now := time.Now()
	_ = c.chargeUntil(now)
	return now.Sub(c.since)
}
