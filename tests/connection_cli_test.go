package tests

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/examplecrm"
	"github.com/ephemeralhq/ephemeral/hostd/seal"
)

// An admin registers a connection with a secret header: listing shows the
// header's name only, and neither the database nor the output holds the
// secret; the key it is sealed with is private to root.
func TestCLIConnectionSecretsStaySealed(t *testing.T) {
	state := t.TempDir() // no VM needed: only the database and the key
	t.Setenv("EPHEMERAL_SECRET_KEY", "")
	os.Unsetenv("EPHEMERAL_SECRET_KEY")
	secret := "canary-" + randomHex(12)

	r := runCLI(t, state, "admin", "org", "create", "acme")
	if r.code != 0 || !strings.Contains(r.stdout, examplecrm.Name) {
		t.Fatalf("org create: %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, state, "admin", "connection", "add", "--org", "acme", "--name", "crm",
		"--base-url", "https://crm.example.com/api", "--header", "Authorization: Bearer "+secret, "--methods", "GET,HEAD")
	if r.code != 0 {
		t.Fatalf("connection add: %d %q", r.code, r.stderr)
	}
	r = runCLI(t, state, "admin", "connection", "add", "--org", "acme", "--name", "plain",
		"--base-url", "http://crm.example.com", "--header", "Authorization: Bearer "+secret)
	if r.code == 0 {
		t.Error("a plain-http base URL was accepted")
	}
	list := runCLI(t, state, "admin", "connection", "list", "--org", "acme")
	if list.code != 0 || !strings.Contains(list.stdout, "https://crm.example.com/api") || !strings.Contains(list.stdout, "Authorization") {
		t.Errorf("list: %q %q", list.stdout, list.stderr)
	}
	for _, out := range []string{r.stdout, r.stderr, list.stdout, list.stderr} {
		if strings.Contains(out, secret) {
			t.Errorf("the CLI printed the secret: %q", out)
		}
	}
	entries, _ := os.ReadDir(state)
	for _, e := range entries {
		b, _ := os.ReadFile(filepath.Join(state, e.Name()))
		if strings.Contains(string(b), secret) {
			t.Errorf("%s holds the secret in the clear", e.Name())
		}
	}
	info, err := os.Stat(filepath.Join(state, seal.KeyFile))
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("key file: %v, %v", info, err)
	}
	if r := runCLI(t, state, "admin", "connection", "remove", "--org", "acme", "--name", "crm"); r.code != 0 {
		t.Errorf("remove: %q", r.stderr)
	}
	if list := runCLI(t, state, "admin", "connection", "list", "--org", "acme"); strings.Contains(list.stdout, "crm.example.com") {
		t.Errorf("removed connection still listed: %q", list.stdout)
	}
}
