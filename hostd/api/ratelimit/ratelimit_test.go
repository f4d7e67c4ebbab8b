package ratelimit

import (
	"fmt"
	"testing"
	"time"
)

func TestBucketsLetABurstThroughThenTheRate(t *testing.T) {
	b := NewBuckets(10, 20)
	now := time.Unix(1_000_000, 0)
	for i := range 20 {
		if ok, _ := b.Take("key-a", now); !ok {
			t.Fatalf("request %d of the burst refused", i+1)
		}
	}
	ok, retry := b.Take("key-a", now)
	if ok || retry != 100*time.Millisecond {
		t.Fatalf("21st request at once: ok %v, retry after %v; want refused, 100ms", ok, retry)
	}
	// Another client has its own bucket.
	if ok, _ := b.Take("key-b", now); !ok {
		t.Fatal("a second client was refused")
	}
	// A refused request takes nothing: after the wait it goes through.
	now = now.Add(retry)
	if ok, _ := b.Take("key-a", now); !ok {
		t.Fatal("refused after waiting as told")
	}
	if ok, _ := b.Take("key-a", now); ok {
		t.Fatal("a second request went through on one token's refill")
	}
	// A second of rest refills ten tokens, not more.
	now = now.Add(time.Second)
	for i := range 10 {
		if ok, _ := b.Take("key-a", now); !ok {
			t.Fatalf("request %d after a second's rest refused", i+1)
		}
	}
	if ok, _ := b.Take("key-a", now); ok {
		t.Fatal("more than a second's refill went through")
	}
}

// A flood of distinct clients is forgotten once their buckets would be
// full again, and a forgotten client starts with a full bucket, as it
// would have had.
func TestBucketsForgetIdleClients(t *testing.T) {
	b := NewBuckets(100, 200) // refills in 2 s
	now := time.Unix(1_000_000, 0)
	for i := range 10_000 {
		b.Take(fmt.Sprintf("10.0.%d.%d", i/256, i%256), now)
	}
	for range 150 {
		b.Take("steady", now)
	}
	if n := len(b.buckets); n != 10_001 {
		t.Fatalf("%d buckets during the flood", n)
	}
	now = now.Add(2 * time.Second)
	b.Take("late", now)
	if n := len(b.buckets); n != 1 {
		t.Fatalf("%d buckets 2 s after the flood, want only the newcomer's", n)
	}
	for i := range 200 {
		if ok, _ := b.Take("steady", now); !ok {
			t.Fatalf("forgotten client refused at request %d of a full burst", i+1)
		}
	}
}

func TestSlotsCapWhatEachClientHoldsOpen(t *testing.T) {
	s := NewSlots(2)
	r1, ok1 := s.Acquire("key-a")
	r2, ok2 := s.Acquire("key-a")
	if !ok1 || !ok2 {
		t.Fatal("slots within the cap refused")
	}
	if _, ok := s.Acquire("key-a"); ok {
		t.Fatal("a third slot was given")
	}
	rb, ok := s.Acquire("key-b")
	if !ok {
		t.Fatal("another client was refused")
	}
	r1()
	r1() // releasing twice gives back one slot
	r3, ok := s.Acquire("key-a")
	if !ok {
		t.Fatal("a released slot was not given again")
	}
	if _, ok := s.Acquire("key-a"); ok {
		t.Fatal("a double release gave back two slots")
	}
	r2()
	r3()
	rb()
	if n := len(s.held); n != 0 {
		t.Fatalf("%d clients remembered with nothing open", n)
	}
}
