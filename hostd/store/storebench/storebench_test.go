package storebench

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/store"
)

// The populated history reads back through the store as runs the daemon
// had finished: listed newest first, with their timelines and recordings,
// the money conserved, and the oldest ones due for the janitor.
func TestPopulatedHistoryIsWhatTheDaemonWouldHaveLeft(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ephemeral.db")
	now := time.Now()
	h := History{Runs: 200, Expired: 20, EventsPerRun: 12, RecordingBytes: 20_000, Retention: 30 * 24 * time.Hour, Now: now}
	p, err := Populate(ctx, path, h)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.RunIDs) != h.Runs {
		t.Fatalf("%d run ids", len(p.RunIDs))
	}
	st, err := store.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()

	page, more, err := st.ListRuns(ctx, p.OrgID, "", 20)
	if err != nil || !more || len(page) != 20 || page[0].ID != p.RunIDs[h.Runs-1] || page[0].Status != store.Succeeded {
		t.Fatalf("first page: %d runs, more %v, %v", len(page), more, err)
	}
	events, err := st.Events(ctx, p.RunIDs[7], 0, 100)
	if err != nil || len(events) != h.EventsPerRun || events[0].Message != "Budget $0.04 reserved" ||
		events[len(events)-1].Message != "$0.00353 charged, $0.03647 released" {
		t.Fatalf("events: %+v, %v", events, err)
	}
	recording, err := st.Recording(ctx, p.OrgID, p.RunIDs[7])
	size := 0
	for _, e := range recording.Exchanges {
		size += len(e)
	}
	if err != nil || size < h.RecordingBytes {
		t.Fatalf("recording of %d bytes: %v", size, err)
	}
	totals, err := st.Totals(ctx)
	if err != nil {
		t.Fatal(err)
	}
	account, err := st.Balance(ctx, p.OrgID)
	if err != nil {
		t.Fatal(err)
	}
	if totals.RunsByStatus[store.Succeeded] != int64(h.Runs) || totals.Charged != account.Charged ||
		account.Charged != int64(h.Runs)*charged || account.Available+account.Held+account.Charged != account.Credited {
		t.Fatalf("totals %+v, account %+v", totals, account)
	}
	if n, err := st.PurgeExpired(ctx, now, 24*time.Hour); err != nil || n != h.Expired {
		t.Fatalf("the janitor purged %d (%v), want %d", n, err, h.Expired)
	}
	purged, err := st.GetRun(ctx, p.OrgID, p.RunIDs[h.Expired-1])
	if err != nil || purged.PurgedAt == nil {
		t.Fatalf("the newest expired run: %+v, %v", purged, err)
	}
	kept, err := st.GetRun(ctx, p.OrgID, p.RunIDs[h.Expired])
	if err != nil || kept.PurgedAt != nil {
		t.Fatalf("the oldest run within retention: %+v, %v", kept, err)
	}
}
