package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
)

// No request or janitor sweep may slow down as history grows: no statement
// the store issues may read rows in proportion to history. The test below
// calls every method of Store through a driver that records each
// statement with its arguments, then asks SQLite for each one's query plan.

// boundedTables do not grow with use (a row per migration, per terminal
// status, per table or column of the schema, per machine that served as a
// node): scanning them costs the same at any age. Every other table does.
var boundedTables = []string{"schema_migrations", "finished_run_totals", "sqlite_master", "sqlite_schema", "pragma_table_info", "nodes"}

func TestNoStatementReadsHistory(t *testing.T) {
	ctx := context.Background()
	log := recordStatements(t)
	path := filepath.Join(t.TempDir(), "ephemeral.db")
	st, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	tour := storeTour(ctx, st)
	var toured []string
	for _, step := range tour {
		toured = append(toured, step.method)
		if err := step.call(); err != nil {
			t.Fatalf("%s: %v", step.method, err)
		}
	}
	// A method added to Store without a step here would go unchecked.
	typ := reflect.TypeOf(st)
	for i := range typ.NumMethod() {
		if name := typ.Method(i).Name; !slices.Contains(toured, name) {
			t.Errorf("the tour does not call Store.%s: add it to storeTour", name)
		}
	}

	// Explain on a fresh connection of the same file, after the tour's Close.
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	statements := log.statements()
	if len(statements) < 40 {
		t.Fatalf("recorded only %d statements: is the recording driver in use?", len(statements))
	}
	explained := 0
	for _, s := range statements {
		if !isDML(s.query) || isMigration(t, s.query) {
			continue
		}
		explained++
		reads, err := historyReads(ctx, db, s.query, s.args)
		if err != nil {
			t.Errorf("explain %s: %v", s.query, err)
			continue
		}
		if len(reads) > 0 {
			t.Errorf("%s\n\treads history: %s", oneLine(s.query), strings.Join(reads, "; "))
		}
	}
	t.Logf("explained %d of %d statements", explained, len(statements))
}

// The check can fail: queries like those that made /metrics, CreateRun
// and the janitor slow down with history are reported.
func TestPlanCheckFindsHistoryReads(t *testing.T) {
	ctx := context.Background()
	st, err := Open(ctx, filepath.Join(t.TempDir(), "ephemeral.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, q := range []string{
		`SELECT status, count(*) FROM runs GROUP BY status`,
		`SELECT count(*) FROM runs r WHERE r.model = ?`,
		`SELECT count(*) FROM runs WHERE org_id = ? AND model = ?`,
		`SELECT count(*) FROM runs WHERE status = 'succeeded'`,
		`SELECT id FROM runs WHERE org_id = ? AND status = ? AND seq < ? ORDER BY seq DESC`, // no LIMIT
		`SELECT id FROM runs WHERE org_id = ? AND status = ? ORDER BY created_at LIMIT 5`,   // sorted apart
		`SELECT id FROM runs WHERE org_id = ? ORDER BY created_at LIMIT 5`,
		`SELECT id FROM runs WHERE retention_until <= ?`, // purged runs too: not the partial index
		`UPDATE events SET message = '' WHERE content = 1`,
	} {
		args := make([]any, strings.Count(q, "?"))
		reads, err := historyReads(ctx, st.read, q, args)
		if err != nil {
			t.Fatal(err)
		}
		if len(reads) == 0 {
			t.Errorf("%s: not reported", q)
		}
	}
}

// tourStep calls one method of Store.
type tourStep struct {
	method string
	call   func() error
}

// storeTour exercises every method of Store, each along the path a
// request or the janitor takes, on a database with a little history.
func storeTour(ctx context.Context, st *Store) []tourStep {
	var org Org
	var member Member
	var user User
	old := time.Now().Add(-48 * time.Hour)
	newRun := func(id, key string) NewRun {
		return NewRun{ID: id, OrgID: org.ID, IdempotencyKey: key, RequestHash: []byte(key), Request: json.RawMessage(`{"prompt":"p"}`),
			Model: "m", TimeoutSeconds: 60, Reserve: 1000, CreatedAt: old, MaxActive: 10, Queued: Event{Category: "Queued", Message: "queued"},
			WebhookURL: "https://hooks.acme.test/" + id}
	}
	finish := func(id string, until time.Time) error {
		out := "output"
		_, err := st.FinishRun(ctx, id, Finish{Status: Succeeded, Output: &out, Cost: ledger.Cost{Model: 10}, At: time.Now(), RetentionUntil: until},
			func(charged, released int64) []Event {
				return []Event{{Category: "Worker destroyed", Message: "settled"}}
			})
		return err
	}
	return []tourStep{
		{"Ping", func() error { return st.Ping(ctx) }},
		// Accessors: they run no statement.
		{"Postgres", func() error { st.Postgres(); return nil }},
		{"URL", func() error { st.URL(); return nil }},
		{"DB", func() error { st.DB(); return nil }},
		{"CreateOrg", func() (err error) { org, err = st.CreateOrg(ctx, "acme"); return err }},
		{"OrgByName", func() error { _, err := st.OrgByName(ctx, "acme"); return err }},
		{"OrgsPage", func() error { _, _, err := st.OrgsPage(ctx, "a", 100); return err }},
		{"AddMember", func() (err error) { member, err = st.AddMember(ctx, org.ID, "dev@acme.test"); return err }},
		{"MemberByEmail", func() error { _, err := st.MemberByEmail(ctx, org.ID, "dev@acme.test"); return err }},
		{"AddKey", func() error { return st.AddKey(ctx, member, "key_1", []byte("hash")) }},
		{"Members", func() error { _, err := st.Members(ctx, org.ID); return err }},
		{"KeyByID", func() error { _, err := st.KeyByID(ctx, "key_1"); return err }},
		{"TouchKey", func() error { return st.TouchKey(ctx, "key_1", time.Now()) }},
		{"Keys", func() error { _, err := st.Keys(ctx, org.ID); return err }},
		{"RevokeKey", func() error { return st.RevokeKey(ctx, "key_1") }},
		{"Credit", func() error { _, err := st.Credit(ctx, org.ID, 1_000_000); return err }},
		{"Balance", func() error { _, err := st.Balance(ctx, org.ID); return err }},
		{"AddConnection", func() error {
			return st.AddConnection(ctx, ConnectionRecord{OrgID: org.ID, Name: "crm", BaseURL: "https://crm.test", Methods: []string{"GET"},
				SealedHeaders: []byte("sealed"), CreatedAt: time.Now()})
		}},
		{"Connection", func() error { _, err := st.Connection(ctx, org.ID, "crm"); return err }},
		{"Connections", func() error { _, err := st.Connections(ctx, org.ID); return err }},
		{"RemoveConnection", func() error { return st.RemoveConnection(ctx, org.ID, "crm") }},
		{"CreateRun", func() error {
			for i := range 5 {
				if _, _, err := st.CreateRun(ctx, newRun(fmt.Sprint("run_", i), fmt.Sprint("key-", i))); err != nil {
					return err
				}
			}
			// A retry with a known key returns the earlier run.
			if _, created, err := st.CreateRun(ctx, newRun("run_retry", "key-0")); err != nil || created {
				return fmt.Errorf("idempotent retry: created %v, %w", created, err)
			}
			return nil
		}},
		{"GetRun", func() error { _, err := st.GetRun(ctx, org.ID, "run_0"); return err }},
		{"ListRuns", func() error {
			if _, _, err := st.ListRuns(ctx, org.ID, "", 2); err != nil {
				return err
			}
			_, _, err := st.ListRuns(ctx, org.ID, "run_3", 2)
			return err
		}},
		{"ListRunsWithStatus", func() error {
			if _, _, err := st.ListRunsWithStatus(ctx, org.ID, Succeeded, "", 2); err != nil {
				return err
			}
			_, _, err := st.ListRunsWithStatus(ctx, org.ID, Queued, "run_3", 2)
			return err
		}},
		{"RegisterNode", func() error {
			return st.RegisterNode(ctx, Node{ID: "node_a", Hostname: "a", Capacity: 1, StartedAt: time.Now(), HeartbeatAt: time.Now()})
		}},
		{"Heartbeat", func() error { return st.Heartbeat(ctx, "node_a", time.Now()) }},
		{"MarkRunning", func() error { _, err := st.MarkRunning(ctx, "run_0", "node_a", time.Now()); return err }},
		{"RunSpec", func() error { _, err := st.RunSpec(ctx, "run_0"); return ignore(err, ErrNotFound) }},
		{"RequestCancel", func() error { _, err := st.RequestCancel(ctx, "run_0", time.Now()); return err }},
		{"CancelRequested", func() error { _, err := st.CancelRequested(ctx, "node_a"); return err }},
		{"LostRuns", func() error { _, err := st.LostRuns(ctx, time.Now().Add(-time.Minute)); return err }},
		{"RunningOn", func() error { _, err := st.RunningOn(ctx, "node_a"); return err }},
		{"StopNode", func() error { return st.StopNode(ctx, "node_a", time.Now()) }},
		// SQLite: nothing to listen to, nothing to lock.
		{"Listen", func() error { st.Listen(ctx, nil, nil, nil); return nil }},
		{"SchemaLocked", func() error { return st.SchemaLocked(ctx, func() error { return nil }) }},
		{"RecordUsage", func() error {
			return st.RecordUsage(ctx, "run_0", ledger.Usage{ModelCalls: 1}, ledger.Cost{Model: 10})
		}},
		{"AppendEvent", func() error {
			_, err := st.AppendEvent(ctx, "run_0", Event{Category: "Shell", Message: "$ ls", Content: true})
			return err
		}},
		{"AmendEventData", func() error {
			_, err := st.AmendEventData(ctx, "run_0", 2, json.RawMessage(`{"exit_code":0}`), true)
			return err
		}},
		{"AppendRecordingExchange", func() error { return st.AppendRecordingExchange(ctx, "run_0", 1, []byte(`{"turn":1}`)) }},
		{"SetRecordingTruncation", func() error { return st.SetRecordingTruncation(ctx, "run_0", []byte(`{"kept_turns":1}`)) }},
		{"AddOutput", func() error {
			return st.AddOutput(ctx, "run_0", Output{Path: "report.md", Size: 2, SHA256: []byte("sum"), ContentType: "text/markdown", Data: []byte("hi")})
		}},
		{"ActiveRuns", func() error { _, err := st.ActiveRuns(ctx); return err }},
		{"FinishRun", func() error {
			for i := range 5 {
				if err := finish(fmt.Sprint("run_", i), time.Now().Add(time.Duration(2*i-3)*time.Hour)); err != nil {
					return err
				}
			}
			return nil
		}},
		{"Recording", func() error { _, err := st.Recording(ctx, org.ID, "run_0"); return err }},
		{"Events", func() error { _, err := st.Events(ctx, "run_0", 0, 10); return err }},
		{"EventsSince", func() error { _, err := st.EventsSince(ctx, "run_0", 1, 10); return err }},
		{"ListRunsWithStatus", func() error {
			if _, _, err := st.ListRunsWithStatus(ctx, org.ID, Succeeded, "", 2); err != nil {
				return err
			}
			_, _, err := st.ListRunsWithStatus(ctx, org.ID, Succeeded, "run_3", 2)
			return err
		}},
		{"PublishRun", func() error {
			// run_1's retention has ended: the janitor's purge unpublishes it.
			for _, id := range []string{"run_1", "run_2"} {
				if _, err := st.PublishRun(ctx, org.ID, id, "slug-"+id, time.Now()); err != nil {
					return err
				}
			}
			return nil
		}},
		{"PublicationOf", func() error { _, err := st.PublicationOf(ctx, org.ID, "run_2"); return err }},
		{"PublishedRun", func() error { _, err := st.PublishedRun(ctx, "slug-run_2"); return err }},
		{"UnpublishRun", func() error { return st.UnpublishRun(ctx, org.ID, "run_2") }},
		{"Keys", func() error { _, err := st.Keys(ctx, org.ID); return err }},
		{"TouchKey", func() error { return st.TouchKey(ctx, "key_1", time.Now()) }},
		{"RevokeOrgKey", func() error {
			if err := st.AddKey(ctx, member, "key_2", []byte("hash")); err != nil {
				return err
			}
			return st.RevokeOrgKey(ctx, org.ID, "key_2", time.Now())
		}},
		{"CreateAccount", func() (err error) {
			user, err = st.CreateAccount(ctx, NewAccount{Email: "ada@acme.test", PasswordHash: "h", StarterCredit: 1000, At: time.Now()})
			return err
		}},
		{"UserByEmail", func() error { _, err := st.UserByEmail(ctx, "ADA@acme.test"); return err }},
		{"SetPassword", func() error { return st.SetPassword(ctx, user.ID, "h2", time.Now()) }},
		{"CreateSession", func() error {
			if err := st.CreateSession(ctx, []byte("old"), user.ID, time.Now(), time.Now().Add(time.Hour), nil); err != nil {
				return err
			}
			return st.CreateSession(ctx, []byte("token"), user.ID, time.Now(), time.Now().Add(time.Hour), []byte("old"))
		}},
		{"SessionByToken", func() error {
			_, err := st.SessionByToken(ctx, []byte("token"), time.Now(), time.Now().Add(-time.Hour))
			return err
		}},
		{"TouchSession", func() error { return st.TouchSession(ctx, []byte("token"), time.Now()) }},
		{"DeleteUserSessions", func() error { return st.DeleteUserSessions(ctx, user.ID, []byte("token")) }},
		{"DeleteSession", func() error { return st.DeleteSession(ctx, []byte("token")) }},
		{"DeleteExpiredSessions", func() error {
			_, err := st.DeleteExpiredSessions(ctx, time.Now(), time.Now().Add(-time.Hour))
			return err
		}},
		{"RecordAttempt", func() error {
			return st.RecordAttempt(ctx, time.Now(), time.Now().Add(-15*time.Minute), "sign-in-account:ada@acme.test", "sign-in-address:192.0.2.1")
		}},
		{"Attempts", func() error {
			_, _, err := st.Attempts(ctx, "sign-in-account:ada@acme.test", time.Now().Add(-15*time.Minute))
			return err
		}},
		{"ClearAttempts", func() error { return st.ClearAttempts(ctx, "sign-in-account:ada@acme.test") }},
		{"Totals", func() error { _, err := st.Totals(ctx); return err }},
		{"OutputsOf", func() error { _, err := st.OutputsOf(ctx, []string{"run_0", "run_1"}); return err }},
		{"Output", func() error { _, err := st.Output(ctx, "run_0", "report.md"); return err }},
		{"SetWebhookSecret", func() error { return st.SetWebhookSecret(ctx, org.ID, []byte("sealed"), time.Now()) }},
		{"WebhookSecret", func() error { _, _, err := st.WebhookSecret(ctx, org.ID); return err }},
		{"ClaimDueWebhooks", func() error {
			due, err := st.ClaimDueWebhooks(ctx, time.Now(), time.Now().Add(time.Minute), 10)
			if err == nil && len(due) != 5 {
				err = fmt.Errorf("%d webhooks due, want 5", len(due))
			}
			return err
		}},
		{"NextWebhookAt", func() error { _, _, err := st.NextWebhookAt(ctx); return err }},
		{"RecordWebhookAttempt", func() error {
			retry := time.Now().Add(time.Minute)
			if err := st.RecordWebhookAttempt(ctx, "run_0", WebhookAttempt{Attempt: 1, StartedAt: time.Now(), StatusCode: 500},
				WebhookOutcome{RetryAt: &retry}); err != nil {
				return err
			}
			return st.RecordWebhookAttempt(ctx, "run_0", WebhookAttempt{Attempt: 2, StartedAt: time.Now(), StatusCode: 204},
				WebhookOutcome{State: WebhookDelivered, Event: &Event{Category: "Webhook", Message: "delivered"}})
		}},
		{"Webhook", func() error { _, _, err := st.Webhook(ctx, "run_0"); return err }},
		{"PurgeRun", func() error { _, err := st.PurgeRun(ctx, org.ID, "run_4", time.Now()); return err }},
		{"PurgeExpired", func() error {
			// run_0 and run_1 have expired, and every key is older than a day.
			n, err := st.PurgeExpired(ctx, time.Now(), 24*time.Hour)
			if err == nil && n != 2 {
				err = fmt.Errorf("purged %d runs, want 2", n)
			}
			return err
		}},
		{"ReclaimSpace", func() error { _, err := st.ReclaimSpace(ctx); return err }},
		{"Checkpoint", func() error { return st.Checkpoint(ctx) }},
		{"Close", st.Close},
	}
}

var (
	// A search of an organisation's runs, in order, reads its whole
	// history unless a LIMIT stops it early.
	orgHistory = regexp.MustCompile(`^SEARCH runs USING (COVERING )?INDEX \S+ \(org_id=\?( AND seq[<>]=?\?)?\)$`)
	// A search of runs by status reads history unless the statuses are
	// the active ones (finished runs pile up) or a LIMIT stops it early.
	byStatus = regexp.MustCompile(`^SEARCH runs USING (COVERING )?INDEX \S+ \((org_id=\? AND )?status=\?( AND rowid[<>]=?\?)?\)$`)
)

// historyReads returns the steps of query's plan that read rows in
// proportion to history: a whole growing table (or a whole index of one),
// an organisation's every run, or every finished run.
func historyReads(ctx context.Context, db *sql.DB, query string, args []any) ([]string, error) {
	rows, err := db.QueryContext(ctx, "EXPLAIN QUERY PLAN "+query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			return nil, err
		}
		plan = append(plan, detail)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	// Without a sort of its own, a LIMIT stops reading after that many rows.
	stopsEarly := strings.Contains(query, " LIMIT ") && !slices.ContainsFunc(plan, func(step string) bool {
		return strings.HasPrefix(step, "USE TEMP B-TREE")
	})
	var reads []string
	for _, step := range plan {
		switch {
		case orgHistory.MatchString(step) && !stopsEarly:
			reads = append(reads, step+" (an organisation's every run)")
		case byStatus.MatchString(step) && !stopsEarly && !activeOnly(query):
			reads = append(reads, step+" (finished runs too)")
		case strings.HasPrefix(step, "SCAN "):
			// "SCAN runs", "SCAN r USING COVERING INDEX x": every row. A
			// "SEARCH" reads only the rows an index finds.
			table, _, _ := strings.Cut(strings.TrimPrefix(step, "SCAN "), " ")
			if table != "CONSTANT" && !slices.Contains(boundedTables, table) {
				reads = append(reads, step)
			}
		}
	}
	return reads, nil
}

// activeOnly reports whether query selects runs by an active status, which
// only the runs in flight have, however many have finished.
func activeOnly(query string) bool {
	return strings.Contains(query, "status IN ('queued', 'running')") || strings.Contains(query, "status = 'running'")
}

// isDML reports whether query reads or writes rows, as opposed to pragmas,
// schema changes and transaction control, which have no query plan.
func isDML(query string) bool {
	words := strings.Fields(query)
	return len(words) > 0 && slices.Contains([]string{"SELECT", "INSERT", "UPDATE", "DELETE", "WITH"}, strings.ToUpper(words[0]))
}

// isMigration reports whether query is one of the schema migrations: they
// run once, and may read every row to do so.
func isMigration(t *testing.T, query string) bool {
	ms, err := migrations("sqlite")
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(ms, func(m migration) bool { return m.sql == query })
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// statement is a recorded statement with the arguments of its first use.
type statement struct {
	query string
	args  []any
}

// statementLog collects the distinct statements the store sends.
type statementLog struct {
	mu   sync.Mutex
	seen map[string]bool
	list []statement
}

func (l *statementLog) add(query string, args []driver.NamedValue) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen[query] {
		return
	}
	l.seen[query] = true
	values := make([]any, len(args))
	for i, a := range args {
		values[i] = a.Value
	}
	l.list = append(l.list, statement{query, values})
}

func (l *statementLog) statements() []statement {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.list)
}

// recordingDriverName is the wrapper recordStatements registers once; the
// log it writes to is swapped per test.
const recordingDriverName = "sqlite-recording"

var (
	registerOnce sync.Once
	currentLog   struct {
		sync.Mutex
		log *statementLog
	}
)

// recordStatements makes stores the test opens send their statements
// through a driver that records them.
func recordStatements(t *testing.T) *statementLog {
	registerOnce.Do(func() {
		db, err := sql.Open("sqlite", "")
		if err != nil {
			panic(err)
		}
		sql.Register(recordingDriverName, recordingDriver{db.Driver()})
		db.Close()
	})
	log := &statementLog{seen: map[string]bool{}}
	currentLog.Lock()
	currentLog.log = log
	currentLog.Unlock()
	prev := driverName
	driverName = recordingDriverName
	t.Cleanup(func() { driverName = prev })
	return log
}

func record(query string, args []driver.NamedValue) {
	currentLog.Lock()
	log := currentLog.log
	currentLog.Unlock()
	log.add(query, args)
}

type recordingDriver struct{ driver.Driver }

// sqliteConn is what database/sql uses of the SQLite driver's connections.
type sqliteConn interface {
	driver.Conn
	driver.ExecerContext
	driver.QueryerContext
	driver.ConnPrepareContext
	driver.ConnBeginTx
	driver.SessionResetter
	driver.Validator
}

func (d recordingDriver) Open(name string) (driver.Conn, error) {
	c, err := d.Driver.Open(name)
	if err != nil {
		return nil, err
	}
	sc, ok := c.(sqliteConn)
	if !ok {
		c.Close()
		return nil, errors.New("the sqlite driver's connection lacks an interface the recorder wraps")
	}
	return recordingConn{sc}, nil
}

type recordingConn struct{ sqliteConn }

func (c recordingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	record(query, args)
	return c.sqliteConn.ExecContext(ctx, query, args)
}

func (c recordingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	record(query, args)
	return c.sqliteConn.QueryContext(ctx, query, args)
}

// PrepareContext is refused: a prepared statement's arguments arrive later
// and would go unrecorded. The store does not prepare statements.
func (c recordingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return nil, fmt.Errorf("recording driver: prepared statement %q: record its arguments before using Prepare in the store", query)
}

// ignore returns nil for an error that is target.
func ignore(err, target error) error {
	if errors.Is(err, target) {
		return nil
	}
	return err
}
