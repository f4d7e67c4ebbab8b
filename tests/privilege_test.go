package tests

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/ephemeralhq/ephemeral/internal/testenv"
)

// runAsNobody runs the CLI as the unprivileged user nobody, with a bare
// environment, and returns what it printed and its exit code.
func runAsNobody(t *testing.T, bin string, args ...string) cliResult {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("ephemeral %v as nobody: %v", args, err)
	}
	return cliResult{stdout.String(), stderr.String(), code}
}

// A command that boots microVMs, builds the image or opens the daemon's
// database, run without root, stops at once with one sentence saying why it
// needs root, and exit status 77 (EX_NOPERM), not with a namespace or
// SQLite error; --version and serve --print-config need no root.
func TestCommandsSayWhyTheyNeedRoot(t *testing.T) {
	testenv.RequireRoot(t) // to run the CLI as another user
	bin := nobodyCanRun(t, buildCLI(t))
	state := t.TempDir() // the daemon's: root's, mode 0700
	if err := os.Chmod(state, 0o700); err != nil {
		t.Fatal(err)
	}
	vms := "needs root: it creates a network namespace, a tap device and nftables rules for each microVM and starts QEMU"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve"}, "ephemeral serve " + vms},
		{[]string{"run", "--replay", "/nonexistent.json"}, "ephemeral run " + vms},
		{[]string{"sandbox", "exec", "--", "true"}, "ephemeral sandbox exec " + vms},
		{[]string{"bench", "-n", "1"}, "ephemeral bench " + vms},
		{[]string{"bench", "density", "-n", "1"}, "ephemeral bench density " + vms},
		{[]string{"bench", "noisy", "-n", "1"}, "ephemeral bench noisy " + vms},
		{[]string{"image", "build"}, "ephemeral image build needs root: debootstrap builds the guest's root filesystem in a chroot"},
		{[]string{"admin", "org", "list"}, "ephemeral admin org list needs to read and write the daemon's state directory " + state},
		{[]string{"admin", "key", "create", "--org", "acme", "--member", "dev@acme.example"}, "ephemeral admin key create needs to read and write"},
	} {
		r := runAsNobody(t, bin, append([]string{"--state-dir", state}, tc.args...)...)
		lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
		if r.code != 77 || len(lines) != 1 || !strings.HasPrefix(lines[0], tc.want) || !strings.HasSuffix(lines[0], "(run it with sudo)") &&
			!strings.HasSuffix(lines[0], "(run it with sudo, as the user ephemeral serve runs as)") {
			t.Errorf("%v: exit %d, stderr %q; want 77 and one line starting %q", tc.args, r.code, r.stderr, tc.want)
		}
	}

	r := runAsNobody(t, bin, "--state-dir", state, "--version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "ephemeral ") || !strings.Contains(r.stdout, "\nvmm:     ") ||
		!strings.Contains(r.stdout, "\nimage:   unreadable: ") {
		t.Errorf("--version as nobody: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runAsNobody(t, bin, "--state-dir", state, "serve", "--print-config")
	if r.code != 0 || !strings.Contains(r.stdout, "state-dir") {
		t.Errorf("serve --print-config as nobody: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// nobodyCanRun copies the binary where the user nobody may execute it (the
// test's temporary directories are root's alone).
func nobodyCanRun(t *testing.T, bin string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ephemeral-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	path := filepath.Join(dir, "ephemeral")
	dst, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}
