package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/ephemeralhq/ephemeral/hostd/auth"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/system"
)

// admin runs `ephemeral --state-dir STATE admin ARGS...` in this process
// and returns what it printed on stdout and stderr.
func admin(t *testing.T, state string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	app := &cli.App{Name: "ephemeral", Flags: settingFlags("config", "state-dir"), Commands: []*cli.Command{adminCommand},
		Writer: &out, ErrWriter: &errOut, ExitErrHandler: func(*cli.Context, error) {}}
	err = app.Run(append([]string{"ephemeral", "--state-dir", state, "admin"}, args...))
	return out.String(), errOut.String(), err
}

func mustAdmin(t *testing.T, state string, args ...string) string {
	t.Helper()
	out, _, err := admin(t, state, args...)
	if err != nil {
		t.Fatalf("admin %v: %v", args, err)
	}
	return out
}

// What an administrator types twice, or gets wrong, is answered in words,
// not in SQLite's.
func TestAdminRefusesDuplicatesAndBadEmails(t *testing.T) {
	state := t.TempDir()
	mustAdmin(t, state, "org", "create", "acme")
	if _, _, err := admin(t, state, "org", "create", "acme"); err == nil || err.Error() != `organisation "acme" already exists` {
		t.Errorf("second acme: %v", err)
	}
	for _, bad := range []string{
		"Dev <dev@acme.example>", // a display name
		"dev@acme.example (Dev)", // a comment
		" dev@acme.example",      // surrounding space
		"dev",                    // no domain
		"dev@acme",               // a domain with no dot
		"dev@@acme.example",
		strings.Repeat("d", 250) + "@acme.example", // longer than an address can be
	} {
		if _, _, err := admin(t, state, "member", "add", "--org", "acme", bad); err == nil || !strings.Contains(err.Error(), "member email") {
			t.Errorf("member %q: %v", bad, err)
		}
	}
	mustAdmin(t, state, "member", "add", "--org", "acme", "dev@acme.example")
	if _, _, err := admin(t, state, "member", "add", "--org", "acme", "dev@acme.example"); err == nil ||
		err.Error() != "dev@acme.example is a member of acme already" {
		t.Errorf("second member: %v", err)
	}
	if _, _, err := admin(t, state, "member", "list", "--org", "acme corp"); err == nil ||
		err.Error() != `no organisation "acme corp" (ephemeral admin org list shows them)` {
		t.Errorf("unknown organisation: %v", err)
	}
	if _, _, err := admin(t, state, "key", "create", "--org", "acme", "--member", "ops@acme.example"); err == nil ||
		!strings.Contains(err.Error(), "ops@acme.example is no member of acme") {
		t.Errorf("key for a stranger: %v", err)
	}
	if out := mustAdmin(t, state, "member", "list", "--org", "acme"); !regexp.MustCompile(`(?m)^dev@acme\.example +mem_[0-9a-f]{16} +\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ$`).MatchString(out) ||
		strings.Count(out, "\n") != 2 {
		t.Errorf("member list:\n%s", out)
	}
}

// The lists show what an administrator looks for: every organisation,
// an organisation's keys with who holds them and when each was last used
// (never a secret), and where its money is.
func TestAdminLists(t *testing.T) {
	state := t.TempDir()
	for _, name := range []string{"globex", "acme"} {
		mustAdmin(t, state, "org", "create", "--no-examples", name)
	}
	if out := mustAdmin(t, state, "org", "list"); !regexp.MustCompile(`^NAME +ID +CREATED\nacme +org_[0-9a-f]{16} +\S+ \S+\nglobex +org_`).MatchString(out) {
		t.Errorf("org list:\n%s", out)
	}
	mustAdmin(t, state, "member", "add", "--org", "acme", "dev@acme.example")
	mustAdmin(t, state, "member", "add", "--org", "acme", "ops@acme.example")
	devKey := strings.TrimSpace(mustAdmin(t, state, "key", "create", "--org", "acme", "--member", "dev@acme.example"))
	opsKey := strings.TrimSpace(mustAdmin(t, state, "key", "create", "--org", "acme", "--member", "ops@acme.example"))

	// The dev key is used once, as the API would.
	ctx := context.Background()
	st, err := store.Open(ctx, system.DatabasePath(state))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := auth.Authenticate(ctx, st, "Bearer "+devKey); err != nil {
		t.Fatal(err)
	}
	st.Close()
	opsID, _ := auth.ParseID(opsKey)
	mustAdmin(t, state, "key", "revoke", opsID)

	out := mustAdmin(t, state, "key", "list", "--org", "acme")
	devID, _ := auth.ParseID(devKey)
	when := `\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ`
	for _, want := range []string{
		`(?m)^KEY +MEMBER +CREATED +LAST USED +REVOKED$`,
		`(?m)^eph_` + devID + `_… +dev@acme\.example +` + when + ` +` + when + ` +-$`,
		`(?m)^eph_` + opsID + `_… +ops@acme\.example +` + when + ` +never +` + when + `$`,
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("key list lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, strings.TrimPrefix(devKey, "eph_"+devID+"_")) {
		t.Errorf("key list shows a secret:\n%s", out)
	}
	if out := mustAdmin(t, state, "key", "list", "--org", "acme", "--member", "ops@acme.example"); strings.Contains(out, devID) || !strings.Contains(out, opsID) {
		t.Errorf("key list --member ops:\n%s", out)
	}

	mustAdmin(t, state, "credit", "--org", "acme", "--micros", "5000000")
	want := "available           $5.00    5000000 micros\n" +
		"held                $0.00          0 micros\n" +
		"charged             $0.00          0 micros\n" +
		"credited            $5.00    5000000 micros\n"
	if out := mustAdmin(t, state, "balance", "show", "--org", "acme"); out != want {
		t.Errorf("balance show:\n%q\nwant\n%q", out, want)
	}
}
