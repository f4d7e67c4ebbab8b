// Package ratelimit keeps what the API needs to hold each client (an API
// key, a client address) to its share: a token bucket per client for
// requests per second, and a count per client for things held open at
// once. Both forget a client that has nothing left to remember, so a
// flood of distinct clients costs memory only while it lasts.
package ratelimit

import (
	"sync"
	"time"
)

// Buckets holds a token bucket per client: each starts full with Burst
// tokens and refills at PerSecond tokens a second up to Burst; a request
// takes one token.
type Buckets struct {
	perSecond float64
	burst     float64
	// refill is how long an empty bucket takes to fill up: a bucket left
	// alone that long is as good as a new one and can be forgotten.
	refill time.Duration

	mu        sync.Mutex
	buckets   map[string]*bucket
	lastSweep time.Time
}

type bucket struct {
	tokens float64
	at     time.Time // when tokens was computed
}

// NewBuckets returns buckets refilling at perSecond (> 0) up to burst (>= 1).
func NewBuckets(perSecond float64, burst int) *Buckets {
	return &Buckets{
		perSecond: perSecond,
		burst:     float64(burst),
		refill:    time.Duration(float64(burst) / perSecond * float64(time.Second)),
		buckets:   map[string]*bucket{},
	}
}

// Take takes a token from client's bucket at now. When the bucket is empty
// it takes nothing and says how long until it holds a token again.
func (b *Buckets) Take(client string, now time.Time) (ok bool, retryAfter time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sweep(now)
	bk, known := b.buckets[client]
	if !known {
		bk = &bucket{tokens: b.burst, at: now}
		b.buckets[client] = bk
	}
	if elapsed := now.Sub(bk.at); elapsed > 0 {
		bk.tokens = min(b.burst, bk.tokens+elapsed.Seconds()*b.perSecond)
		bk.at = now
	}
	if bk.tokens >= 1 {
		bk.tokens--
		return true, 0
	}
	return false, time.Duration((1 - bk.tokens) / b.perSecond * float64(time.Second))
}

// sweep forgets, at most once per refill time, the buckets that have
// refilled completely: the map holds only clients seen within about two
// refill times.
func (b *Buckets) sweep(now time.Time) {
	if now.Sub(b.lastSweep) < b.refill {
		return
	}
	b.lastSweep = now
	for client, bk := range b.buckets {
		if now.Sub(bk.at) >= b.refill {
			delete(b.buckets, client)
		}
	}
}

// Slots counts what each client holds open, up to a maximum each.
type Slots struct {
	max int

	mu   sync.Mutex
	held map[string]int
}

// NewSlots returns slots allowing max (>= 1) at once per client.
func NewSlots(max int) *Slots {
	return &Slots{max: max, held: map[string]int{}}
}

// Acquire takes one of client's slots; ok is false when all are taken.
// Call release once when the slot is given back.
func (s *Slots) Acquire(client string) (release func(), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[client] >= s.max {
		return nil, false
	}
	s.held[client]++
	var once sync.Once
	return func() { once.Do(func() { s.release(client) }) }, true
}

func (s *Slots) release(client string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[client]--; s.held[client] <= 0 {
		delete(s.held, client)
	}
}
