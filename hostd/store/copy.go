package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/money"
)

// Moving up: an install that began on one machine's SQLite database moves
// to a shared PostgreSQL database by copying every row into an empty
// PostgreSQL database of the same schema version. The tables are not
// listed here but read from SQLite's schema, so that tables added by later
// migrations are copied without this file knowing them. The source is read
// in one snapshot and the target written in one transaction, so a copy that
// fails leaves the target as empty as it found it; the money is checked
// before the copy and compared after it, inside that transaction, so a copy
// that would lose or make a micro-dollar is never committed.

const (
	// copyBatchRows bounds the rows of one multi-row INSERT: few round
	// trips, statements of a sane size.
	copyBatchRows = 500
	// copyBatchBytes bounds the data one INSERT carries, so that a table
	// of large values (run output files) is not held in memory 500 rows
	// at a time.
	copyBatchBytes = 8 << 20
	// postgresMaxParams is the most parameters one PostgreSQL statement
	// may have (the wire protocol counts them in 16 bits).
	postgresMaxParams = 65535
	// copyLockTimeout is how long Copy waits to lock the target's tables:
	// a wait that long means something is using the target database.
	copyLockTimeout = "10s"
)

// TableCount is how many rows one table holds.
type TableCount struct {
	Table string
	Rows  int64
}

// CopyReport is what Copy moved: the rows of each table, in the order they
// were copied, and the money, which was the same in the source and in the
// target.
type CopyReport struct {
	Tables    []TableCount
	Orgs      int64 // organisations
	Credited  int64 // micro-dollars credited to all accounts
	Available int64
	Held      int64
	Charged   int64
	Duration  time.Duration
}

// Rows is the number of rows copied in all.
func (r CopyReport) Rows() int64 {
	var n int64
	for _, t := range r.Tables {
		n += t.Rows
	}
	return n
}

// String is a short summary for an administrator: the totals, each
// table's rows and the money.
func (r CopyReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "copied %d organisations, %d rows in %d tables in %s\n", r.Orgs, r.Rows(), len(r.Tables),
		r.Duration.Round(time.Millisecond))
	for _, t := range r.Tables {
		fmt.Fprintf(&b, "  %-24s %10d\n", t.Table, t.Rows)
	}
	fmt.Fprintf(&b, "money, equal before and after: credited %s, available %s, held %s, charged %s\n",
		money.Format(r.Credited), money.Format(r.Available), money.Format(r.Held), money.Format(r.Charged))
	return b.String()
}

// querier is what Copy reads through: a transaction of either store.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Copy copies every row of from, an SQLite store, into to, an empty
// PostgreSQL store of the same schema version, in one transaction of to.
// It refuses a source with queued or running runs (their jobs and VMs
// belong to the daemon that queued them), a target that holds data, and
// money that does not add up in the source or comes out different in the
// target. Writes to from while it copies are not copied: the caller stops
// the daemon first.
func Copy(ctx context.Context, from, to *Store) (CopyReport, error) {
	began := time.Now()
	if from == nil || to == nil || from.dialect != sqlite || to.dialect != postgres {
		return CopyReport{}, errors.New("store: copy: the source must be an SQLite store and the target a PostgreSQL one")
	}
	if err := sameSchema(ctx, from, to); err != nil {
		return CopyReport{}, err
	}
	// One read transaction: every table, count and balance from the same
	// snapshot.
	src, err := from.read.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return CopyReport{}, fmt.Errorf("store: copy: read the source: %w", err)
	}
	defer src.Rollback()
	rep, plans, before, err := inspectSource(ctx, src)
	if err != nil {
		return CopyReport{}, err
	}
	dst, err := to.write.BeginTx(ctx, nil)
	if err != nil {
		return CopyReport{}, fmt.Errorf("store: copy: begin on the target: %w", err)
	}
	defer dst.Rollback() // after Commit, a no-op
	if err := copyInto(ctx, src, dst, plans, rep.Tables, before); err != nil {
		return CopyReport{}, err
	}
	if err := dst.Commit(); err != nil {
		return CopyReport{}, fmt.Errorf("store: copy: commit: %w", err)
	}
	rep.Duration = time.Since(began)
	return rep, nil
}

// inspectSource checks that the source may be copied (no active runs,
// consistent money) and reads what the copy needs: the tables in copy
// order with their row counts, and the money to compare the target with.
func inspectSource(ctx context.Context, src *sql.Tx) (CopyReport, []tablePlan, moneyState, error) {
	var rep CopyReport
	var active int64
	if err := src.QueryRowContext(ctx, `SELECT count(*) FROM runs WHERE status IN ('queued', 'running')`).Scan(&active); err != nil {
		return rep, nil, nil, fmt.Errorf("store: copy: count active runs: %w", err)
	}
	if active > 0 {
		return rep, nil, nil, fmt.Errorf("store: copy: stop the daemon and let runs finish first; %d runs are queued or running", active)
	}
	plans, err := sourceTables(ctx, src)
	if err != nil {
		return rep, nil, nil, err
	}
	before, err := readMoney(ctx, src)
	if err != nil {
		return rep, nil, nil, fmt.Errorf("store: copy: read the source's money: %w", err)
	}
	if err := before.check(); err != nil {
		return rep, nil, nil, fmt.Errorf("store: copy: the source's money does not add up, nothing copied: %w", err)
	}
	for _, p := range plans {
		n, err := countRows(ctx, src, p.table)
		if err != nil {
			return rep, nil, nil, err
		}
		rep.Tables = append(rep.Tables, TableCount{Table: p.table, Rows: n})
		if p.table == "orgs" {
			rep.Orgs = n
		}
	}
	for _, m := range before {
		rep.Credited += m.Account.Credited
		rep.Available += m.Account.Available
		rep.Held += m.Account.Held
		rep.Charged += m.Account.Charged
	}
	return rep, plans, before, nil
}

// copyInto does the copy inside the target's transaction dst: it matches
// the tables' columns, locks and checks the target empty, copies the rows,
// advances identity sequences, then compares row counts and money with
// what the source had.
func copyInto(ctx context.Context, src, dst *sql.Tx, plans []tablePlan, counts []TableCount, before moneyState) error {
	for i := range plans {
		if err := plans[i].matchTarget(ctx, dst); err != nil {
			return err
		}
	}
	if err := lockEmptyTarget(ctx, dst, plans); err != nil {
		return err
	}
	floors, err := autoincrementFloors(ctx, src)
	if err != nil {
		return err
	}
	for i, p := range plans {
		n, err := p.copyRows(ctx, src, dst)
		if err != nil {
			return err
		}
		if n != counts[i].Rows {
			return fmt.Errorf("store: copy table %s: read %d rows, counted %d", p.table, n, counts[i].Rows)
		}
		if err := p.advanceSequences(ctx, dst, floors[p.table]); err != nil {
			return err
		}
	}
	for _, c := range counts {
		n, err := countRows(ctx, dst, c.Table)
		if err != nil {
			return err
		}
		if n != c.Rows {
			return fmt.Errorf("store: copy table %s: %d rows in the source but %d in the target", c.Table, c.Rows, n)
		}
	}
	after, err := readMoney(ctx, dst)
	if err != nil {
		return fmt.Errorf("store: copy: read the target's money: %w", err)
	}
	if err := before.compare(after); err != nil {
		return fmt.Errorf("store: copy: %w; nothing was copied", err)
	}
	return nil
}

// sameSchema refuses stores whose migrations differ: the copy matches
// tables and columns by name and would otherwise copy into a schema that
// means something else.
func sameSchema(ctx context.Context, from, to *Store) error {
	have, err := schemaVersions(ctx, from.read)
	if err != nil {
		return fmt.Errorf("store: copy: schema version of the source: %w", err)
	}
	want, err := schemaVersions(ctx, to.read)
	if err != nil {
		return fmt.Errorf("store: copy: schema version of the target: %w", err)
	}
	if !slices.Equal(have, want) {
		return fmt.Errorf("store: copy: the source has schema version %d and the target %d: open both with the same build",
			lastOf(have), lastOf(want))
	}
	return nil
}

func schemaVersions(ctx context.Context, db *sql.DB) ([]int64, error) {
	rows, err := db.QueryContext(ctx, `SELECT version FROM schema_migrations ORDER BY version`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var versions []int64
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		versions = append(versions, v)
	}
	return versions, rows.Err()
}

func lastOf(versions []int64) int64 {
	if len(versions) == 0 {
		return 0
	}
	return versions[len(versions)-1]
}

// countRows counts a table's rows.
func countRows(ctx context.Context, q querier, table string) (int64, error) {
	var n int64
	if err := q.QueryRowContext(ctx, `SELECT count(*) FROM `+quoteIdent(table)).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: copy: count rows of %s: %w", table, err)
	}
	return n, nil
}

// quoteIdent quotes a table or column name; both dialects read it.
func quoteIdent(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// The tables.

// tablePlan is how one table is copied: its columns as the source has
// them and, once matchTarget has run, how the target stores each.
type tablePlan struct {
	table   string
	columns []string
	parents []string // tables its foreign keys reference
	// Filled by matchTarget:
	types      []string // the target's data_type of each column
	identities []string // columns the target fills from a sequence
	overriding bool     // some column is GENERATED ALWAYS: inserting it needs OVERRIDING SYSTEM VALUE
}

// sourceTables lists the source's tables, with their columns and foreign
// keys, parents before children. SQLite's own tables (sqlite_*), the
// migration record (each side keeps its own) and River's job queue (which
// a store on PostgreSQL has and whose jobs belong to the daemon that queued
// them) are not copied.
func sourceTables(ctx context.Context, src *sql.Tx) ([]tablePlan, error) {
	names, err := stringColumn(ctx, src, `SELECT name FROM sqlite_master WHERE type = 'table'
		AND name NOT LIKE 'sqlite\_%' ESCAPE '\' AND name NOT LIKE 'river\_%' ESCAPE '\'
		AND name <> 'schema_migrations' ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("store: copy: list the source's tables: %w", err)
	}
	plans := make([]tablePlan, len(names))
	for i, name := range names {
		plans[i].table = name
		if plans[i].columns, err = stringColumn(ctx, src, `SELECT name FROM pragma_table_info(?) ORDER BY cid`, name); err != nil {
			return nil, fmt.Errorf("store: copy table %s: columns: %w", name, err)
		}
		if plans[i].parents, err = stringColumn(ctx, src, `SELECT DISTINCT "table" FROM pragma_foreign_key_list(?)`, name); err != nil {
			return nil, fmt.Errorf("store: copy table %s: foreign keys: %w", name, err)
		}
	}
	return parentsFirst(plans)
}

// parentsFirst orders the tables so that every table comes after the
// tables its foreign keys reference (PostgreSQL checks each row as it is
// inserted), in name order where that leaves a choice. Tables referencing
// each other in a cycle cannot be copied this way and are an error. A
// table referencing itself is left to the order SQLite reads its rows in
// (none does yet).
func parentsFirst(plans []tablePlan) ([]tablePlan, error) {
	byName := map[string]tablePlan{}
	for _, p := range plans {
		byName[p.table] = p
	}
	waiting := map[string]int{}       // parents not placed yet, by table
	children := map[string][]string{} // tables waiting for each table
	for _, p := range plans {
		for _, parent := range p.parents {
			if _, copied := byName[parent]; !copied || parent == p.table {
				continue
			}
			waiting[p.table]++
			children[parent] = append(children[parent], p.table)
		}
	}
	var ready []string
	for _, p := range plans {
		if waiting[p.table] == 0 {
			ready = append(ready, p.table)
		}
	}
	var out []tablePlan
	for len(ready) > 0 {
		slices.Sort(ready)
		next := ready[0]
		ready = ready[1:]
		out = append(out, byName[next])
		for _, child := range children[next] {
			if waiting[child]--; waiting[child] == 0 {
				ready = append(ready, child)
			}
		}
	}
	if len(out) < len(plans) {
		var cycle []string
		for _, p := range plans {
			if waiting[p.table] > 0 {
				cycle = append(cycle, p.table)
			}
		}
		return nil, fmt.Errorf("store: copy: the foreign keys of tables %s form a cycle: no order copies them", strings.Join(cycle, ", "))
	}
	return out, nil
}

// matchTarget looks the table's columns up on the target: every column
// the source has must exist there, and its type says how to convert the
// values SQLite returns.
func (p *tablePlan) matchTarget(ctx context.Context, dst *sql.Tx) error {
	rows, err := dst.QueryContext(ctx, `SELECT column_name, data_type, is_identity, coalesce(identity_generation, ''),
		coalesce(column_default, '') FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = ?`, p.table)
	if err != nil {
		return fmt.Errorf("store: copy table %s: columns of the target: %w", p.table, err)
	}
	defer rows.Close()
	types := map[string]string{}
	for rows.Next() {
		var name, dataType, isIdentity, generation, def string
		if err := rows.Scan(&name, &dataType, &isIdentity, &generation, &def); err != nil {
			return fmt.Errorf("store: copy table %s: columns of the target: %w", p.table, err)
		}
		types[name] = dataType
		// An identity column or a serial one: either draws from a
		// sequence that must move past the copied values.
		if isIdentity == "YES" || strings.HasPrefix(def, "nextval(") {
			p.identities = append(p.identities, name)
		}
		p.overriding = p.overriding || generation == "ALWAYS"
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("store: copy table %s: columns of the target: %w", p.table, err)
	}
	if len(types) == 0 {
		return fmt.Errorf("store: copy table %s: the target database has no such table", p.table)
	}
	p.types = make([]string, len(p.columns))
	for i, c := range p.columns {
		t, ok := types[c]
		if !ok {
			return fmt.Errorf("store: copy table %s: the target database has no column %s", p.table, c)
		}
		p.types[i] = t
	}
	return nil
}

// lockEmptyTarget locks the target's tables against writers until the
// copy commits and checks that none holds a row: copying into a database
// in use would mix two installs' organisations, runs and money.
func lockEmptyTarget(ctx context.Context, dst *sql.Tx, plans []tablePlan) error {
	names := make([]string, len(plans))
	for i, p := range plans {
		names[i] = quoteIdent(p.table)
	}
	if _, err := dst.ExecContext(ctx, `SET LOCAL lock_timeout = '`+copyLockTimeout+`'`); err != nil {
		return fmt.Errorf("store: copy: set lock timeout: %w", err)
	}
	if _, err := dst.ExecContext(ctx, `LOCK TABLE `+strings.Join(names, ", ")+` IN EXCLUSIVE MODE`); err != nil {
		return fmt.Errorf("store: copy: lock the target's tables (is a daemon using the target database?): %w", err)
	}
	for _, p := range plans {
		var hasRows bool
		if err := dst.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM `+quoteIdent(p.table)+`)`).Scan(&hasRows); err != nil {
			return fmt.Errorf("store: copy: check table %s of the target: %w", p.table, err)
		}
		if hasRows {
			return fmt.Errorf("store: copy: the target database is not empty (table %s has rows): copy into a new database", p.table)
		}
	}
	return nil
}

// The rows.

// copyRows copies every row of the table from src to dst in multi-row
// INSERTs and returns how many it copied.
func (p *tablePlan) copyRows(ctx context.Context, src, dst *sql.Tx) (int64, error) {
	cols := make([]string, len(p.columns))
	for i, c := range p.columns {
		cols[i] = quoteIdent(c)
	}
	rows, err := src.QueryContext(ctx, `SELECT `+strings.Join(cols, ", ")+` FROM `+quoteIdent(p.table))
	if err != nil {
		return 0, fmt.Errorf("store: copy table %s: read: %w", p.table, err)
	}
	defer rows.Close()
	b := insertBatch{plan: p, head: `INSERT INTO ` + quoteIdent(p.table) + ` (` + strings.Join(cols, ", ") + `)`}
	values := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range values {
		ptrs[i] = &values[i]
	}
	var n int64
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return n, fmt.Errorf("store: copy table %s: read: %w", p.table, err)
		}
		if err := b.add(values); err != nil {
			return n, err
		}
		n++
		if b.full() {
			if err := b.flush(ctx, dst); err != nil {
				return n, err
			}
		}
	}
	if err := rows.Err(); err != nil {
		return n, fmt.Errorf("store: copy table %s: read: %w", p.table, err)
	}
	return n, b.flush(ctx, dst)
}

// insertBatch gathers rows of one table for one multi-row INSERT.
type insertBatch struct {
	plan  *tablePlan
	head  string // INSERT INTO t (columns)
	args  []any
	rows  int
	bytes int
}

// add converts a row's values for the target and adds them to the batch.
func (b *insertBatch) add(values []any) error {
	for i, v := range values {
		c, err := toTarget(v, b.plan.types[i])
		if err != nil {
			return fmt.Errorf("store: copy table %s: column %s: %w", b.plan.table, b.plan.columns[i], err)
		}
		switch c := c.(type) {
		case string:
			b.bytes += len(c)
		case []byte:
			b.bytes += len(c)
		}
		b.args = append(b.args, c)
	}
	b.rows++
	return nil
}

// full reports whether the batch should be sent before another row is
// added: at copyBatchRows rows, PostgreSQL's parameter limit or
// copyBatchBytes of data.
func (b *insertBatch) full() bool {
	maxRows := min(copyBatchRows, postgresMaxParams/len(b.plan.columns))
	return b.rows >= maxRows || b.bytes >= copyBatchBytes
}

// flush inserts the gathered rows and empties the batch.
func (b *insertBatch) flush(ctx context.Context, dst *sql.Tx) error {
	if b.rows == 0 {
		return nil
	}
	var q strings.Builder
	q.WriteString(b.head)
	if b.plan.overriding {
		q.WriteString(` OVERRIDING SYSTEM VALUE`)
	}
	q.WriteString(` VALUES `)
	ncols := len(b.plan.columns)
	for r := range b.rows {
		if r > 0 {
			q.WriteString(", ")
		}
		q.WriteByte('(')
		for c := range ncols {
			if c > 0 {
				q.WriteString(", ")
			}
			// "$N" placeholders: the connection passes the statement
			// through without rewriting it.
			q.WriteString("$" + strconv.Itoa(r*ncols+c+1))
		}
		q.WriteByte(')')
	}
	if _, err := dst.ExecContext(ctx, q.String(), b.args...); err != nil {
		return fmt.Errorf("store: copy table %s: insert %d rows: %w", b.plan.table, b.rows, err)
	}
	b.args, b.rows, b.bytes = b.args[:0], 0, 0
	return nil
}

// toTarget converts a value as SQLite returns it (int64, float64, string,
// []byte or nil) to what the target column of dataType takes. SQLite keeps
// whatever was written, whatever the declared type: a BLOB column may hold
// text and a TEXT column bytes, which PostgreSQL's BYTEA and TEXT do not
// accept from each other.
func toTarget(v any, dataType string) (any, error) {
	switch dataType {
	case "bytea":
		if s, ok := v.(string); ok {
			return []byte(s), nil
		}
	case "text", "character varying", "character":
		switch x := v.(type) {
		case []byte:
			v = string(x)
		case int64:
			return strconv.FormatInt(x, 10), nil
		case float64:
			return strconv.FormatFloat(x, 'g', -1, 64), nil
		}
		if s, ok := v.(string); ok && (!utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0) {
			return nil, errors.New("holds text PostgreSQL cannot store (not UTF-8, or a NUL byte)")
		}
	case "bigint", "integer", "smallint":
		if f, ok := v.(float64); ok && f == float64(int64(f)) {
			return int64(f), nil
		}
	case "boolean":
		if i, ok := v.(int64); ok {
			return i != 0, nil
		}
	}
	return v, nil
}

// autoincrementFloors reads SQLite's record of the highest value each
// AUTOINCREMENT table ever gave out, which may exceed the highest value
// left in the table: the target's sequence starts past it, so no value is
// given out twice.
func autoincrementFloors(ctx context.Context, src *sql.Tx) (map[string]int64, error) {
	floors := map[string]int64{}
	var exists bool
	if err := src.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sqlite_sequence')`).
		Scan(&exists); err != nil || !exists {
		return floors, err
	}
	rows, err := src.QueryContext(ctx, `SELECT name, seq FROM sqlite_sequence`)
	if err != nil {
		return nil, fmt.Errorf("store: copy: read sqlite_sequence: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var seq int64
		if err := rows.Scan(&name, &seq); err != nil {
			return nil, fmt.Errorf("store: copy: read sqlite_sequence: %w", err)
		}
		floors[name] = seq
	}
	return floors, rows.Err()
}

// advanceSequences moves the sequence of each identity or serial column
// past the copied values (and past floor), so that the next row the target
// makes does not collide with a copied one.
func (p *tablePlan) advanceSequences(ctx context.Context, dst *sql.Tx, floor int64) error {
	for _, col := range p.identities {
		// pg_get_serial_sequence parses its first argument as a
		// (possibly qualified) name, so it is quoted; the column is taken
		// as it is. With no row and no floor, is_called false makes the
		// next value 1.
		c := quoteIdent(col)
		_, err := dst.ExecContext(ctx, `SELECT setval(pg_get_serial_sequence($1, $2),
			greatest(coalesce(max(`+c+`), 0), $3::bigint, 1), greatest(coalesce(max(`+c+`), 0), $3::bigint) > 0)
			FROM `+quoteIdent(p.table), quoteIdent(p.table), col, floor)
		if err != nil {
			return fmt.Errorf("store: copy table %s: advance the sequence of %s: %w", p.table, col, err)
		}
	}
	return nil
}

// stringColumn runs a query returning one text column.
func stringColumn(ctx context.Context, q querier, query string, args ...any) ([]string, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// The money.

// orgMoney is one organisation's money: its account and the totals of its
// ledger entries by kind.
type orgMoney struct {
	Account    ledger.Account
	HasAccount bool
	Entries    map[string]entryTotal
}

// entryTotal is the number and the sum of one kind of ledger entries.
type entryTotal struct {
	Count  int64
	Micros int64
}

// moneyState is every organisation's money, by organisation id.
type moneyState map[string]*orgMoney

func (m moneyState) of(orgID string) *orgMoney {
	o := m[orgID]
	if o == nil {
		o = &orgMoney{Entries: map[string]entryTotal{}}
		m[orgID] = o
	}
	return o
}

// readMoney reads every account and the ledger entries' totals. The SQL
// serves both dialects; the sums are cast because PostgreSQL's sum of
// BIGINT is NUMERIC.
func readMoney(ctx context.Context, q querier) (moneyState, error) {
	m := moneyState{}
	rows, err := q.QueryContext(ctx, `SELECT org_id, available, held, charged, credited FROM accounts`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var org string
		var a ledger.Account
		if err := rows.Scan(&org, &a.Available, &a.Held, &a.Charged, &a.Credited); err != nil {
			rows.Close()
			return nil, err
		}
		o := m.of(org)
		o.Account, o.HasAccount = a, true
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, err
	}
	rows, err = q.QueryContext(ctx, `SELECT org_id, kind, count(*), CAST(coalesce(sum(micros), 0) AS BIGINT)
		FROM ledger_entries GROUP BY org_id, kind`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var org, kind string
		var t entryTotal
		if err := rows.Scan(&org, &kind, &t.Count, &t.Micros); err != nil {
			return nil, err
		}
		m.of(org).Entries[kind] = t
	}
	return m, rows.Err()
}

// check verifies the ledger's rules on every organisation: an account
// whose columns are not negative and add up to what was credited, and
// credit entries that add up to it too.
func (m moneyState) check() error {
	for _, org := range slices.Sorted(maps.Keys(m)) {
		o := m[org]
		a := o.Account
		switch {
		case !o.HasAccount:
			return fmt.Errorf("org %s has ledger entries but no account", org)
		case a.Available < 0 || a.Held < 0 || a.Charged < 0 || a.Credited < 0:
			return fmt.Errorf("the account of org %s has a negative amount: %+v", org, a)
		case a.Available+a.Held+a.Charged != a.Credited:
			return fmt.Errorf("the account of org %s does not add up: available %d + held %d + charged %d != credited %d",
				org, a.Available, a.Held, a.Charged, a.Credited)
		case o.Entries["credit"].Micros != a.Credited:
			return fmt.Errorf("the credit entries of org %s add up to %d micros but %d were credited",
				org, o.Entries["credit"].Micros, a.Credited)
		}
	}
	return nil
}

// compare reports the first organisation whose money differs between m
// (the source) and after (the target).
func (m moneyState) compare(after moneyState) error {
	orgs := slices.Sorted(maps.Keys(m))
	for org := range after {
		if _, ok := m[org]; !ok {
			orgs = append(orgs, org)
		}
	}
	for _, org := range orgs {
		b, a := m.of(org), after.of(org)
		if b.HasAccount != a.HasAccount || b.Account != a.Account || !maps.Equal(b.Entries, a.Entries) {
			return fmt.Errorf("the money of org %s differs after the copy: source %+v %v, target %+v %v",
				org, b.Account, b.Entries, a.Account, a.Entries)
		}
	}
	return nil
}
