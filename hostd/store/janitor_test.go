package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
)

func TestPurgeExpiredPurgesEveryBatchAndForgetsOldKeys(t *testing.T) {
	ctx := context.Background()
	f := newRecordingFixture(t)
	now := time.Now()
	const expired = 2*purgeBatch + 17
	for i := range expired + 3 {
		nr := NewRun{ID: fmt.Sprint("run_", i), OrgID: f.orgID, IdempotencyKey: fmt.Sprint("key-", i), RequestHash: []byte("r"),
			Model: "m", TimeoutSeconds: 60, Reserve: 1000, CreatedAt: now.Add(-48 * time.Hour), MaxActive: 10,
			Queued: Event{Category: "Queued", Message: "queued"}}
		if _, _, err := f.st.CreateRun(ctx, nr); err != nil {
			t.Fatal(err)
		}
		until := now.Add(-time.Minute)
		if i >= expired {
			until = now.Add(time.Hour)
		}
		f.finish(nr.ID, until)
	}
	if n, err := f.st.PurgeExpired(ctx, now, 24*time.Hour); err != nil || n != expired {
		t.Fatalf("purged %d runs (%v), want %d", n, err, expired)
	}
	for i, wantPurged := range map[int]bool{0: true, purgeBatch: true, expired - 1: true, expired: false, expired + 2: false} {
		r, err := f.st.GetRun(ctx, f.orgID, fmt.Sprint("run_", i))
		if err != nil {
			t.Fatal(err)
		}
		if (r.PurgedAt != nil) != wantPurged {
			t.Errorf("run_%d purged at %v, want purged %v", i, r.PurgedAt, wantPurged)
		}
	}
	// Every key was older than a day: reusing one starts a new run.
	nr := NewRun{ID: "run_again", OrgID: f.orgID, IdempotencyKey: "key-0", RequestHash: []byte("other"), Model: "m",
		TimeoutSeconds: 60, Reserve: 1000, CreatedAt: now, MaxActive: 10, Queued: Event{Category: "Queued", Message: "queued"}}
	if _, created, err := f.st.CreateRun(ctx, nr); err != nil || !created {
		t.Fatalf("reused a forgotten key: created %v, %v", created, err)
	}
	if n, err := f.st.PurgeExpired(ctx, now, 24*time.Hour); err != nil || n != 0 {
		t.Fatalf("second sweep purged %d (%v)", n, err)
	}
}

// A database of a build before incremental vacuum, with finished runs and
// one still running, is upgraded in place: its totals are counted once,
// and the space that purges free afterwards goes back to the file system.
func TestOpenUpgradesAnOlderDatabase(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	old, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	ms, err := migrations("sqlite")
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("recorded model turn ", 10_000) // 200 KB
	if _, err := old.ExecContext(ctx, ms[0].sql+";"+ms[1].sql+`;
		INSERT INTO orgs (id, name, created_at) VALUES ('org_1', 'acme', 0);
		INSERT INTO accounts (org_id, available, held, charged, credited) VALUES ('org_1', 9200, 500, 300, 10000);
		INSERT INTO runs (id, org_id, request_hash, model, zero_retention, timeout_seconds, status, created_at, reserved, charged, retention_until) VALUES
			('run_a', 'org_1', x'00', 'm', 0, 60, 'succeeded', 0, 1000, 100, 1),
			('run_b', 'org_1', x'00', 'm', 0, 60, 'succeeded', 0, 1000, 200, 1),
			('run_c', 'org_1', x'00', 'm', 0, 60, 'failed', 0, 1000, 0, 1),
			('run_d', 'org_1', x'00', 'm', 0, 60, 'running', 0, 500, 0, NULL);
		INSERT INTO recordings (run_id, data) SELECT id, ? FROM runs`, big); err != nil {
		t.Fatal(err)
	}
	old.Close()

	st, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	totals, err := st.Totals(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if totals.RunsByStatus[Succeeded] != 2 || totals.RunsByStatus[Failed] != 1 || totals.RunsByStatus[Running] != 1 ||
		totals.Held != 500 || totals.Charged != 300 {
		t.Fatalf("totals of the older database: %+v", totals)
	}

	before := fileSize(t, st, path)
	if n, err := st.PurgeExpired(ctx, time.Now(), 24*time.Hour); err != nil || n != 3 {
		t.Fatalf("purged %d (%v), want the 3 finished runs", n, err)
	}
	if _, err := st.ReclaimSpace(ctx); err != nil {
		t.Fatal(err)
	}
	if after := fileSize(t, st, path); after > before-3*len(big) {
		t.Fatalf("the file went from %d to %d bytes after purging 3 recordings of %d bytes", before, after, len(big))
	}
}

// fileSize is the size of the database file once the WAL is checkpointed
// into it.
func fileSize(t *testing.T, st *Store, path string) int {
	t.Helper()
	if err := st.Checkpoint(context.Background()); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return int(fi.Size())
}

func TestTotalsFollowRunsAsTheyFinish(t *testing.T) {
	ctx := context.Background()
	f := newRecordingFixture(t)
	for _, id := range []string{"run_ok", "run_failed", "run_waiting"} {
		f.queue(id, false)
	}
	if _, err := f.st.MarkRunning(ctx, "run_ok", "", time.Now()); err != nil {
		t.Fatal(err)
	}
	for id, fin := range map[string]Finish{
		"run_ok":     {Status: Succeeded, Cost: ledger.Cost{Model: 120, Compute: 30}},
		"run_failed": {Status: Failed, Cost: ledger.Cost{Compute: 7}, ErrorCode: "run_failed", ErrorMessage: "boom"},
	} {
		fin.At, fin.RetentionUntil = time.Now(), time.Now().Add(time.Hour)
		if _, err := f.st.FinishRun(ctx, id, fin, func(int64, int64) []Event { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	// Finishing again changes nothing, the totals included.
	if _, err := f.st.FinishRun(ctx, "run_ok", Finish{Status: Succeeded, At: time.Now()}, func(int64, int64) []Event { return nil }); !errors.Is(err, ErrNotFound) {
		t.Fatalf("finished a run twice: %v", err)
	}
	totals, err := f.st.Totals(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[Status]int64{Queued: 1, Succeeded: 1, Failed: 1}
	for _, s := range Statuses {
		if totals.RunsByStatus[s] != want[s] {
			t.Errorf("%s: %d runs, want %d", s, totals.RunsByStatus[s], want[s])
		}
	}
	// The figures agree with the ledger's accounts.
	a, err := f.st.Balance(ctx, f.orgID)
	if err != nil {
		t.Fatal(err)
	}
	if totals.Held != 1000 || totals.Charged != 157 || totals.Held != a.Held || totals.Charged != a.Charged {
		t.Fatalf("totals held %d charged %d; account %+v", totals.Held, totals.Charged, a)
	}
}
