package tests

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// An admin rotates an organisation's webhook secret: it is printed once,
// on stdout alone, each rotation gives a new one, and the database holds
// it sealed only.
func TestCLIWebhookSecretRotate(t *testing.T) {
	state := t.TempDir() // no VM needed: only the database and the key
	if r := runCLI(t, state, "admin", "org", "create", "acme"); r.code != 0 {
		t.Fatalf("org create: %d %q", r.code, r.stderr)
	}
	secret := regexp.MustCompile(`^whsec_[0-9a-f]{64}\n$`)
	first := runCLI(t, state, "admin", "webhook-secret", "rotate", "--org", "acme")
	second := runCLI(t, state, "admin", "webhook-secret", "rotate", "--org", "acme")
	for _, r := range []cliResult{first, second} {
		if r.code != 0 || !secret.MatchString(r.stdout) || strings.Contains(r.stderr, "whsec_") || !strings.Contains(r.stderr, "not shown again") {
			t.Fatalf("rotate: %d %q %q", r.code, r.stdout, r.stderr)
		}
	}
	if first.stdout == second.stdout {
		t.Error("two rotations printed the same secret")
	}
	entries, _ := os.ReadDir(state)
	for _, e := range entries {
		b, _ := os.ReadFile(filepath.Join(state, e.Name()))
		for _, s := range []string{first.stdout, second.stdout} {
			if strings.Contains(string(b), strings.TrimSpace(strings.TrimPrefix(s, "whsec_"))) {
				t.Errorf("%s holds a webhook secret in the clear", e.Name())
			}
		}
	}
	if r := runCLI(t, state, "admin", "webhook-secret", "rotate", "--org", "nobody"); r.code == 0 {
		t.Error("rotated the secret of an organisation that does not exist")
	}
}
