// Package storetest opens the database a test runs against: an SQLite file
// in the test's temporary directory, or, when EPHEMERAL_TEST_DATABASE is
// "postgres" (as `make test` sets for a second pass over the store, ledger
// and API suites), a fresh database in a throwaway PostgreSQL cluster the
// test binary starts itself. So one suite checks both dialects.
//
// Only tests import it.
package storetest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/internal/pgtest"
)

// DatabaseEnv names the variable that picks the dialect.
const DatabaseEnv = "EPHEMERAL_TEST_DATABASE"

// Postgres reports whether this test binary runs against PostgreSQL.
func Postgres() bool { return os.Getenv(DatabaseEnv) == "postgres" }

// Main runs a package's tests and then stops the PostgreSQL cluster they
// shared, if they started one. Call it from TestMain.
func Main(m *testing.M) { pgtest.RunMain(m) }

// Open opens a new, empty store, closed when the test ends, and returns
// with it the SQLite file's path (empty for PostgreSQL).
func Open(tb testing.TB) (*store.Store, string) {
	tb.Helper()
	var (
		st   *store.Store
		path string
		err  error
	)
	if Postgres() {
		st, err = store.OpenPostgres(context.Background(), pgtest.Shared(tb).NewDatabase(tb))
	} else {
		path = filepath.Join(tb.TempDir(), "ephemeral.db")
		st, err = store.Open(context.Background(), path)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	return st, path
}

// Reopen opens a second store on the same database as st, as a second
// daemon (or the admin CLI) would: for SQLite the file at path, for
// PostgreSQL st's URL.
func Reopen(tb testing.TB, st *store.Store, path string) *store.Store {
	tb.Helper()
	var (
		again *store.Store
		err   error
	)
	if st.Postgres() {
		again, err = store.OpenPostgres(context.Background(), st.URL())
	} else {
		again, err = store.Open(context.Background(), path)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { again.Close() })
	return again
}
