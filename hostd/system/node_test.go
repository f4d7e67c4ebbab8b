package system

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/config"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
)

// A single run's private database (ephemeral run) stays a private SQLite
// file when the configuration names a shared database: the run must not
// join the cluster, take other nodes' jobs or end their runs.
func TestAPrivateDatabaseIgnoresTheSharedOne(t *testing.T) {
	cfg := config.Defaults()
	cfg.StateDir = filepath.Join(t.TempDir(), "state")
	// Nothing listens there: using it would fail New.
	cfg.Database = "postgres://nobody@127.0.0.1:1/shared?sslmode=disable&connect_timeout=2"
	private := filepath.Join(t.TempDir(), "ephemeral.db")
	sys, err := New(context.Background(), cfg, Options{Database: private,
		Executor: executorFunc(func(context.Context, runs.Spec, *runs.Recorder) (runs.Result, error) { return runs.Result{}, nil })})
	if err != nil {
		t.Fatalf("New with a private database tried the shared one: %v", err)
	}
	defer sys.Close()
	if sys.Store.Postgres() {
		t.Fatal("the store is the shared PostgreSQL database")
	}
	if _, err := os.Stat(private); err != nil {
		t.Fatalf("the private SQLite file: %v", err)
	}
}
