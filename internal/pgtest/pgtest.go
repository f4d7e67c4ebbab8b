// Package pgtest starts throwaway PostgreSQL clusters for tests, through
// internal/pgserver.
//
// Each cluster lives in a temporary directory of its own: initdb creates
// the data directory there and pg_ctl starts the server, which listens only
// on a Unix socket in that same directory, so it never meets the system
// cluster Debian's package runs on port 5432, nor another test binary's
// cluster. The commands run as the postgres system user, because initdb
// refuses to run as root; tests therefore run as root (as `make test` does)
// or as postgres. Durability is switched off (fsync, full_page_writes,
// synchronous_commit): the data is thrown away anyway. Stopping the cluster
// removes the directory.
//
// A test either starts a cluster of its own with Start, or shares the
// test binary's one through Shared (whose package's TestMain calls
// RunMain), and takes a fresh database from it with NewDatabase.
//
// PostgreSQL missing is a failure, not a skip: `sudo tools/install-deps.sh`
// (and CI) install it, and a test that silently skips proves nothing.
//
// Only tests import it: it reads EPHEMERAL_PG_BIN from the environment.
package pgtest

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ephemeralhq/ephemeral/internal/pgserver"
)

// BinDirEnv names the variable that points at a directory holding initdb,
// pg_ctl and psql, in place of the newest /usr/lib/postgresql/*/bin.
const BinDirEnv = "EPHEMERAL_PG_BIN"

// installHint is how to get what is missing.
const installHint = "run `sudo tools/install-deps.sh` (Debian package postgresql)"

// maxConnections is the clusters' max_connections: enough for the pools of
// the several daemons a test may run on one database.
const maxConnections = 200

// Cluster is a running throwaway PostgreSQL cluster.
type Cluster struct {
	srv     *pgserver.Server
	stopped atomic.Bool
}

// dbSeq numbers the databases NewDatabase creates, across clusters, so that
// names never repeat within a test binary.
var dbSeq atomic.Uint64

// Start starts a cluster for tb and stops it, removing its directory, when
// tb ends. It fails tb when PostgreSQL is not installed or the cluster does
// not start.
func Start(tb testing.TB) *Cluster {
	tb.Helper()
	c, err := start()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := c.Stop(); err != nil {
			tb.Error(err)
		}
	})
	return c
}

// start starts a cluster with the binaries of EPHEMERAL_PG_BIN, or the
// newest installed, and says what to do when they or the rights to run
// them are missing.
func start() (*Cluster, error) {
	bin := os.Getenv(BinDirEnv)
	srv, err := pgserver.Start(pgserver.Options{BinDir: bin, MaxConnections: maxConnections, NoFsync: true})
	switch {
	case err == nil:
		return &Cluster{srv: srv}, nil
	case errors.Is(err, pgserver.ErrNotInstalled) && bin != "":
		return nil, fmt.Errorf("pgtest: %s=%s: %w", BinDirEnv, bin, err)
	case errors.Is(err, pgserver.ErrNotInstalled):
		return nil, fmt.Errorf("pgtest: %w: %s, or set %s to a directory holding initdb, pg_ctl and psql", err, installHint, BinDirEnv)
	case errors.Is(err, pgserver.ErrNotPermitted):
		return nil, fmt.Errorf("pgtest: run the tests as root (sudo) or as the postgres user: %w", err)
	default:
		return nil, err
	}
}

// Dir is the cluster's directory: the data directory (data), the server
// log (log) and the socket.
func (c *Cluster) Dir() string { return c.srv.Dir() }

// SocketDir is the directory holding the server's Unix socket, the host
// a client connects to.
func (c *Cluster) SocketDir() string { return c.srv.SocketDir() }

// AdminURL is a connection URL for the postgres database as the postgres
// superuser.
func (c *Cluster) AdminURL() string { return c.srv.AdminURL() }

// NewDatabase creates an empty database with a name of its own and returns
// its connection URL, of the form
// postgres://postgres@/NAME?host=SOCKETDIR&port=5432&sslmode=disable.
// The database is dropped when tb ends (if the cluster still runs), so
// that tests sharing a cluster do not fill the disk.
func (c *Cluster) NewDatabase(tb testing.TB) string {
	tb.Helper()
	name := dbName(dbSeq.Add(1), tb.Name())
	u, err := c.srv.CreateDatabase(name)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if c.stopped.Load() {
			return
		}
		// DropDatabase ends the connections a test left open rather than
		// failing.
		if err := c.srv.DropDatabase(name); err != nil && !c.stopped.Load() {
			tb.Error(err)
		}
	})
	return u
}

// dbName makes a database name out of the sequence number, which makes it
// unique, and the test's name, which tells whose it is in the server log.
// Identifiers are at most 63 bytes.
func dbName(seq uint64, test string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "t%d_", seq)
	for _, r := range strings.ToLower(test) {
		if b.Len() >= 63 {
			break
		}
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// Stop stops the server at once (no checkpoint: nothing is kept) and
// removes the cluster's directory. Later calls return the first one's
// result.
func (c *Cluster) Stop() error {
	c.stopped.Store(true)
	return c.srv.Stop()
}

// The test binary's shared cluster.
var (
	shared struct {
		once    sync.Once
		cluster *Cluster
		err     error
	}
	// inRunMain says RunMain runs the tests, and so will stop the shared
	// cluster.
	inRunMain atomic.Bool
)

// Shared is the test binary's cluster, started by the first test that asks
// for it and stopped by RunMain once all tests have run: tests that each
// take a NewDatabase from it pay for one cluster, not one each. The package
// of a test that calls it must have a TestMain that calls RunMain, as
// nothing else would stop the server; Shared fails a test where it does
// not. A cluster that failed to start fails every test that asks for it.
func Shared(tb testing.TB) *Cluster {
	tb.Helper()
	if !inRunMain.Load() {
		tb.Fatal("pgtest: Shared needs the package's TestMain to call pgtest.RunMain(m), which stops the shared cluster")
	}
	shared.once.Do(func() {
		shared.cluster, shared.err = start()
	})
	if shared.err != nil {
		tb.Fatal(shared.err)
	}
	return shared.cluster
}

// RunMain runs the tests, stops the shared cluster if one of them started
// it, and exits with the tests' status (1 if they passed but the cluster
// did not stop cleanly). Call it from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.RunMain(m) }
func RunMain(m *testing.M) {
	inRunMain.Store(true)
	code := m.Run()
	// Once.Do here waits for a start still under way (a test that timed
	// out while starting), and keeps a later one from starting.
	shared.once.Do(func() { shared.err = errors.New("pgtest: tests are over") })
	if shared.cluster != nil {
		if err := shared.cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

// Dump returns everything the database at databaseURL holds, as pg_dump
// writes it (data only, bytea columns in hex): what a test searches to
// prove that purged content is gone from the database.
func (c *Cluster) Dump(tb testing.TB, databaseURL string) []byte {
	tb.Helper()
	out, err := c.srv.Dump(databaseURL)
	if err != nil {
		tb.Fatal(err)
	}
	return out
}
