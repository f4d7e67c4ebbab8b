package store

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/internal/pgtest"
)

// These tests always copy into PostgreSQL, whatever EPHEMERAL_TEST_DATABASE
// says: the copy is between the two dialects.

// openSQLiteForCopy opens an empty SQLite store, the source of a copy.
func openSQLiteForCopy(t *testing.T) *Store {
	t.Helper()
	st, err := Open(context.Background(), filepath.Join(t.TempDir(), "ephemeral.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// openPostgresForCopy opens a store on a new, empty PostgreSQL database,
// the target of a copy.
func openPostgresForCopy(t *testing.T) *Store {
	t.Helper()
	st, err := OpenPostgres(context.Background(), pgtest.Shared(t).NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// copyFixture is an install with a bit of everything: what a user of it
// checks after the move.
type copyFixture struct {
	acme, web Org
	user      User
	token     []byte // a session's token hash
	keyID     string
	runs      []string // acme's runs, oldest first
	outputs   map[string]Output
	slug      string
}

// notUTF8 are bytes no text column could hold: BYTEA must carry them as
// they are.
var notUTF8 = []byte{0xff, 0xfe, 0x00, 0x80, 'o', 'k', 0xc3}

func fillForCopy(t *testing.T, st *Store) copyFixture {
	t.Helper()
	ctx := context.Background()
	var f copyFixture
	var err error
	now := time.Now().UTC().Truncate(time.Millisecond)
	if f.acme, err = st.CreateOrg(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	for _, micros := range []int64{5_000_000, 1_234_567} {
		if _, err := st.Credit(ctx, f.acme.ID, micros); err != nil {
			t.Fatal(err)
		}
	}
	m, err := st.AddMember(ctx, f.acme.ID, "dev@acme.example")
	if err != nil {
		t.Fatal(err)
	}
	f.keyID = "key0001"
	if err := st.AddKey(ctx, m, f.keyID, append([]byte("hash"), notUTF8...)); err != nil {
		t.Fatal(err)
	}
	if err := st.TouchKey(ctx, f.keyID, now); err != nil {
		t.Fatal(err)
	}
	if err := st.AddConnection(ctx, ConnectionRecord{OrgID: f.acme.ID, Name: "crm", BaseURL: "https://crm.example/api",
		Methods: []string{"GET", "HEAD"}, SealedHeaders: notUTF8, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := st.SetWebhookSecret(ctx, f.acme.ID, append([]byte("sealed"), notUTF8...), now); err != nil {
		t.Fatal(err)
	}

	// A web user, signed in, with attempts counted.
	if f.user, err = st.CreateAccount(ctx, NewAccount{Email: "Ada@Example.org", PasswordHash: "$argon2id$x", StarterCredit: 2_000_000, At: now}); err != nil {
		t.Fatal(err)
	}
	if f.web, err = st.OrgByName(ctx, "Ada@Example.org"); err != nil {
		t.Fatal(err)
	}
	f.token = append([]byte("tok"), notUTF8...)
	if err := st.CreateSession(ctx, f.token, f.user.ID, now, now.Add(24*time.Hour), nil); err != nil {
		t.Fatal(err)
	}
	if err := st.RecordAttempt(ctx, now, now.Add(-time.Hour), "sign-in-account:ada@example.org"); err != nil {
		t.Fatal(err)
	}

	// Finished runs, each with events, a recording, an output, and one
	// with a webhook delivered.
	f.outputs = map[string]Output{}
	for i, status := range []Status{Succeeded, Failed, Canceled, Succeeded} {
		id := "run_copy_" + string(rune('a'+i))
		nr := NewRun{ID: id, OrgID: f.acme.ID, RequestHash: []byte(id), Request: json.RawMessage(`{"prompt":"p` + id + `"}`),
			Model: "m", TimeoutSeconds: 60, Reserve: 100_000, CreatedAt: now.Add(time.Duration(i) * time.Second),
			MaxActive: 10, Queued: Event{Category: "Queued", Message: "queued"}}
		if i == 0 {
			nr.WebhookURL = "https://hooks.example/run"
			nr.IdempotencyKey = "idem-1"
		}
		if _, _, err := st.CreateRun(ctx, nr); err != nil {
			t.Fatal(err)
		}
		if _, err := st.MarkRunning(ctx, id, "", now); err != nil {
			t.Fatal(err)
		}
		ev, err := st.AppendEvent(ctx, id, Event{T: time.Second, Category: "Shell", Message: "ls", Data: json.RawMessage(`{"cmd":"ls"}`), Content: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.AmendEventData(ctx, id, ev.Seq, json.RawMessage(`{"cmd":"ls","exit":0}`), true); err != nil {
			t.Fatal(err)
		}
		for turn := 1; turn <= 2; turn++ {
			if err := st.AppendRecordingExchange(ctx, id, turn, []byte(`{"turn":`+string(rune('0'+turn))+`,"text":"héllo"}`)); err != nil {
				t.Fatal(err)
			}
		}
		out := Output{Path: "out/data.bin", Size: int64(len(notUTF8) + i), ContentType: "application/octet-stream",
			SHA256: bytes.Repeat([]byte{0xee}, 32), Data: append(append([]byte{}, notUTF8...), bytes.Repeat([]byte{0x9f}, i)...)}
		if err := st.AddOutput(ctx, id, out); err != nil {
			t.Fatal(err)
		}
		f.outputs[id] = out
		cost := ledger.Cost{Model: 1000 * int64(i+1), Web: 10, Compute: 333}
		msg := "done"
		if _, err := st.FinishRun(ctx, id, Finish{Status: status, Output: &msg, Usage: ledger.Usage{ModelCalls: 2, InputTokens: 40, VMTime: 1500 * time.Millisecond},
			Cost: cost, At: now.Add(time.Minute), RetentionUntil: now.Add(30 * 24 * time.Hour)},
			func(charged, released int64) []Event {
				return []Event{{T: 2 * time.Second, Category: "Finished", Message: string(status)}}
			}); err != nil {
			t.Fatal(err)
		}
		f.runs = append(f.runs, id)
	}
	if err := st.RecordWebhookAttempt(ctx, f.runs[0], WebhookAttempt{Attempt: 1, StartedAt: now, Duration: 120 * time.Millisecond, StatusCode: 204},
		WebhookOutcome{State: WebhookDelivered, Event: &Event{T: 3 * time.Second, Category: "Webhook", Message: "delivered"}}); err != nil {
		t.Fatal(err)
	}
	// An earlier daemon's whole recording document.
	if _, err := st.write.ExecContext(ctx, `INSERT INTO recordings (run_id, data) VALUES (?, ?)`, f.runs[3], `{"version":1}`); err != nil {
		t.Fatal(err)
	}
	f.slug = "pub-slug-1"
	if _, err := st.PublishRun(ctx, f.acme.ID, f.runs[1], f.slug, now); err != nil {
		t.Fatal(err)
	}
	if _, err := st.PurgeRun(ctx, f.acme.ID, f.runs[2], now); err != nil {
		t.Fatal(err)
	}
	return f
}

// equal fails the test when what the two stores answer differs.
func equal[T any](t *testing.T, what string, read func(*Store) (T, error), src, dst *Store) {
	t.Helper()
	want, err := read(src)
	if err != nil {
		t.Fatalf("%s in the source: %v", what, err)
	}
	got, err := read(dst)
	if err != nil {
		t.Fatalf("%s in the target: %v", what, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s differs after the copy:\n got %+v\nwant %+v", what, got, want)
	}
}

// What a user checks after moving up — balances, runs with their
// statuses and costs, timelines, recordings, output files, keys,
// sessions, connections, webhooks — is the same on PostgreSQL, and the
// target makes new runs and ledger entries after the copied ones.
func TestCopyMovesAnInstallToPostgreSQL(t *testing.T) {
	ctx := context.Background()
	src, dst := openSQLiteForCopy(t), openPostgresForCopy(t)
	f := fillForCopy(t, src)

	rep, err := Copy(ctx, src, dst)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("report:\n%s", rep)
	if rep.Orgs != 2 || rep.Credited != 5_000_000+1_234_567+2_000_000 || rep.Held != 0 ||
		rep.Available+rep.Charged != rep.Credited || rep.Charged == 0 {
		t.Errorf("report %+v", rep)
	}
	counts := map[string]int64{}
	for _, tc := range rep.Tables {
		counts[tc.Table] = tc.Rows
	}
	for table, want := range map[string]int64{"orgs": 2, "runs": 4, "run_outputs": 3, "recording_exchanges": 6,
		"sessions": 1, "webhook_attempts": 1, "published_runs": 1, "ledger_entries": 3 + 4*3} {
		if counts[table] != want {
			t.Errorf("report: %s has %d rows, want %d", table, counts[table], want)
		}
	}
	if _, ok := counts["schema_migrations"]; ok {
		t.Error("schema_migrations was copied")
	}
	if s := rep.String(); !strings.Contains(s, "copied 2 organisations") || !strings.Contains(s, "$8.234567") {
		t.Errorf("summary:\n%s", s)
	}

	for _, org := range []Org{f.acme, f.web} {
		equal(t, "balance of "+org.Name, func(st *Store) (ledger.Account, error) { return st.Balance(ctx, org.ID) }, src, dst)
		equal(t, "org "+org.Name, func(st *Store) (Org, error) { return st.OrgByName(ctx, org.Name) }, src, dst)
		equal(t, "members of "+org.Name, func(st *Store) ([]Member, error) { return st.Members(ctx, org.ID) }, src, dst)
		equal(t, "keys of "+org.Name, func(st *Store) ([]KeyInfo, error) { return st.Keys(ctx, org.ID) }, src, dst)
	}
	equal(t, "runs", func(st *Store) ([]Run, error) { r, _, err := st.ListRuns(ctx, f.acme.ID, "", 100); return r, err }, src, dst)
	equal(t, "succeeded runs", func(st *Store) ([]Run, error) {
		r, _, err := st.ListRunsWithStatus(ctx, f.acme.ID, Succeeded, "", 100)
		return r, err
	}, src, dst)
	equal(t, "totals", func(st *Store) (Totals, error) { return st.Totals(ctx) }, src, dst)
	equal(t, "outputs", func(st *Store) (map[string][]Output, error) { return st.OutputsOf(ctx, f.runs) }, src, dst)
	for _, id := range f.runs {
		equal(t, "timeline of "+id, func(st *Store) ([]Event, error) { return st.Events(ctx, id, 0, 1000) }, src, dst)
		if id == f.runs[2] {
			continue // purged: no recording, no output
		}
		equal(t, "recording of "+id, func(st *Store) (StoredRecording, error) { return st.Recording(ctx, f.acme.ID, id) }, src, dst)
		got, err := dst.Output(ctx, id, "out/data.bin")
		if want := f.outputs[id]; err != nil || !bytes.Equal(got.Data, want.Data) || !bytes.Equal(got.SHA256, want.SHA256) {
			t.Errorf("output of %s: %x, %v; want %x", id, got.Data, err, want.Data)
		}
	}
	type webhook struct {
		D WebhookDelivery
		A []WebhookAttempt
	}
	equal(t, "webhook", func(st *Store) (webhook, error) { d, a, err := st.Webhook(ctx, f.runs[0]); return webhook{d, a}, err }, src, dst)
	equal(t, "connection", func(st *Store) (ConnectionRecord, error) { return st.Connection(ctx, f.acme.ID, "crm") }, src, dst)
	equal(t, "webhook secret", func(st *Store) ([]byte, error) { s, _, err := st.WebhookSecret(ctx, f.acme.ID); return s, err }, src, dst)
	equal(t, "key", func(st *Store) (APIKey, error) { return st.KeyByID(ctx, f.keyID) }, src, dst)
	equal(t, "user", func(st *Store) (User, error) { return st.UserByEmail(ctx, "ada@EXAMPLE.org") }, src, dst)
	now := time.Now()
	equal(t, "session", func(st *Store) (Session, error) { return st.SessionByToken(ctx, f.token, now, now.Add(-time.Hour)) }, src, dst)
	equal(t, "published run", func(st *Store) (Run, error) { return st.PublishedRun(ctx, f.slug) }, src, dst)
	equal(t, "attempts", func(st *Store) (int, error) {
		n, _, err := st.Attempts(ctx, "sign-in-account:ada@example.org", now.Add(-time.Hour))
		return n, err
	}, src, dst)

	// The target goes on: a new run and a new credit get numbers after
	// the copied ones, not a duplicate key.
	nr := NewRun{ID: "run_after_copy", OrgID: f.acme.ID, RequestHash: []byte("x"), Model: "m", TimeoutSeconds: 60,
		Reserve: 1000, CreatedAt: time.Now(), MaxActive: 10, Queued: Event{Category: "Queued", Message: "queued"}}
	if _, _, err := dst.CreateRun(ctx, nr); err != nil {
		t.Fatalf("new run on the target: %v", err)
	}
	if runs, _, err := dst.ListRuns(ctx, f.acme.ID, "", 1); err != nil || len(runs) != 1 || runs[0].ID != nr.ID {
		t.Errorf("newest run on the target: %+v, %v; want %s", runs, err, nr.ID)
	}
	if _, err := dst.Credit(ctx, f.web.ID, 1); err != nil {
		t.Fatalf("new credit on the target: %v", err)
	}

	// The target holds data now: a second copy is refused.
	if _, err := Copy(ctx, src, dst); err == nil || !strings.Contains(err.Error(), "the target database is not empty") {
		t.Errorf("second copy: %v", err)
	}
}

// Tables of more rows than one INSERT takes, and files of more bytes
// than one INSERT carries, arrive whole.
func TestCopyBatchesLargeTables(t *testing.T) {
	ctx := context.Background()
	src, dst := openSQLiteForCopy(t), openPostgresForCopy(t)
	const attempts = 2*copyBatchRows + 7
	if _, err := src.write.ExecContext(ctx, `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
		INSERT INTO auth_attempts (key, window_start, attempts) SELECT 'key-' || i, i, i FROM n`, attempts); err != nil {
		t.Fatal(err)
	}
	org, err := src.CreateOrg(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Credit(ctx, org.ID, 10_000); err != nil {
		t.Fatal(err)
	}
	if _, _, err := src.CreateRun(ctx, NewRun{ID: "run_big", OrgID: org.ID, RequestHash: []byte("b"), Model: "m",
		TimeoutSeconds: 60, Reserve: 1000, CreatedAt: time.Now(), MaxActive: 10, Queued: Event{Category: "Queued", Message: "queued"}}); err != nil {
		t.Fatal(err)
	}
	big := map[string][]byte{}
	for i := range 3 {
		path := "out/" + string(rune('a'+i))
		big[path] = bytes.Repeat([]byte{0xff, byte(i)}, copyBatchBytes/4)
		if err := src.AddOutput(ctx, "run_big", Output{Path: path, Size: int64(len(big[path])), SHA256: []byte{1}, ContentType: "x", Data: big[path]}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := src.FinishRun(ctx, "run_big", Finish{Status: Succeeded, At: time.Now(), RetentionUntil: time.Now().Add(time.Hour)},
		func(int64, int64) []Event { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := Copy(ctx, src, dst); err != nil {
		t.Fatal(err)
	}
	var n, sum int64
	if err := dst.read.QueryRow(`SELECT count(*), sum(attempts) FROM auth_attempts`).Scan(&n, &sum); err != nil || n != attempts || sum != attempts*(attempts+1)/2 {
		t.Errorf("auth_attempts on the target: %d rows summing to %d, %v", n, sum, err)
	}
	for path, want := range big {
		if got, err := dst.Output(ctx, "run_big", path); err != nil || !bytes.Equal(got.Data, want) {
			t.Errorf("output %s on the target: %d bytes, %v; want %d", path, len(got.Data), err, len(want))
		}
	}
}

// A run still queued or running belongs to the daemon that has it: the
// copy waits for it to finish and leaves the target untouched.
func TestCopyRefusesActiveRuns(t *testing.T) {
	ctx := context.Background()
	src, dst := openSQLiteForCopy(t), openPostgresForCopy(t)
	org, err := src.CreateOrg(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Credit(ctx, org.ID, 10_000); err != nil {
		t.Fatal(err)
	}
	if _, _, err := src.CreateRun(ctx, NewRun{ID: "run_queued", OrgID: org.ID, RequestHash: []byte("q"), Model: "m",
		TimeoutSeconds: 60, Reserve: 1000, CreatedAt: time.Now(), MaxActive: 10, Queued: Event{Category: "Queued", Message: "queued"}}); err != nil {
		t.Fatal(err)
	}
	_, err = Copy(ctx, src, dst)
	if err == nil || !strings.Contains(err.Error(), "stop the daemon and let runs finish first; 1 runs are queued or running") {
		t.Fatalf("copy with a queued run: %v", err)
	}
	assertEmpty(t, dst)
}

// A value PostgreSQL cannot store, found after other tables were copied,
// fails the copy and leaves the target empty: one transaction.
func TestCopyFailureLeavesTheTargetEmpty(t *testing.T) {
	ctx := context.Background()
	src, dst := openSQLiteForCopy(t), openPostgresForCopy(t)
	f := fillForCopy(t, src)
	// Text with a NUL byte: SQLite keeps it, PostgreSQL's TEXT cannot.
	if _, err := src.write.ExecContext(ctx, `UPDATE webhook_attempts SET error = ? WHERE run_id = ?`, "bad\x00text", f.runs[0]); err != nil {
		t.Fatal(err)
	}
	_, err := Copy(ctx, src, dst)
	if err == nil || !strings.Contains(err.Error(), "copy table webhook_attempts: column error") {
		t.Fatalf("copy of a NUL byte: %v", err)
	}
	assertEmpty(t, dst)
}

// Money that does not add up in the source is not copied anywhere.
func TestCopyRefusesMoneyThatDoesNotAddUp(t *testing.T) {
	ctx := context.Background()
	src, dst := openSQLiteForCopy(t), openPostgresForCopy(t)
	org, err := src.CreateOrg(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Credit(ctx, org.ID, 10_000); err != nil {
		t.Fatal(err)
	}
	// A credit entry with no credit behind it.
	if _, err := src.write.ExecContext(ctx, `INSERT INTO ledger_entries (org_id, kind, micros, created_at) VALUES (?, 'credit', 5, 0)`, org.ID); err != nil {
		t.Fatal(err)
	}
	_, err = Copy(ctx, src, dst)
	if err == nil || !strings.Contains(err.Error(), "credit entries of org "+org.ID+" add up to 10005 micros but 10000 were credited") {
		t.Fatalf("copy of bad money: %v", err)
	}
	assertEmpty(t, dst)
}

// Stores of different schema versions, or the wrong way round, are refused.
func TestCopyRefusesMismatchedStores(t *testing.T) {
	ctx := context.Background()
	src, dst := openSQLiteForCopy(t), openPostgresForCopy(t)
	if _, err := Copy(ctx, dst, src); err == nil || !strings.Contains(err.Error(), "must be an SQLite store") {
		t.Errorf("PostgreSQL to SQLite: %v", err)
	}
	if _, err := Copy(ctx, src, openSQLiteForCopy(t)); err == nil || !strings.Contains(err.Error(), "must be an SQLite store") {
		t.Errorf("SQLite to SQLite: %v", err)
	}
	if _, err := src.write.ExecContext(ctx, `DELETE FROM schema_migrations WHERE version = (SELECT max(version) FROM schema_migrations)`); err != nil {
		t.Fatal(err)
	}
	if _, err := Copy(ctx, src, dst); err == nil || !strings.Contains(err.Error(), "open both with the same build") {
		t.Errorf("different versions: %v", err)
	}
}

// Parents come before children, and a cycle is named.
func TestCopyOrdersTablesParentsFirst(t *testing.T) {
	plans := []tablePlan{
		{table: "events", parents: []string{"runs"}},
		{table: "runs", parents: []string{"orgs", "runs"}},
		{table: "accounts"},
		{table: "orgs", parents: []string{"river_job"}}, // not copied: no constraint
		{table: "users", parents: []string{"orgs", "members"}},
		{table: "members", parents: []string{"orgs"}},
	}
	got, err := parentsFirst(plans)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range got {
		names = append(names, p.table)
	}
	if want := "accounts orgs members runs events users"; strings.Join(names, " ") != want {
		t.Errorf("order %v, want %s", names, want)
	}
	_, err = parentsFirst([]tablePlan{{table: "a", parents: []string{"b"}}, {table: "b", parents: []string{"a"}}, {table: "c"}})
	if err == nil || !strings.Contains(err.Error(), "tables a, b form a cycle") {
		t.Errorf("cycle: %v", err)
	}
}

// SQLite hands back what was written whatever the column's declared type;
// the target's type decides what PostgreSQL is given.
func TestCopyConvertsValuesToTheTargetType(t *testing.T) {
	for _, c := range []struct {
		v        any
		dataType string
		want     any
	}{
		{"abc", "bytea", []byte("abc")},
		{[]byte{1, 2}, "bytea", []byte{1, 2}},
		{[]byte("héllo"), "text", "héllo"},
		{int64(7), "text", "7"},
		{float64(3), "bigint", int64(3)},
		{int64(1), "boolean", true},
		{nil, "text", nil},
		{nil, "bytea", nil},
	} {
		got, err := toTarget(c.v, c.dataType)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("toTarget(%#v, %s) = %#v, %v; want %#v", c.v, c.dataType, got, err, c.want)
		}
	}
	if _, err := toTarget([]byte{0xff}, "text"); err == nil {
		t.Error("invalid UTF-8 into text: no error")
	}
}

// assertEmpty fails the test when the store holds an organisation or an
// account.
func assertEmpty(t *testing.T, st *Store) {
	t.Helper()
	var orgs, accounts, runs int
	if err := st.read.QueryRow(`SELECT (SELECT count(*) FROM orgs), (SELECT count(*) FROM accounts), (SELECT count(*) FROM runs)`).
		Scan(&orgs, &accounts, &runs); err != nil {
		t.Fatal(err)
	}
	if orgs+accounts+runs != 0 {
		t.Errorf("target holds %d orgs, %d accounts, %d runs; want it empty", orgs, accounts, runs)
	}
}
