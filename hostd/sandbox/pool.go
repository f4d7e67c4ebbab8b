package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ephemeralhq/ephemeral/netns"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// PoolConfig configures a Pool.
type PoolConfig struct {
	// Size is how many ready sandboxes the pool keeps; 0 keeps none.
	Size int
	// Capacity bounds the sandboxes of the Manager, pooled ones included:
	// the pool refills only while fewer run. 0 means Size.
	Capacity int
	// Shape is the VCPUs and MemoryMiB of pooled sandboxes, which Take
	// hands out only for that shape, and how the pool starts them
	// (Start); the network and environment are Take's.
	Shape Options
}

// poolRetry paces refills after a failed start.
const poolRetry = 5 * time.Second

// warmUp is run once in each pooled sandbox before it waits. A clone's
// first process pays for translating the guest's process start (fork,
// exec, the dynamic loader, bash) afresh, 150-250 ms under TCG, where a
// booted guest's translations are warm from its boot; the pool pays that
// in the background instead of the run. It leaves nothing behind: no file,
// no process, nothing another clone shares.
var warmUp = vsockproto.ExecRequest{Shell: "true", Timeout: time.Minute}

// Pool keeps sandboxes of one shape ready, so that taking one costs no
// start at all. Pooled sandboxes are created like any other (restored from
// a template where the driver can, provisioned, sealed: nothing leaves
// them), wait unused, and are handed out once each: a taken sandbox
// leaves the pool for good and the pool starts a replacement in the
// background. They count toward the capacity like any sandbox, are
// destroyed by Close and Manager.Shutdown, and swept by Reconcile after a
// crash. Its methods are safe for concurrent use.
type Pool struct {
	m        *Manager
	size     int
	capacity int
	shape    Options

	mu      sync.Mutex
	ready   []*Sandbox
	started bool
	closed  bool

	// wake nudges the filler: a sandbox was taken or destroyed.
	wake chan struct{}
	// stop ends the filler, which closes done when it has returned.
	stop chan struct{}
	done chan struct{}
}

// NewPool makes m's pool, empty until Start. A Manager has at most one
// pool.
func (m *Manager) NewPool(cfg PoolConfig) (*Pool, error) {
	shape, err := cfg.Shape.withDefaults()
	if err != nil {
		return nil, err
	}
	if cfg.Size < 0 || cfg.Capacity < 0 {
		return nil, fmt.Errorf("sandbox: pool of %d in a capacity of %d", cfg.Size, cfg.Capacity)
	}
	p := &Pool{
		m:        m,
		size:     cfg.Size,
		capacity: cfg.Capacity,
		shape:    Options{VCPUs: shape.VCPUs, MemoryMiB: shape.MemoryMiB, Start: shape.Start},
		wake:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	if p.capacity == 0 {
		p.capacity = p.size
	}
	m.mu.Lock()
	if m.pool != nil {
		m.mu.Unlock()
		return nil, errors.New("sandbox: the manager has a pool already")
	}
	m.pool = p
	m.mu.Unlock()
	return p, nil
}

// Start makes the pool fill, and refill, in the background until Close.
func (p *Pool) Start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started || p.closed {
		return
	}
	p.started = true
	go p.fill()
	p.nudge()
}

// Take hands out a pooled sandbox when opts asks for the pool's shape and
// lets it restore, with opts' network and environment applied; otherwise,
// or while the pool is empty, it creates one with Manager.Create.
func (p *Pool) Take(ctx context.Context, opts Options) (*Sandbox, error) {
	full, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if opts.Start != StartAuto || full.VCPUs != p.shape.VCPUs || full.MemoryMiB != p.shape.MemoryMiB {
		return p.m.Create(ctx, opts)
	}
	for {
		sb := p.pop()
		if sb == nil {
			return p.m.Create(ctx, opts)
		}
		select {
		case <-sb.Done(): // died while it waited
			sb.Destroy()
			continue
		default:
		}
		if err := sb.grant(full); err != nil {
			sb.Destroy()
			return nil, err
		}
		sb.timings.Pooled = true
		return sb, nil
	}
}

// pop removes the oldest ready sandbox from the pool, or returns nil.
func (p *Pool) pop() *Sandbox {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.ready) == 0 {
		return nil
	}
	sb := p.ready[0]
	p.ready = p.ready[1:]
	p.nudge()
	return sb
}

// Ready is how many sandboxes wait in the pool.
func (p *Pool) Ready() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ready)
}

// nudge wakes the filler without blocking.
func (p *Pool) nudge() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// fill keeps the pool at its size while the capacity allows, until stop.
func (p *Pool) fill() {
	defer close(p.done)
	// Close cancels a start in progress.
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-p.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	defer func() { cancel(); <-watched }()
	for {
		select {
		case <-p.stop:
			return
		case <-p.wake:
		}
		for p.wanted() {
			sb, err := p.start(ctx)
			if err != nil {
				if ctx.Err() != nil || errors.Is(err, ErrShuttingDown) {
					return
				}
				p.m.logf("sandbox: pool: %v (retrying in %v)", err, poolRetry)
				select {
				case <-p.stop:
					return
				case <-time.After(poolRetry):
				}
				continue
			}
			if !p.add(sb) {
				sb.Destroy()
				return
			}
		}
	}
}

// start creates and warms up a sandbox for the pool.
func (p *Pool) start(ctx context.Context) (*Sandbox, error) {
	sb, err := p.m.Create(ctx, p.shape)
	if err != nil {
		return nil, err
	}
	st, err := sb.Exec(ctx, warmUp, nil, nil, nil)
	if err == nil && st.Code != 0 {
		err = fmt.Errorf("exited %d", st.Code)
	}
	if err != nil {
		sb.Destroy()
		return nil, fmt.Errorf("sandbox: pool: warm up: %w", err)
	}
	return sb, nil
}

// wanted reports whether the pool lacks a sandbox and the capacity has
// room for one. Dead pooled sandboxes are dropped first.
func (p *Pool) wanted() bool {
	p.mu.Lock()
	var dead []*Sandbox
	alive := p.ready[:0]
	for _, sb := range p.ready {
		select {
		case <-sb.Done():
			dead = append(dead, sb)
		default:
			alive = append(alive, sb)
		}
	}
	p.ready = alive
	short := !p.closed && len(p.ready) < p.size
	p.mu.Unlock()
	for _, sb := range dead {
		sb.Destroy()
	}
	return short && p.m.count() < p.capacity
}

// add puts sb in the pool unless the pool was closed meanwhile.
func (p *Pool) add(sb *Sandbox) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.ready = append(p.ready, sb)
	return true
}

// Close stops refilling, waits for a start in progress and destroys the
// sandboxes in the pool; those taken run on. It is idempotent.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		<-p.done
		return nil
	}
	p.closed = true
	started := p.started
	p.mu.Unlock()
	close(p.stop)
	if !started {
		close(p.done)
	}
	<-p.done
	p.mu.Lock()
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	var errs []error
	for _, sb := range ready {
		errs = append(errs, sb.Destroy())
	}
	p.m.mu.Lock()
	p.m.pool = nil
	p.m.mu.Unlock()
	return errors.Join(errs...)
}

// grant gives a pooled sandbox, created sealed, what opts asks of its
// network and environment.
func (s *Sandbox) grant(opts Options) error {
	if opts.Network != (netns.Config{}) {
		if err := s.network.Set(opts.Network); err != nil {
			return fmt.Errorf("sandbox: pool: %w", err)
		}
	}
	s.env = append(proxyEnv(opts.Network), opts.Env...)
	return nil
}
