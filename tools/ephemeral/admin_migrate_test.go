package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/internal/flock"
	"github.com/ephemeralhq/ephemeral/internal/pgtest"
)

// An embedded install moves up to PostgreSQL with one command: its
// organisations and money arrive whole, the password is never printed,
// the nodes' secret key is called for, and a second run is refused.
func TestAdminMigrateMovesAnInstallToPostgreSQL(t *testing.T) {
	state := t.TempDir()
	mustAdmin(t, state, "org", "create", "--no-examples", "acme")
	mustAdmin(t, state, "member", "add", "--org", "acme", "dev@acme.example")
	mustAdmin(t, state, "key", "create", "--org", "acme", "--member", "dev@acme.example")
	mustAdmin(t, state, "credit", "--org", "acme", "--micros", "5000000")
	// The test cluster trusts every local connection: the password is
	// only there to be kept out of the output.
	url := strings.Replace(pgtest.Start(t).NewDatabase(t), "postgres://postgres@", "postgres://postgres:s3cr3t-pw@", 1)

	out, errOut, err := admin(t, state, "migrate", "--from", state, "--to", url)
	if err != nil {
		t.Fatalf("migrate: %v\n%s%s", err, out, errOut)
	}
	t.Logf("output:\n%s", out)
	for _, want := range []string{"copied 1 organisations", "credited $5.00", filepath.Join(state, "secret.key"), "EPHEMERAL_SECRET_KEY"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out+errOut, "s3cr3t-pw") {
		t.Errorf("the password was printed:\n%s%s", out, errOut)
	}

	ctx := context.Background()
	st, err := store.OpenPostgres(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	o, err := st.OrgByName(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if a, err := st.Balance(ctx, o.ID); err != nil || a.Available != 5_000_000 || a.Credited != 5_000_000 {
		t.Errorf("balance on PostgreSQL %+v, %v", a, err)
	}
	if keys, err := st.Keys(ctx, o.ID); err != nil || len(keys) != 1 || keys[0].MemberEmail != "dev@acme.example" {
		t.Errorf("keys on PostgreSQL %+v, %v", keys, err)
	}

	_, _, err = admin(t, state, "migrate", "--from", state, "--to", url)
	if err == nil || !strings.Contains(err.Error(), "the target database is not empty") || strings.Contains(err.Error(), "s3cr3t-pw") {
		t.Errorf("second migrate: %v", err)
	}
}

// Wrong input is answered in words, before anything is opened or written.
func TestAdminMigrateRefusesBadInput(t *testing.T) {
	state := t.TempDir()
	mustAdmin(t, state, "org", "create", "--no-examples", "acme")
	empty := t.TempDir()
	const pgURL = "postgres://u:pw@127.0.0.1:1/db"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--from", state}, `Required flag "to" not set`},
		{[]string{"--to", pgURL}, `Required flag "from" not set`},
		{[]string{"--from", state, "--to", "mysql://u:pw@host/db"}, "--to mysql://u:xxxxx@host/db is not a PostgreSQL URL"},
		{[]string{"--from", state, "--to", filepath.Join(state, "other")}, "is not a PostgreSQL URL"},
		{[]string{"--from", empty, "--to", pgURL}, "--from " + empty + " holds no database"},
	} {
		_, _, err := admin(t, state, append([]string{"migrate"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("migrate %v: %v; want %q", c.args, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), ":pw@") {
			t.Errorf("migrate %v printed the password: %v", c.args, err)
		}
	}

	// A daemon serving the state directory holds its lock.
	held, err := flock.TryLock(filepath.Join(state, "daemon.lock"), flock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	_, _, err = admin(t, state, "migrate", "--from", state, "--to", pgURL)
	if want := "a daemon is running on " + state + ": stop it first"; err == nil || err.Error() != want {
		t.Errorf("migrate with a daemon running: %v; want %q", err, want)
	}
}
