// Package pgtest starts throwaway PostgreSQL clusters for tests.
//
// Each cluster lives in a temporary directory of its own (os.TempDir()/pgt-N):
// initdb creates the data directory there and pg_ctl starts the server,
// which listens only on a Unix socket in that same directory
// (listen_addresses is empty), so it never meets the system cluster Debian's
// package runs on port 5432, nor another test binary's cluster. The
// commands run as the postgres system user, because initdb refuses to run
// as root; tests therefore run as root (as `make test` does) or as postgres.
// Durability is switched off (fsync, full_page_writes, synchronous_commit):
// the data is thrown away anyway. Stopping the cluster (pg_ctl stop -m
// immediate, by its data directory) removes the directory.
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
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

// BinDirEnv names the variable that points at a directory holding initdb,
// pg_ctl and psql, in place of the newest /usr/lib/postgresql/*/bin.
const BinDirEnv = "EPHEMERAL_PG_BIN"

// installHint is how to get what is missing.
const installHint = "run `sudo tools/install-deps.sh` (Debian package postgresql)"

// port only names the socket file (.s.PGSQL.<port>) in the cluster's own
// directory: with no TCP listener, every cluster can use the default.
const port = 5432

// sockPathMax is the longest socket path the kernel takes: sun_path is 108
// bytes, NUL included.
const sockPathMax = 107

// Cluster is a running throwaway PostgreSQL cluster.
type Cluster struct {
	dir  string
	bin  string
	cred *syscall.Credential // nil when the test already runs as postgres

	stopOnce sync.Once
	stopErr  error
	stopped  atomic.Bool
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

// Dir is the cluster's directory: the data directory (data), the server
// log (log) and the socket.
func (c *Cluster) Dir() string { return c.dir }

// SocketDir is the directory holding the server's Unix socket, the host
// a client connects to.
func (c *Cluster) SocketDir() string { return c.dir }

// AdminURL is a connection URL for the postgres database as the postgres
// superuser.
func (c *Cluster) AdminURL() string { return c.url("postgres") }

// url is a pgx (and libpq) connection URL for database db over the socket.
// The port is explicit so that a PGPORT in the environment cannot point
// the client at another socket file.
func (c *Cluster) url(db string) string {
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&port=%d&sslmode=disable", db, uriEscape(c.dir), port)
}

// uriEscape percent-encodes s for a connection URL. Not url.QueryEscape
// alone: libpq and pgx decode '+' as itself, not as a space.
func uriEscape(s string) string {
	return strings.ReplaceAll(url.QueryEscape(s), "+", "%20")
}

// NewDatabase creates an empty database with a name of its own and returns
// its connection URL, of the form
// postgres://postgres@/NAME?host=SOCKETDIR&port=5432&sslmode=disable.
// The database is dropped when tb ends (if the cluster still runs), so
// that tests sharing a cluster do not fill the disk.
func (c *Cluster) NewDatabase(tb testing.TB) string {
	tb.Helper()
	name := dbName(dbSeq.Add(1), tb.Name())
	if out, err := c.psql(c.AdminURL(), "CREATE DATABASE "+quoteIdent(name)); err != nil {
		tb.Fatalf("pgtest: create database %s: %v: %s", name, err, out)
	}
	tb.Cleanup(func() {
		if c.stopped.Load() {
			return
		}
		// FORCE ends the connections a test left open rather than failing.
		if out, err := c.psql(c.AdminURL(), "DROP DATABASE "+quoteIdent(name)+" WITH (FORCE)"); err != nil && !c.stopped.Load() {
			tb.Errorf("pgtest: drop database %s: %v: %s", name, err, out)
		}
	})
	return c.url(name)
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

// quoteIdent quotes a name for SQL.
func quoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// Stop stops the server at once (no checkpoint: nothing is kept) and
// removes the cluster's directory. Later calls return the first one's
// result.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		c.stopped.Store(true)
		var err error
		// Without a pid file no server runs (a start that failed early).
		if _, statErr := os.Stat(filepath.Join(c.dataDir(), "postmaster.pid")); statErr == nil {
			// By the data directory, so only this cluster's server is
			// stopped.
			out, stopErr := c.command("pg_ctl", "-D", c.dataDir(), "-m", "immediate", "-w", "-t", "60", "stop").CombinedOutput()
			if stopErr != nil {
				err = fmt.Errorf("pgtest: pg_ctl stop: %w: %s", stopErr, bytes.TrimSpace(out))
			}
		}
		if rmErr := os.RemoveAll(c.dir); rmErr != nil {
			err = errors.Join(err, fmt.Errorf("pgtest: remove cluster: %w", rmErr))
		}
		c.stopErr = err
	})
	return c.stopErr
}

func (c *Cluster) dataDir() string { return filepath.Join(c.dir, "data") }
func (c *Cluster) logPath() string { return filepath.Join(c.dir, "log") }

// start makes the directory, runs initdb and starts the server. On failure
// nothing is left behind.
func start() (*Cluster, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgt-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: make cluster directory: %w", err)
	}
	c := &Cluster{dir: dir, bin: bin, cred: cred}
	if err := c.init(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if out, err := c.command("pg_ctl", "-D", c.dataDir(), "-l", c.logPath(), "-w", "-t", "60", "start").CombinedOutput(); err != nil {
		err = fmt.Errorf("pgtest: pg_ctl start: %w: %s\nserver log:\n%s", err, bytes.TrimSpace(out), c.logTail())
		// -w gave up, but the server may be up or coming up: stop it
		// before removing its directory.
		return nil, errors.Join(err, c.Stop())
	}
	return c, nil
}

// init prepares the directory for the postgres user, creates the data
// directory and writes the server's settings.
func (c *Cluster) init() error {
	sock := filepath.Join(c.dir, ".s.PGSQL."+strconv.Itoa(port))
	if len(sock) > sockPathMax {
		return fmt.Errorf("pgtest: socket path %s is longer than the %d bytes a Unix socket takes: set TMPDIR to a shorter directory", sock, sockPathMax)
	}
	if c.cred != nil {
		if err := os.Chown(c.dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return fmt.Errorf("pgtest: chown cluster directory to postgres: %w", err)
		}
	}
	// MkdirTemp makes it 0700 already; say so, as the server relies on it
	// to keep the socket (trust authentication) to its owner and root.
	if err := os.Chmod(c.dir, 0o700); err != nil {
		return fmt.Errorf("pgtest: chmod cluster directory: %w", err)
	}
	// No locale: byte-order collation and English messages on every
	// machine, whatever locales it has installed.
	if out, err := c.command("initdb", "-D", c.dataDir(), "-A", "trust", "-U", "postgres",
		"-E", "UTF8", "--no-locale", "--no-sync").CombinedOutput(); err != nil {
		return fmt.Errorf("pgtest: initdb: %w: %s (the postgres user must be able to reach %s)", err, bytes.TrimSpace(out), c.dir)
	}
	// The settings go into postgresql.conf rather than pg_ctl -o, whose
	// string passes through /bin/sh, where a TMPDIR with a space or a quote
	// would break it.
	conf := fmt.Sprintf(`
# pgtest: a throwaway cluster, reachable only through its own socket.
listen_addresses = ''
unix_socket_directories = %s
port = %d
fsync = off
full_page_writes = off
synchronous_commit = off
max_connections = 200
`, quoteLiteral(c.dir), port)
	f, err := os.OpenFile(filepath.Join(c.dataDir(), "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("pgtest: write postgresql.conf: %w", err)
	}
	_, err = f.WriteString(conf)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgtest: write postgresql.conf: %w", err)
	}
	return nil
}

// quoteLiteral quotes a string for postgresql.conf.
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// psql runs one SQL command on the database at connURL and returns its
// unaligned, tuples-only output.
func (c *Cluster) psql(connURL, sql string) (string, error) {
	out, err := c.command("psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", connURL, "-c", sql).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// command is one of the PostgreSQL binaries, run as the postgres user in
// the cluster's directory (which it can enter, unlike perhaps the test's
// working directory) with an environment of its own: PG* variables of the
// caller's must not redirect it, and TZ=UTC gives every machine's server
// the same default time zone.
func (c *Cluster) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(c.bin, name), args...)
	cmd.Dir = c.dir
	cmd.Env = []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + c.dir,
		"LC_ALL=C",
		"TZ=UTC",
	}
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	return cmd
}

// logTail is the end of the server log, for errors.
func (c *Cluster) logTail() string {
	b, err := os.ReadFile(c.logPath())
	if err != nil {
		return "(" + err.Error() + ")"
	}
	const tail = 4096
	if len(b) > tail {
		b = b[len(b)-tail:]
	}
	return string(bytes.TrimSpace(b))
}

// binDir is EPHEMERAL_PG_BIN, or the bin directory of the newest
// PostgreSQL under /usr/lib/postgresql, where Debian installs it.
func binDir() (string, error) {
	if d := os.Getenv(BinDirEnv); d != "" {
		for _, b := range []string{"initdb", "pg_ctl", "psql"} {
			if _, err := os.Stat(filepath.Join(d, b)); err != nil {
				return "", fmt.Errorf("pgtest: %s=%s has no %s: %w", BinDirEnv, d, b, err)
			}
		}
		return d, nil
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(found) == 0 {
		return "", fmt.Errorf("pgtest: PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): %s, or set %s to a directory holding initdb, pg_ctl and psql", installHint, BinDirEnv)
	}
	// Numerically, so that 10 is newer than 9.6.
	slices.SortFunc(found, func(a, b string) int {
		return compareVersions(versionOf(a), versionOf(b))
	})
	d := filepath.Dir(found[len(found)-1])
	for _, b := range []string{"pg_ctl", "psql"} {
		if _, err := os.Stat(filepath.Join(d, b)); err != nil {
			return "", fmt.Errorf("pgtest: PostgreSQL in %s has no %s: %s", d, b, installHint)
		}
	}
	return d, nil
}

// versionOf is the version in /usr/lib/postgresql/VERSION/bin/initdb.
func versionOf(initdb string) string {
	return filepath.Base(filepath.Dir(filepath.Dir(initdb)))
}

// compareVersions compares dotted versions number by number; a part that
// is not a number counts as 0.
func compareVersions(a, b string) int {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(pa), len(pb)) {
		var x, y int
		if i < len(pa) {
			x, _ = strconv.Atoi(pa[i])
		}
		if i < len(pb) {
			y, _ = strconv.Atoi(pb[i])
		}
		if x != y {
			return x - y
		}
	}
	return 0
}

// credential is what the binaries run as: the postgres user, switched to
// from root; nil when the test already runs as postgres.
func credential() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgtest: look up the postgres user: %w: %s", err, installHint)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgtest: postgres uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgtest: postgres gid %q: %w", u.Gid, err)
	}
	switch os.Geteuid() {
	case int(uid):
		return nil, nil
	case 0:
		// No supplementary groups: root's must not come along.
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
	default:
		return nil, fmt.Errorf("pgtest: run the tests as root (sudo) or as the postgres user: initdb refuses root, so the cluster runs as postgres, which only root can switch to")
	}
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
	out, err := c.command("pg_dump", "--data-only", "--no-owner", "-d", databaseURL).Output()
	if err != nil {
		tb.Fatalf("pgtest: pg_dump: %v", err)
	}
	return out
}
