// Package pgserver starts a throwaway PostgreSQL server of its own, for
// tests and benchmarks: initdb and pg_ctl create and start a cluster in a
// temporary directory, and the server listens only on a Unix socket in that
// same directory (listen_addresses is empty), so it never meets the system
// cluster Debian's package runs on port 5432, nor another process's
// throwaway one. The server and its directory are removed by Stop.
//
// The binaries run as the postgres system user, because initdb refuses to
// run as root: the caller runs as root (the commands switch to postgres,
// without root's supplementary groups) or as postgres itself. They run with
// an environment of their own, so that the caller's PG* variables cannot
// redirect them, and the server's settings go into postgresql.conf rather
// than through pg_ctl -o, whose string passes through /bin/sh.
//
// The data is thrown away, so commits are not waited on to reach the disk
// (synchronous_commit off); Options.NoFsync switches off fsync as well.
//
// It takes all it needs in Options and never reads the environment
// (but for TMPDIR, through os.TempDir, where Options.TempDir is empty).
package pgserver

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
	"syscall"
)

// ErrNotInstalled is in the error Start returns when PostgreSQL's binaries
// or the postgres user are missing.
var ErrNotInstalled = errors.New("PostgreSQL is not installed")

// ErrNotPermitted is in the error Start returns when the process runs as
// neither root nor postgres: initdb refuses root, so the server runs as
// postgres, which only root can switch to.
var ErrNotPermitted = errors.New("only root or the postgres user can start a throwaway PostgreSQL server: initdb refuses root, so it runs as postgres, which only root can switch to")

// Port only names the socket file (.s.PGSQL.<port>) in the server's own
// directory: with no TCP listener, every server can use the default.
const Port = 5432

// sockPathMax is the longest socket path the kernel takes: sun_path is 108
// bytes, NUL included.
const sockPathMax = 107

// maxIdentifier is the longest name PostgreSQL keeps; it truncates longer
// ones.
const maxIdentifier = 63

// binaries are what Start needs in Options.BinDir.
var binaries = []string{"initdb", "pg_ctl", "psql"}

// Options says how to start the server.
type Options struct {
	// BinDir holds initdb, pg_ctl and psql (and pg_dump, for Dump).
	// Empty: the bin directory of the newest PostgreSQL under
	// /usr/lib/postgresql, where Debian installs it.
	BinDir string
	// TempDir is where the server's directory is made. Empty:
	// os.TempDir(). The postgres user must be able to reach it, and the
	// socket path in it must fit in a Unix socket address (107 bytes).
	TempDir string
	// MaxConnections is the server's max_connections. Zero:
	// PostgreSQL's default (100).
	MaxConnections int
	// NoFsync switches off fsync and full_page_writes: a crash of the
	// machine may then corrupt the cluster, which tests throw away
	// anyway, and writes cost less. Without it, commits reach the disk
	// within a fraction of a second, as with SQLite's WAL and
	// synchronous=NORMAL.
	NoFsync bool
}

// Server is a running throwaway PostgreSQL server.
type Server struct {
	dir  string
	bin  string
	cred *syscall.Credential // nil when the process already runs as postgres

	stopOnce sync.Once
	stopErr  error
}

// Start makes the server's directory, runs initdb and starts the server.
// On failure nothing is left behind.
func Start(opts Options) (*Server, error) {
	if opts.MaxConnections < 0 {
		return nil, fmt.Errorf("pgserver: MaxConnections %d: not negative", opts.MaxConnections)
	}
	bin := opts.BinDir
	if bin == "" {
		var err error
		if bin, err = FindBinDir(); err != nil {
			return nil, err
		}
	}
	for _, b := range binaries {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return nil, fmt.Errorf("pgserver: %s has no %s: %w", bin, b, ErrNotInstalled)
		}
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(opts.TempDir, "pg-")
	if err != nil {
		return nil, fmt.Errorf("pgserver: make the server's directory: %w", err)
	}
	s := &Server{dir: dir, bin: bin, cred: cred}
	if err := s.init(opts); err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	if out, err := s.command("pg_ctl", "-D", s.dataDir(), "-l", s.logPath(), "-w", "-t", "60", "start").CombinedOutput(); err != nil {
		err = fmt.Errorf("pgserver: pg_ctl start: %w: %s\nserver log:\n%s", err, bytes.TrimSpace(out), s.logTail())
		// -w gave up, but the server may be up or coming up: stop it
		// before removing its directory.
		return nil, errors.Join(err, s.Stop())
	}
	return s, nil
}

// init prepares the directory for the postgres user, creates the data
// directory and writes the server's settings.
func (s *Server) init(opts Options) error {
	sock := filepath.Join(s.dir, ".s.PGSQL."+strconv.Itoa(Port))
	if len(sock) > sockPathMax {
		return fmt.Errorf("pgserver: socket path %s is longer than the %d bytes a Unix socket takes: use a shorter temporary directory (TMPDIR)", sock, sockPathMax)
	}
	if s.cred != nil {
		if err := os.Chown(s.dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return fmt.Errorf("pgserver: chown the server's directory to postgres: %w", err)
		}
	}
	// MkdirTemp makes it 0700 already; say so, as the server relies on it
	// to keep the socket (trust authentication) to its owner and root.
	if err := os.Chmod(s.dir, 0o700); err != nil {
		return fmt.Errorf("pgserver: chmod the server's directory: %w", err)
	}
	// No locale: byte-order collation and English messages on every
	// machine, whatever locales it has installed.
	if out, err := s.command("initdb", "-D", s.dataDir(), "-A", "trust", "-U", "postgres",
		"-E", "UTF8", "--no-locale", "--no-sync").CombinedOutput(); err != nil {
		return fmt.Errorf("pgserver: initdb: %w: %s (the postgres user must be able to reach %s)", err, bytes.TrimSpace(out), s.dir)
	}
	f, err := os.OpenFile(filepath.Join(s.dataDir(), "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("pgserver: write postgresql.conf: %w", err)
	}
	_, err = f.WriteString(conf(s.dir, opts))
	if err = errors.Join(err, f.Close()); err != nil {
		return fmt.Errorf("pgserver: write postgresql.conf: %w", err)
	}
	return nil
}

// conf is what init appends to postgresql.conf, whose later lines override
// initdb's.
func conf(dir string, opts Options) string {
	var b strings.Builder
	fmt.Fprintf(&b, `
# pgserver: a throwaway cluster, reachable only through its own socket.
listen_addresses = ''
unix_socket_directories = %s
port = %d
synchronous_commit = off
`, quoteLiteral(dir), Port)
	if opts.NoFsync {
		b.WriteString("fsync = off\nfull_page_writes = off\n")
	}
	if opts.MaxConnections > 0 {
		fmt.Fprintf(&b, "max_connections = %d\n", opts.MaxConnections)
	}
	return b.String()
}

// Dir is the server's directory: the data directory (data), the server
// log (log) and the socket.
func (s *Server) Dir() string { return s.dir }

// SocketDir is the directory holding the server's Unix socket, the host a
// client connects to.
func (s *Server) SocketDir() string { return s.dir }

// URL is a pgx (and libpq) connection URL for database db as the postgres
// superuser, over the socket:
// postgres://postgres@/DB?host=SOCKETDIR&port=5432&sslmode=disable.
// The port is explicit so that a PGPORT in the client's environment cannot
// point it at another socket file.
func (s *Server) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&port=%d&sslmode=disable", url.PathEscape(db), uriEscape(s.dir), Port)
}

// AdminURL is the URL of the postgres database.
func (s *Server) AdminURL() string { return s.URL("postgres") }

// uriEscape percent-encodes s for a connection URL's query. Not
// url.QueryEscape alone: libpq and pgx decode '+' as itself, not as a
// space.
func uriEscape(s string) string {
	return strings.ReplaceAll(url.QueryEscape(s), "+", "%20")
}

// CreateDatabase creates an empty database and returns its URL. The name
// is at most 63 bytes, which PostgreSQL would otherwise truncate.
func (s *Server) CreateDatabase(name string) (string, error) {
	if name == "" || len(name) > maxIdentifier {
		return "", fmt.Errorf("pgserver: database name %q: 1 to %d bytes", name, maxIdentifier)
	}
	if out, err := s.Psql(s.AdminURL(), "CREATE DATABASE "+quoteIdent(name)); err != nil {
		return "", fmt.Errorf("pgserver: create database %s: %w: %s", name, err, out)
	}
	return s.URL(name), nil
}

// DropDatabase drops a database, ending the connections still open to it.
func (s *Server) DropDatabase(name string) error {
	if out, err := s.Psql(s.AdminURL(), "DROP DATABASE "+quoteIdent(name)+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("pgserver: drop database %s: %w: %s", name, err, out)
	}
	return nil
}

// Psql runs one SQL command through psql on the database at databaseURL
// and returns its unaligned, tuples-only output (or psql's messages, with
// an error).
func (s *Server) Psql(databaseURL, sql string) (string, error) {
	out, err := s.command("psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", databaseURL, "-c", sql).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// Dump returns the data the database at databaseURL holds, as pg_dump
// writes it (data only, bytea columns in hex).
func (s *Server) Dump(databaseURL string) ([]byte, error) {
	var stderr bytes.Buffer
	cmd := s.command("pg_dump", "--data-only", "--no-owner", "-d", databaseURL)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("pgserver: pg_dump: %w: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

// Stop stops the server at once (no checkpoint: nothing is kept) and
// removes its directory. Later calls return the first one's result.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		var err error
		// Without a pid file no server runs (a start that failed early).
		if _, statErr := os.Stat(filepath.Join(s.dataDir(), "postmaster.pid")); statErr == nil {
			// By the data directory, so that only this server is stopped.
			out, stopErr := s.command("pg_ctl", "-D", s.dataDir(), "-m", "immediate", "-w", "-t", "60", "stop").CombinedOutput()
			if stopErr != nil {
				err = fmt.Errorf("pgserver: pg_ctl stop: %w: %s", stopErr, bytes.TrimSpace(out))
			}
		}
		if rmErr := os.RemoveAll(s.dir); rmErr != nil {
			err = errors.Join(err, fmt.Errorf("pgserver: remove the server's directory: %w", rmErr))
		}
		s.stopErr = err
	})
	return s.stopErr
}

func (s *Server) dataDir() string { return filepath.Join(s.dir, "data") }
func (s *Server) logPath() string { return filepath.Join(s.dir, "log") }

// command is one of the PostgreSQL binaries, run as the postgres user in
// the server's directory (which it can enter, unlike perhaps the caller's
// working directory) with an environment of its own: the caller's PG*
// variables must not redirect it, and TZ=UTC gives every machine's server
// the same default time zone.
func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	cmd.Env = []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + s.dir,
		"LC_ALL=C",
		"TZ=UTC",
	}
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	return cmd
}

// logTail is the end of the server log, for errors.
func (s *Server) logTail() string {
	b, err := os.ReadFile(s.logPath())
	if err != nil {
		return "(" + err.Error() + ")"
	}
	const tail = 4096
	if len(b) > tail {
		b = b[len(b)-tail:]
	}
	return string(bytes.TrimSpace(b))
}

// quoteIdent quotes a name for SQL.
func quoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// quoteLiteral quotes a string for postgresql.conf.
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// FindBinDir is the bin directory of the newest PostgreSQL under
// /usr/lib/postgresql, where Debian installs it: what Start uses when
// Options.BinDir is empty.
func FindBinDir() (string, error) {
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(found) == 0 {
		return "", fmt.Errorf("pgserver: %w (no /usr/lib/postgresql/*/bin/initdb)", ErrNotInstalled)
	}
	// Numerically, so that 10 is newer than 9.6.
	slices.SortFunc(found, func(a, b string) int {
		return compareVersions(versionOf(a), versionOf(b))
	})
	return filepath.Dir(found[len(found)-1]), nil
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
// from root; nil when the process already runs as postgres.
func credential() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgserver: look up the postgres user: %w (%w)", err, ErrNotInstalled)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgserver: postgres uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgserver: postgres gid %q: %w", u.Gid, err)
	}
	switch euid := os.Geteuid(); euid {
	case int(uid):
		return nil, nil
	case 0:
		// No supplementary groups: root's must not come along.
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
	default:
		return nil, fmt.Errorf("pgserver: running as uid %d: %w", euid, ErrNotPermitted)
	}
}
