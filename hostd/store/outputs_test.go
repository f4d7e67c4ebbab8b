package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"strings"
	"testing"
	"time"
)

func output(path, content string) Output {
	sum := sha256.Sum256([]byte(content))
	return Output{Path: path, Size: int64(len(content)), SHA256: sum[:], ContentType: "text/plain; charset=utf-8", Data: []byte(content)}
}

func TestOutputsAreKeptWithTheRunUntilPurged(t *testing.T) {
	ctx := context.Background()
	f := newRecordingFixture(t)
	const id, canary = "run_out1", "OUT-CANARY-71c2"
	big := canary + strings.Repeat("x", 50_000) // spills into overflow pages
	f.queue(id, false)
	for _, o := range []Output{output("report.md", "# report"), output("out/a.csv", big)} {
		if err := f.st.AddOutput(ctx, id, o); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.st.AddOutput(ctx, id, output("report.md", "again")); err == nil {
		t.Error("stored report.md twice")
	}
	bad := output("short.txt", "abc")
	bad.Size = 2
	if err := f.st.AddOutput(ctx, id, bad); err == nil {
		t.Error("stored an output whose size is not its data's")
	}
	f.finish(id, time.Now().Add(time.Hour))

	listed, err := f.st.OutputsOf(ctx, []string{id, "run_none"})
	if err != nil {
		t.Fatal(err)
	}
	got := listed[id]
	if len(got) != 2 || got[0].Path != "out/a.csv" || got[1].Path != "report.md" || got[0].Size != int64(len(big)) ||
		got[0].Data != nil || len(listed["run_none"]) != 0 {
		t.Fatalf("listed %+v", listed)
	}
	o, err := f.st.Output(ctx, id, "out/a.csv")
	if want := output("out/a.csv", big); err != nil || !bytes.Equal(o.Data, want.Data) || !bytes.Equal(o.SHA256, want.SHA256) {
		t.Fatalf("output: %v", err)
	}
	if _, err := f.st.Output(ctx, id, "out/b.csv"); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown output: %v", err)
	}
	// A finished run cannot be given more.
	if err := f.st.AddOutput(ctx, id, output("late.txt", "late")); !errors.Is(err, ErrNotFound) {
		t.Errorf("output added to a finished run: %v", err)
	}
	if !f.diskHolds(canary) {
		t.Fatal("canary not on disk before the purge: the search is broken")
	}

	if _, err := f.st.PurgeRun(ctx, f.orgID, id, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.Output(ctx, id, "out/a.csv"); !errors.Is(err, ErrNotFound) {
		t.Errorf("output after purge: %v", err)
	}
	if listed, err := f.st.OutputsOf(ctx, []string{id}); err != nil || len(listed[id]) != 0 {
		t.Errorf("outputs listed after purge: %+v, %v", listed, err)
	}
	if f.diskHolds(canary) {
		t.Error("purged output still in the database files")
	}
}

func TestExpiredOutputsArePurgedAndZeroRetentionOnesNeverStored(t *testing.T) {
	ctx := context.Background()
	f := newRecordingFixture(t)
	now := time.Now()
	for id, until := range map[string]time.Time{"run_out_expired": now.Add(-time.Minute), "run_out_kept": now.Add(time.Hour)} {
		f.queue(id, false)
		if err := f.st.AddOutput(ctx, id, output("o.txt", "CANARY-"+id+strings.Repeat("y", 8000))); err != nil {
			t.Fatal(err)
		}
		f.finish(id, until)
	}
	f.queue("run_out_zdr", true)
	if err := f.st.AddOutput(ctx, "run_out_zdr", output("o.txt", "ZDR-OUTPUT-CANARY")); !errors.Is(err, ErrZeroRetention) {
		t.Errorf("zero-retention output: %v", err)
	}
	if n, err := f.st.PurgeExpired(ctx, now, 24*time.Hour); err != nil || n != 1 {
		t.Fatalf("purged %d: %v", n, err)
	}
	if _, err := f.st.Output(ctx, "run_out_expired", "o.txt"); !errors.Is(err, ErrNotFound) {
		t.Errorf("expired run's output: %v", err)
	}
	if _, err := f.st.Output(ctx, "run_out_kept", "o.txt"); err != nil {
		t.Errorf("output within retention: %v", err)
	}
	if f.diskHolds("CANARY-run_out_expired") || !f.diskHolds("CANARY-run_out_kept") || f.diskHolds("ZDR-OUTPUT-CANARY") {
		t.Error("the database files hold an expired or zero-retention output, or lost the kept one")
	}
}
