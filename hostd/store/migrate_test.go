package store

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
)

func TestOpenRecordsEveryMigrationOnce(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ephemeral.db")
	for range 2 {
		st, err := Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		var n, newest int
		if err := st.read.QueryRowContext(ctx, `SELECT COUNT(*), MAX(version) FROM schema_migrations`).Scan(&n, &newest); err != nil {
			t.Fatal(err)
		}
		st.Close()
		if n != schemaVersion() || newest != schemaVersion() {
			t.Fatalf("schema_migrations has %d rows up to %d; want %d", n, newest, schemaVersion())
		}
	}
}

func TestOpenRefusesANewerSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ephemeral.db")
	st, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, 'from_the_future', 0)`, schemaVersion()+1); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, err := Open(ctx, path); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("opened a database of a newer build: %v", err)
	}
}

func TestMigrationsAreNumberedWithoutGaps(t *testing.T) {
	ms, err := migrations("sqlite")
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range ms {
		if m.version != i+1 || m.name == "" || strings.TrimSpace(m.sql) == "" {
			t.Fatalf("migration %d: %+v", i, m)
		}
	}
}

// schemaVersion is the number of the newest migration this build knows.
func schemaVersion() int {
	ms, err := migrations("sqlite")
	if err != nil {
		panic(err) // the files are embedded: a bad one fails every test
	}
	return len(ms)
}
