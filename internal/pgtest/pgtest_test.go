package pgtest

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) { RunMain(m) }

func TestNewDatabasesAreDistinctAndStopRemovesCluster(t *testing.T) {
	c := Start(t)
	a, b := c.NewDatabase(t), c.NewDatabase(t)
	if a == b {
		t.Fatalf("two NewDatabase calls returned the same URL %s", a)
	}
	// Through psql and the URLs themselves, which libpq parses as pgx does.
	var names [2]string
	for i, u := range []string{a, b} {
		out, err := c.srv.Psql(u, "select current_database()")
		if err != nil {
			t.Fatalf("psql %s: %v: %s", u, err, out)
		}
		names[i] = out
	}
	if names[0] == "" || names[0] == names[1] {
		t.Errorf("databases %q and %q, want two distinct ones", names[0], names[1])
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(c.Dir()); !os.IsNotExist(err) {
		t.Errorf("after Stop, stat %s: %v; want it gone", c.Dir(), err)
	}
}

func TestShared(t *testing.T) {
	c := Shared(t)
	if Shared(t) != c {
		t.Fatal("Shared started a second cluster")
	}
	u := c.NewDatabase(t)
	if out, err := c.srv.Psql(u, "select 1"); err != nil || out != "1" {
		t.Errorf("psql %s: %q, %v; want 1", u, out, err)
	}
}
