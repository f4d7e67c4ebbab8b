package pgserver

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"
)

// start starts a server for t, failing it where PostgreSQL or the rights
// to run it are missing (as internal/pgtest does: a skip proves nothing).
func start(t *testing.T, opts Options) *Server {
	t.Helper()
	s, err := Start(opts)
	if err != nil {
		t.Fatalf("%v (run as root, with `sudo tools/install-deps.sh` done)", err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Error(err)
		}
	})
	return s
}

func TestStartCreateDumpDropStop(t *testing.T) {
	s := start(t, Options{NoFsync: true, MaxConnections: 20})
	u, err := s.CreateDatabase("pgserver_test")
	if err != nil {
		t.Fatal(err)
	}
	if want := s.URL("pgserver_test"); u != want {
		t.Errorf("CreateDatabase returned %s, want %s", u, want)
	}
	if _, err := s.CreateDatabase("pgserver_test"); err == nil {
		t.Error("creating the same database twice succeeded")
	}
	if out, err := s.Psql(u, "CREATE TABLE t (v text); INSERT INTO t VALUES ('needle-42')"); err != nil {
		t.Fatalf("psql: %v: %s", err, out)
	}
	dump, err := s.Dump(u)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(dump, []byte("needle-42")) {
		t.Errorf("the dump lacks the row written:\n%s", dump)
	}
	// The settings of Options reached the server.
	for setting, want := range map[string]string{"fsync": "off", "synchronous_commit": "off", "max_connections": "20", "listen_addresses": ""} {
		if out, err := s.Psql(s.AdminURL(), "SHOW "+setting); err != nil || out != want {
			t.Errorf("SHOW %s: %q, %v; want %q", setting, out, err, want)
		}
	}
	if err := s.DropDatabase("pgserver_test"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Dump(u); err == nil {
		t.Error("Dump of a dropped database succeeded")
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(); err != nil {
		t.Errorf("a second Stop: %v", err)
	}
	if _, err := os.Stat(s.Dir()); !os.IsNotExist(err) {
		t.Errorf("after Stop, stat %s: %v; want it gone", s.Dir(), err)
	}
}

// Without NoFsync the server keeps fsync on, as a benchmark wants, and a
// temporary directory with a space and a quote reaches it intact.
func TestFsyncOnAndAnOddTempDir(t *testing.T) {
	parent, err := os.MkdirTemp("", "a b'c")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	// The postgres user must reach the server's directory.
	if err := os.Chmod(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	s := start(t, Options{TempDir: parent})
	if !strings.Contains(s.AdminURL(), "%20") || strings.Contains(s.AdminURL(), "+") {
		t.Errorf("AdminURL %s: want the space as %%20", s.AdminURL())
	}
	if out, err := s.Psql(s.AdminURL(), "SHOW fsync"); err != nil || out != "on" {
		t.Errorf("SHOW fsync: %q, %v; want on", out, err)
	}
}

func TestStartFailsWithoutBinaries(t *testing.T) {
	_, err := Start(Options{BinDir: t.TempDir()})
	if !errors.Is(err, ErrNotInstalled) {
		t.Errorf("Start with an empty BinDir: %v, want ErrNotInstalled", err)
	}
}

func TestSocketPathTooLong(t *testing.T) {
	long := t.TempDir() + "/" + strings.Repeat("x", 100)
	if err := os.Mkdir(long, 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := Start(Options{TempDir: long})
	if err == nil || !strings.Contains(err.Error(), "socket path") {
		t.Fatalf("Start in %s: %v, want the socket path too long", long, err)
	}
	entries, _ := os.ReadDir(long)
	if len(entries) != 0 {
		t.Errorf("a failed Start left %d entries in %s", len(entries), long)
	}
}

func TestCompareVersions(t *testing.T) {
	if compareVersions("10", "9.6") <= 0 || compareVersions("15", "15") != 0 || compareVersions("9.6", "15") >= 0 {
		t.Error("compareVersions does not order 9.6 < 10 < 15 numerically")
	}
}
