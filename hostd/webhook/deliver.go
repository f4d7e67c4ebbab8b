package webhook

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/broker"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

// Defaults of Config.
const (
	DefaultAttempts    = 6
	DefaultFirstRetry  = 30 * time.Second
	DefaultTimeout     = 10 * time.Second
	DefaultConcurrency = 8
)

// Backoff is how long to wait after failed attempt n (from 1) before the
// next: first, then three times as long each time (30 s, 1.5 min, 4.5 min,
// 13.5 min, 40.5 min: six attempts span about an hour), each wait moved by
// up to 20% either way by jitter in [0, 1), so receivers that failed
// together are not hit together again.
func Backoff(first time.Duration, n int, jitter float64) time.Duration {
	d := float64(first)
	for range n - 1 {
		d *= 3
	}
	return time.Duration(d * (0.8 + 0.4*jitter))
}

// Store is the outbox (a *store.Store).
type Store interface {
	ClaimDueWebhooks(ctx context.Context, now, until time.Time, limit int) ([]store.WebhookDelivery, error)
	NextWebhookAt(ctx context.Context) (time.Time, bool, error)
	RecordWebhookAttempt(ctx context.Context, runID string, a store.WebhookAttempt, o store.WebhookOutcome) error
}

// SecretSource opens an organisation's secret (a *Secrets).
type SecretSource interface {
	Secret(ctx context.Context, orgID string) (string, error)
}

// RenderFunc returns the run object a delivery carries: the run as GET
// /v1/runs/{id} shows it at the time of the attempt.
type RenderFunc func(ctx context.Context, orgID, runID string) ([]byte, error)

// Config configures a Deliverer.
type Config struct {
	Store   Store
	Secrets SecretSource
	Render  RenderFunc
	// Attempts is how many POSTs a delivery gets (default 6); FirstRetry
	// the first wait (default 30 s, see Backoff); Timeout bounds one
	// attempt, resolution and response included (default 10 s).
	Attempts   int
	FirstRetry time.Duration
	Timeout    time.Duration
	// Concurrency bounds the attempts in flight (default 8).
	Concurrency int
	// Resolver resolves receivers' names; nil is the system's.
	Resolver Resolver
	// UnsafeTestHooks is for tests only; see TestHooks.
	UnsafeTestHooks *TestHooks
	Logger          *slog.Logger
}

// Deliverer works through the outbox. Run is its one loop; Wake tells it a
// delivery may have become due.
type Deliverer struct {
	cfg    Config
	poster poster
	wake   chan struct{}
	log    *slog.Logger
}

// New returns a Deliverer; nothing is sent until Run.
func New(cfg Config) *Deliverer {
	if cfg.Attempts <= 0 {
		cfg.Attempts = DefaultAttempts
	}
	if cfg.FirstRetry <= 0 {
		cfg.FirstRetry = DefaultFirstRetry
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	p := poster{resolver: cfg.Resolver, timeout: cfg.Timeout}
	if p.resolver == nil {
		p.resolver = systemResolver{}
	}
	if cfg.UnsafeTestHooks != nil {
		p.hooks = *cfg.UnsafeTestHooks
	}
	return &Deliverer{cfg: cfg, poster: p, wake: make(chan struct{}, 1), log: cfg.Logger}
}

// Wake makes Run look for due deliveries now. It never blocks.
func (d *Deliverer) Wake() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// maxIdle bounds a wait with nothing due, so a missed wake-up costs at
// most this long.
const maxIdle = time.Minute

// Run delivers due webhooks until ctx ends, then waits for the attempts
// in flight (each bounded by Timeout).
func (d *Deliverer) Run(ctx context.Context) {
	for ctx.Err() == nil {
		n, err := d.deliverDue(ctx)
		if err != nil && ctx.Err() == nil {
			d.log.Error("webhook deliveries", "err", err)
		}
		if n == d.cfg.Concurrency && err == nil {
			continue // there may be more due
		}
		wait := maxIdle
		if err != nil {
			wait = 5 * time.Second
		} else if next, ok, err := d.cfg.Store.NextWebhookAt(ctx); err == nil && ok {
			wait = min(max(time.Until(next), 0), maxIdle)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-d.wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// claimMargin is how much longer than an attempt's timeout a claim on a
// delivery lasts: the time to record the attempt.
const claimMargin = time.Minute

// deliverDue makes one attempt of each due delivery, up to Concurrency at
// once, and waits for them.
func (d *Deliverer) deliverDue(ctx context.Context) (int, error) {
	// Claimed for longer than an attempt can take: another node's
	// deliverer leaves them alone meanwhile.
	now := time.Now()
	due, err := d.cfg.Store.ClaimDueWebhooks(ctx, now, now.Add(d.cfg.Timeout+claimMargin), d.cfg.Concurrency)
	if err != nil {
		return 0, err
	}
	var wg sync.WaitGroup
	errs := make([]error, len(due))
	for i, delivery := range due {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = d.attempt(context.WithoutCancel(ctx), delivery)
		}()
	}
	wg.Wait()
	return len(due), errors.Join(errs...)
}

// attempt POSTs one delivery once and records how it went and what comes
// next. Only a failure to record is an error; a failed POST is an outcome.
func (d *Deliverer) attempt(ctx context.Context, w store.WebhookDelivery) error {
	a := store.WebhookAttempt{Attempt: w.Attempts + 1, StartedAt: time.Now()}
	status, err := d.send(ctx, w, a.Attempt)
	a.Duration, a.StatusCode = time.Since(a.StartedAt), status
	delivered := err == nil && status >= 200 && status < 300
	switch {
	case err != nil:
		a.Error = errorText(err)
	case !delivered:
		a.Error = fmt.Sprintf("the receiver answered %d %s", status, http.StatusText(status))
	}
	var o store.WebhookOutcome
	switch {
	case delivered:
		o.State = store.WebhookDelivered
		o.Event = d.finalEvent(w, timeline.WebhookDelivered(status, a.Attempt), a)
	case a.Attempt >= d.cfg.Attempts:
		o.State = store.WebhookFailed
		o.Event = d.finalEvent(w, timeline.WebhookFailed(a.Attempt, lastFailure(status, err)), a)
	default:
		retry := time.Now().Add(Backoff(d.cfg.FirstRetry, a.Attempt, rand.Float64()))
		o.RetryAt = &retry
	}
	if err := d.cfg.Store.RecordWebhookAttempt(ctx, w.RunID, a, o); err != nil && !errors.Is(err, store.ErrNotFound) {
		return err // ErrNotFound: the run was purged meanwhile, and the delivery with it
	}
	return nil
}

func (d *Deliverer) send(ctx context.Context, w store.WebhookDelivery, attempt int) (int, error) {
	u, err := ParseURL(w.URL)
	if err != nil {
		return 0, err
	}
	secret, err := d.cfg.Secrets.Secret(ctx, w.OrgID)
	if err != nil {
		return 0, err
	}
	body, err := d.cfg.Render(ctx, w.OrgID, w.RunID)
	if err != nil {
		return 0, fmt.Errorf("render the run: %w", err)
	}
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", "Ephemeral-Webhook/1")
	h.Set(IDHeader, w.RunID)
	h.Set(AttemptHeader, strconv.Itoa(attempt))
	h.Set(SignatureHeader, Sign(secret, time.Now(), body))
	return d.poster.post(ctx, u, h, body)
}

// finalEvent is the delivery's outcome for the run's timeline: system
// words only (no host, no error text), placed at the time it happened.
func (d *Deliverer) finalEvent(w store.WebhookDelivery, message string, a store.WebhookAttempt) *store.Event {
	data := fmt.Sprintf(`{"attempts":%d,"status_code":%d,"delivered":%t}`, a.Attempt, a.StatusCode, a.Error == "")
	return &store.Event{T: time.Since(w.RunCreatedAt), Category: timeline.Webhook, Message: message, Data: []byte(data)}
}

// lastFailure names how the last attempt failed, in system words.
func lastFailure(status int, err error) string {
	var urlErr *url.Error
	switch {
	case err == nil:
		return strconv.Itoa(status)
	case errors.Is(err, broker.ErrForbiddenAddress):
		return "address not allowed"
	case errors.Is(err, ErrNoSecret):
		return "no webhook secret"
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &urlErr) && urlErr.Timeout():
		return "timeout"
	}
	return "no response"
}

// errorText is an attempt's error as the API shows it: one line, short.
func errorText(err error) string {
	s := strings.Join(strings.Fields(err.Error()), " ")
	if len(s) > 300 {
		s = strings.ToValidUTF8(s[:300], "") + "…"
	}
	return s
}
