package store

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/internal/pgtest"
)

// recordingFixture is a database with one funded organisation.
type recordingFixture struct {
	t     *testing.T
	st    *Store
	path  string
	orgID string
}

func newRecordingFixture(t *testing.T) *recordingFixture {
	t.Helper()
	ctx := context.Background()
	st, path := openTestStoreAt(t)
	org, err := st.CreateOrg(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Credit(ctx, org.ID, 1_000_000); err != nil {
		t.Fatal(err)
	}
	return &recordingFixture{t: t, st: st, path: path, orgID: org.ID}
}

// queue creates a queued run of the fixture's organisation.
func (f *recordingFixture) queue(id string, zeroRetention bool) {
	f.t.Helper()
	_, _, err := f.st.CreateRun(context.Background(), NewRun{ID: id, OrgID: f.orgID, RequestHash: []byte(id),
		Model: "m", ZeroRetention: zeroRetention, TimeoutSeconds: 60, Reserve: 1000, CreatedAt: time.Now(), MaxActive: 10,
		Queued: Event{Category: "Queued", Message: "queued"}})
	if err != nil {
		f.t.Fatal(err)
	}
}

func (f *recordingFixture) finish(id string, retentionUntil time.Time) {
	f.t.Helper()
	if _, err := f.st.FinishRun(context.Background(), id, Finish{Status: Succeeded, At: time.Now(), RetentionUntil: retentionUntil},
		func(int64, int64) []Event { return nil }); err != nil {
		f.t.Fatal(err)
	}
}

// diskHolds reports whether the database's files hold s, after a checkpoint
// has moved the WAL into the main file.
func (f *recordingFixture) diskHolds(s string) bool {
	f.t.Helper()
	if IsPostgresURL(f.path) {
		// What the database holds, as a dump shows it (bytea in hex).
		dump := pgtest.Shared(f.t).Dump(f.t, f.path)
		return bytes.Contains(dump, []byte(s)) || bytes.Contains(dump, []byte(hex.EncodeToString([]byte(s))))
	}
	if err := f.st.Checkpoint(context.Background()); err != nil {
		f.t.Fatal(err)
	}
	for _, suffix := range []string{"", "-wal", "-shm"} {
		b, err := os.ReadFile(f.path + suffix)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			f.t.Fatal(err)
		}
		if bytes.Contains(b, []byte(s)) {
			return true
		}
	}
	return false
}

// entryWith is an exchange entry big enough to spill into overflow pages,
// which secure delete must wipe too.
func entryWith(turn int, canary string) []byte {
	return []byte(fmt.Sprintf(`{"turn":%d,"request":{"kept_messages":0,"messages":[{"role":"user","text":"%s"}]},"response":{"text":"%s%s"}}`,
		turn, canary, strings.Repeat("x", 20_000), canary))
}

func TestRecordingIsKeptWithTheRunUntilPurged(t *testing.T) {
	ctx := context.Background()
	f := newRecordingFixture(t)
	const id, canary = "run_rec1", "REC-CANARY-3f9a"
	f.queue(id, false)
	if _, err := f.st.Recording(ctx, f.orgID, id); !errors.Is(err, ErrNotFound) {
		t.Fatalf("recording before any was saved: %v", err)
	}
	want := StoredRecording{Exchanges: [][]byte{entryWith(1, canary), entryWith(2, "turn two")}, Truncation: []byte(`{"kept_turns":2}`)}
	for i, e := range want.Exchanges {
		if err := f.st.AppendRecordingExchange(ctx, id, i+1, e); err != nil {
			t.Fatal(err)
		}
	}
	// A turn is stored once.
	if err := f.st.AppendRecordingExchange(ctx, id, 2, entryWith(2, "again")); err == nil {
		t.Fatal("stored turn 2 twice")
	}
	// A later mark replaces the earlier one.
	if err := f.st.SetRecordingTruncation(ctx, id, []byte(`{"kept_turns":1}`)); err != nil {
		t.Fatal(err)
	}
	if err := f.st.SetRecordingTruncation(ctx, id, want.Truncation); err != nil {
		t.Fatal(err)
	}
	f.finish(id, time.Now().Add(time.Hour))
	got, err := f.st.Recording(ctx, f.orgID, id)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("recording %.200q, %v", got, err)
	}
	if _, err := f.st.Recording(ctx, "org_other", id); !errors.Is(err, ErrNotFound) {
		t.Fatalf("another organisation read the recording: %v", err)
	}
	if !f.diskHolds(canary) {
		t.Fatal("canary not on disk before the purge: the search is broken")
	}

	if _, err := f.st.PurgeRun(ctx, f.orgID, id, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.Recording(ctx, f.orgID, id); !errors.Is(err, ErrNotFound) {
		t.Fatalf("recording after purge: %v", err)
	}
	if f.diskHolds(canary) {
		t.Fatal("purged recording still in the database files")
	}
	// A finished (here purged) run cannot be given its content back.
	if err := f.st.AppendRecordingExchange(ctx, id, 3, entryWith(3, canary)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("recorded a turn for a finished run: %v", err)
	}
	if err := f.st.SetRecordingTruncation(ctx, id, want.Truncation); !errors.Is(err, ErrNotFound) {
		t.Fatalf("marked the recording of a finished run: %v", err)
	}
}

// The turns a run made before its daemon died are in the database: the
// recording is written as it happens, not when the run ends.
func TestRecordingSurvivesACrashMidRun(t *testing.T) {
	ctx := context.Background()
	f := newRecordingFixture(t)
	const id = "run_rec_crash"
	f.queue(id, false)
	if err := f.st.AppendRecordingExchange(ctx, id, 1, entryWith(1, "before the crash")); err != nil {
		t.Fatal(err)
	}
	f.st.Close() // the daemon dies; nothing finishes the run
	st := reopenTestStore(t, f.path)
	got, err := st.Recording(ctx, f.orgID, id)
	if err != nil || len(got.Exchanges) != 1 || !bytes.Contains(got.Exchanges[0], []byte("before the crash")) {
		t.Fatalf("recording after a crash: %.80q, %v", got.Exchanges, err)
	}
}

// A recording an earlier daemon saved whole is still served, and purged.
func TestWholeRecordingsOfEarlierDaemonsAreServed(t *testing.T) {
	ctx := context.Background()
	f := newRecordingFixture(t)
	const id, canary = "run_rec_v1", "V1-CANARY-0b7e"
	f.queue(id, false)
	doc := []byte(`{"version":1,"exchanges":[{"turn":1,"request":{"model":"m","messages":[{"role":"user","text":"` +
		canary + strings.Repeat("x", 20_000) + `"}]},"response":{"text":"done"}}]}`)
	if _, err := f.st.write.ExecContext(ctx, `INSERT INTO recordings (run_id, data) VALUES (?, ?)`, id, string(doc)); err != nil {
		t.Fatal(err)
	}
	f.finish(id, time.Now().Add(time.Hour))
	got, err := f.st.Recording(ctx, f.orgID, id)
	if err != nil || !bytes.Equal(got.Document, doc) || got.Exchanges != nil {
		t.Fatalf("whole recording %.80q, %v", got.Document, err)
	}
	if _, err := f.st.PurgeRun(ctx, f.orgID, id, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.Recording(ctx, f.orgID, id); !errors.Is(err, ErrNotFound) || f.diskHolds(canary) {
		t.Fatalf("whole recording after purge: %v", err)
	}
}

func TestExpiredRecordingsArePurged(t *testing.T) {
	ctx := context.Background()
	f := newRecordingFixture(t)
	const expired, kept = "run_rec_expired", "run_rec_kept"
	now := time.Now()
	for id, until := range map[string]time.Time{expired: now.Add(-time.Minute), kept: now.Add(time.Hour)} {
		f.queue(id, false)
		if err := f.st.AppendRecordingExchange(ctx, id, 1, entryWith(1, "CANARY-"+id)); err != nil {
			t.Fatal(err)
		}
		if err := f.st.SetRecordingTruncation(ctx, id, []byte(`{"note":"MARK-`+id+`"}`)); err != nil {
			t.Fatal(err)
		}
		f.finish(id, until)
	}
	if n, err := f.st.PurgeExpired(ctx, now, 24*time.Hour); err != nil || n != 1 {
		t.Fatalf("purged %d: %v", n, err)
	}
	if _, err := f.st.Recording(ctx, f.orgID, expired); !errors.Is(err, ErrNotFound) {
		t.Fatalf("expired run's recording: %v", err)
	}
	if _, err := f.st.Recording(ctx, f.orgID, kept); err != nil {
		t.Fatalf("recording within retention: %v", err)
	}
	if f.diskHolds("CANARY-"+expired) || f.diskHolds("MARK-"+expired) || !f.diskHolds("CANARY-"+kept) {
		t.Fatal("the database files hold the expired recording or lost the kept one")
	}
}

func TestRecordingRefusals(t *testing.T) {
	ctx := context.Background()
	f := newRecordingFixture(t)
	const zdr, plain = "run_rec_zdr", "run_rec_plain"
	f.queue(zdr, true)
	f.queue(plain, false)
	if err := f.st.AppendRecordingExchange(ctx, zdr, 1, entryWith(1, "ZDR-CANARY")); !errors.Is(err, ErrZeroRetention) {
		t.Fatalf("zero-retention run: %v", err)
	}
	if err := f.st.SetRecordingTruncation(ctx, zdr, []byte(`{"x":"ZDR-CANARY"}`)); !errors.Is(err, ErrZeroRetention) {
		t.Fatalf("zero-retention run's mark: %v", err)
	}
	if f.diskHolds("ZDR-CANARY") {
		t.Fatal("zero-retention recording reached the database files")
	}
	if err := f.st.AppendRecordingExchange(ctx, "run_missing", 1, entryWith(1, "x")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown run: %v", err)
	}
	if err := f.st.AppendRecordingExchange(ctx, plain, 1, []byte(`{"turn":`)); err == nil {
		t.Fatal("stored an entry that is not JSON")
	}
	if err := f.st.SetRecordingTruncation(ctx, plain, []byte(`{`)); err == nil {
		t.Fatal("stored a mark that is not JSON")
	}
}
