package store

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// The database holds every organisation's data: its files must be the
// owner's alone even under a umask that lets everyone read, and an install
// that left them readable is tightened when the database is opened.
func TestDatabaseFilesAreOwnerOnly(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	ctx := context.Background()
	check := func(path string) {
		t.Helper()
		st, err := Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		// A write brings the -wal and -shm files into being.
		if _, err := st.CreateOrg(ctx, "acme-"+filepath.Base(filepath.Dir(path))); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{path, path + "-wal", path + "-shm"} {
			info, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if perm := info.Mode().Perm(); perm != 0o600 {
				t.Errorf("%s: mode %v, want 0600", filepath.Base(p), perm)
			}
		}
	}

	check(filepath.Join(t.TempDir(), "ephemeral.db"))

	// An existing database whose files everyone may read.
	path := filepath.Join(t.TempDir(), "ephemeral.db")
	st, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateOrg(ctx, "before"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Chmod(p, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	check(path) // while the first handle still holds the WAL open
	st.Close()
}
