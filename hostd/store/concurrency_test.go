package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
)

// Writers of one organisation at once, as several nodes are on
// PostgreSQL: the cap of active runs holds exactly, and none fails for
// having met another.
func TestConcurrentCreatesHoldTheCapOfActiveRuns(t *testing.T) {
	ctx := context.Background()
	st := openTestStore(t)
	org, err := st.CreateOrg(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Credit(ctx, org.ID, 1_000_000); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, 30)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() {
			id := fmt.Sprintf("run_cap_%02d", i)
			_, _, errs[i] = st.CreateRun(ctx, NewRun{ID: id, OrgID: org.ID, RequestHash: []byte(id), Model: "m", TimeoutSeconds: 60,
				Reserve: 1000, CreatedAt: time.Now(), MaxActive: 5, Queued: Event{Category: "Queued", Message: "queued"}})
		})
	}
	wg.Wait()
	created := 0
	for _, err := range errs {
		switch {
		case err == nil:
			created++
		case !errors.Is(err, ErrTooManyActive):
			t.Fatalf("a concurrent create failed: %v", err)
		}
	}
	if created != 5 {
		t.Fatalf("%d runs created under a cap of 5", created)
	}
}

// Runs created and finished by many writers at once all settle, and the
// account adds up after.
func TestConcurrentRunsAllSettle(t *testing.T) {
	ctx := context.Background()
	st := openTestStore(t)
	org, err := st.CreateOrg(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Credit(ctx, org.ID, 10_000_000); err != nil {
		t.Fatal(err)
	}
	const writers, each = 32, 10
	errs := make(chan error, writers*each)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("run_w%02d_%02d", w, i)
				if _, _, err := st.CreateRun(ctx, NewRun{ID: id, OrgID: org.ID, RequestHash: []byte(id), Model: "m", TimeoutSeconds: 60,
					Reserve: 1000, CreatedAt: time.Now(), MaxActive: 1000, Queued: Event{Category: "Queued", Message: "queued"}}); err != nil {
					errs <- fmt.Errorf("create %s: %w", id, err)
					continue
				}
				if _, err := st.AppendEvent(ctx, id, Event{Category: "Shell", Message: "$ true"}); err != nil {
					errs <- err
				}
				_, err := st.FinishRun(ctx, id, Finish{Status: Succeeded, Cost: ledger.Cost{Model: 10}, At: time.Now(), RetentionUntil: time.Now().Add(time.Hour)},
					func(charged, released int64) []Event {
						return []Event{{Category: "Worker destroyed", Message: "settled"}}
					})
				if err != nil {
					errs <- fmt.Errorf("finish %s: %w", id, err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	a, err := st.Balance(ctx, org.ID)
	if err != nil {
		t.Fatal(err)
	}
	if a.Held != 0 || a.Charged != writers*each*10 || a.Available+a.Charged != a.Credited {
		t.Fatalf("account after %d runs: %+v", writers*each, a)
	}
}
