package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

func (f *recordingFixture) appendEvent(runID string, e Event) Event {
	f.t.Helper()
	e, err := f.st.AppendEvent(context.Background(), runID, e)
	if err != nil {
		f.t.Fatal(err)
	}
	return e
}

func TestAmendedEventKeepsItsPlaceAndTakesTheNextRevision(t *testing.T) {
	ctx := context.Background()
	f := newRecordingFixture(t)
	const id = "run_amend"
	f.queue(id, false)
	cmd := f.appendEvent(id, Event{T: 5 * time.Second, Category: "Shell", Message: "$ sleep 60", Data: json.RawMessage(`{"state":"running"}`), Content: true})
	later := f.appendEvent(id, Event{T: 6 * time.Second, Category: "Shell", Message: "$ true", Content: true})
	if cmd.Seq != 2 || cmd.Rev != 2 || later.Seq != 3 || later.Rev != 3 {
		t.Fatalf("appended seq/rev %d/%d and %d/%d, want 2/2 and 3/3", cmd.Seq, cmd.Rev, later.Seq, later.Rev)
	}

	amended, err := f.st.AmendEventData(ctx, id, cmd.Seq, json.RawMessage(`{"state":"done","exit_code":0}`), true)
	if err != nil {
		t.Fatal(err)
	}
	if amended.Seq != cmd.Seq || amended.Rev != 4 || amended.Message != cmd.Message || amended.T != cmd.T {
		t.Fatalf("amended event %+v, want seq %d, rev 4, message and t unchanged", amended, cmd.Seq)
	}

	// The timeline lists each event once, in its place, as amended.
	list, err := f.st.Events(ctx, id, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 || list[1].Seq != cmd.Seq || string(list[1].Data) != `{"state":"done","exit_code":0}` {
		t.Fatalf("events after the amendment: %+v", list)
	}
	// A reader that saw revision 3 gets the amended event and nothing else.
	since, err := f.st.EventsSince(ctx, id, 3, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(since) != 1 || since[0].Seq != cmd.Seq || since[0].Rev != 4 {
		t.Fatalf("events since revision 3: %+v", since)
	}
	// The next append comes after the amendment's revision.
	if next := f.appendEvent(id, Event{Category: "MicroVM", Message: "microVM destroyed"}); next.Seq != 4 || next.Rev != 5 {
		t.Fatalf("append after amendment: seq/rev %d/%d, want 4/5", next.Seq, next.Rev)
	}
}

func TestAmendRefusesOtherRunsAndUnknownEvents(t *testing.T) {
	ctx := context.Background()
	f := newRecordingFixture(t)
	f.queue("run_mine", false)
	f.queue("run_other", false)
	mine := f.appendEvent("run_mine", Event{Category: "Shell", Message: "$ ls", Data: json.RawMessage(`{"state":"running"}`), Content: true})
	for _, tt := range []struct {
		run string
		seq int64
	}{{"run_other", mine.Seq + 5}, {"run_missing", mine.Seq}, {"run_mine", mine.Seq + 1}} {
		if _, err := f.st.AmendEventData(ctx, tt.run, tt.seq, json.RawMessage(`{"state":"hijacked"}`), false); !errors.Is(err, ErrNotFound) {
			t.Errorf("amend event %d of %s: %v, want ErrNotFound", tt.seq, tt.run, err)
		}
	}
	// run_other's own event 2 does not exist either: its seq numbers are its own.
	if _, err := f.st.AmendEventData(ctx, "run_other", mine.Seq, json.RawMessage(`{"state":"hijacked"}`), false); !errors.Is(err, ErrNotFound) {
		t.Errorf("amend run_other's event %d: %v", mine.Seq, err)
	}
	list, err := f.st.Events(ctx, "run_mine", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if string(list[len(list)-1].Data) != `{"state":"running"}` {
		t.Fatalf("a refused amendment changed the event: %s", list[len(list)-1].Data)
	}
}

func TestAmendedContentIsPurgedWithTheRun(t *testing.T) {
	ctx := context.Background()
	f := newRecordingFixture(t)
	const id, canary = "run_amend_purge", "AMEND-CANARY-71c2"
	f.queue(id, false)
	// Appended without content (a system word), amended with output.
	ev := f.appendEvent(id, Event{Category: "Shell", Message: "running", Data: json.RawMessage(`{"state":"running"}`)})
	if _, err := f.st.AmendEventData(ctx, id, ev.Seq, json.RawMessage(`{"stdout":"`+canary+`"}`), true); err != nil {
		t.Fatal(err)
	}
	f.finish(id, time.Now().Add(time.Hour))
	if !f.diskHolds(canary) {
		t.Fatal("canary not on disk before the purge: the search is broken")
	}
	if _, err := f.st.PurgeRun(ctx, f.orgID, id, time.Now()); err != nil {
		t.Fatal(err)
	}
	if f.diskHolds(canary) {
		t.Fatal("amended output survived the purge")
	}
	// Nothing can be written back into a purged run.
	if _, err := f.st.AmendEventData(ctx, id, ev.Seq, json.RawMessage(`{"stdout":"`+canary+`"}`), true); !errors.Is(err, ErrNotFound) {
		t.Fatalf("amended a purged run's event: %v", err)
	}
	if f.diskHolds(canary) {
		t.Fatal("amendment after the purge reached the database files")
	}
}

func TestOpenAddsRevisionsToAnOlderDatabase(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	old, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	// The schema as daemons before revisions (and schema versions) created it.
	ms, err := migrations("sqlite")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.ExecContext(ctx, ms[0].sql+`;
		INSERT INTO events (run_id, seq, t_millis, category, message) VALUES ('run_old', 1, 0, 'Queued', 'a'), ('run_old', 2, 10, 'MicroVM', 'b')`); err != nil {
		t.Fatal(err)
	}
	old.Close()

	st, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	since, err := st.EventsSince(ctx, "run_old", 1, 10)
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(since) != 1 || since[0].Seq != 2 || since[0].Rev != 2 {
		t.Fatalf("old events since revision 1: %+v, want event 2 at revision 2", since)
	}
	// Opening again finds the column and leaves the revisions alone.
	if st, err = Open(ctx, path); err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if again, err := st.EventsSince(ctx, "run_old", 0, 10); err != nil || len(again) != 2 || again[1].Rev != 2 {
		t.Fatalf("second open: %+v, %v", again, err)
	}
}
