package tests

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/sandbox"
)

// cliState makes a state directory of the test's own that shares the real
// guest image, so the CLI's sandboxes land where the test can inspect them.
func cliState(t *testing.T) string {
	t.Helper()
	requireVM(t)
	dir := t.TempDir()
	if err := os.Symlink(filepath.Join(stateDir(), "images"), filepath.Join(dir, "images")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { assertNothingLeft(t, filepath.Join(dir, "sandboxes")) })
	return dir
}

type cliResult struct {
	stdout, stderr string
	code           int
}

func runCLI(t *testing.T, state string, args ...string) cliResult {
	t.Helper()
	bin := buildCLI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"--state-dir", state}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("ephemeral %v: %v", args, err)
	}
	return cliResult{stdout.String(), stderr.String(), code}
}

func TestCLISandboxExec(t *testing.T) {
	state := cliState(t)

	r := runCLI(t, state, "sandbox", "exec", "--", "sh", "-c", "whoami; pwd")
	if r.code != 0 || !regexp.MustCompile(`^worker\n/tmp/ephemeral-run-[A-Za-z0-9]{6}/scratch\n$`).MatchString(r.stdout) {
		t.Errorf("whoami; pwd: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}

	r = runCLI(t, state, "sandbox", "exec", "--", "sh", "-c", "echo out; echo err >&2; exit 7")
	if r.code != 7 || r.stdout != "out\n" || !strings.Contains(r.stderr, "err\n") || strings.Contains(r.stdout, "err") {
		t.Errorf("separate streams and exit code: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}

	r = runCLI(t, state, "sandbox", "exec", "--", "no-such-command")
	if r.code != 127 || !strings.Contains(r.stderr, "no-such-command") {
		t.Errorf("missing command: exit %d, stderr %q", r.code, r.stderr)
	}
}

// Bad input gets an error that says what to do, and boots nothing.
func TestCLIBadInput(t *testing.T) {
	state := cliState(t)
	for _, tc := range []struct {
		name  string
		args  []string
		state string
		want  string
	}{
		{"no image", []string{"sandbox", "exec", "--", "true"}, t.TempDir(), "ephemeral image build"},
		{"unknown flag", []string{"sandbox", "exec", "--bogus", "--", "true"}, state, "flag provided but not defined: -bogus"},
		{"zero timeout", []string{"sandbox", "exec", "--timeout", "0s", "--", "true"}, state, "--timeout must be positive"},
		{"no command", []string{"sandbox", "exec"}, state, "missing COMMAND"},
		{"bad memory", []string{"sandbox", "exec", "--memory", "1", "--", "true"}, state, "memory 1 MiB out of range"},
	} {
		r := runCLI(t, tc.state, tc.args...)
		if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want non-zero and %q", tc.name, r.code, r.stderr, tc.want)
		}
	}
}

// A CLI killed with SIGKILL while its sandbox runs leaves a directory (and
// maybe a VMM) behind; reconciliation removes all of it, and a second
// reconciliation finds nothing.
func TestReconcileAfterSIGKILL(t *testing.T) {
	state := cliState(t)
	bin := buildCLI(t)
	cmd := exec.Command(bin, "--state-dir", state, "sandbox", "exec", "--", "sh", "-c", "echo up; sleep 600")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "up\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("sandbox did not come up: %q %v", line, err)
	}
	runDir := filepath.Join(state, "sandboxes")
	before, _ := filepath.Glob(filepath.Join(runDir, "[0-9a-f]*"))
	if len(before) != 1 {
		t.Fatalf("want one sandbox dir while running, got %v", before)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()

	m, err := sandbox.NewManager(sandbox.Config{StateDir: state, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	swept, err := m.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(swept) != 1 || swept[0] != filepath.Base(before[0]) {
		t.Errorf("reconcile swept %v, want %s", swept, filepath.Base(before[0]))
	}
	again, err := m.Reconcile(ctx)
	if err != nil || len(again) != 0 {
		t.Errorf("second reconcile: swept %v, err %v", again, err)
	}
	if _, err := os.Stat("/run/netns/eph-" + filepath.Base(before[0])); !os.IsNotExist(err) {
		t.Errorf("the killed sandbox's network namespace survived reconciliation: %v", err)
	}
}

// With web off, curl in the sandbox cannot even resolve a name, and the
// sandbox's network namespace is gone when the command returns.
func TestCLINoNetwork(t *testing.T) {
	state := cliState(t)
	r := runCLI(t, state, "sandbox", "exec", "--", "curl", "-sS", "-m", "5", "https://example.com")
	if r.code == 0 || !strings.Contains(r.stderr, "Could not resolve host: example.com") {
		t.Errorf("curl: exit %d, stderr %q", r.code, r.stderr)
	}
	// Another package's test (netns's crash test) may hold an ownerless
	// namespace for a moment on purpose: an orphan is one that stays.
	if orphans := orphanNamespaces(t); len(orphans) > 0 {
		time.Sleep(3 * time.Second)
		if still := orphanNamespaces(t); len(still) > 0 && slices.ContainsFunc(still, func(id string) bool { return slices.Contains(orphans, id) }) {
			t.Errorf("network namespaces without a live owner: %v", still)
		}
	}
}

// orphanNamespaces lists our network namespaces whose owner process is
// gone: those whose ownership lock (see netns) nobody holds. Namespaces of
// sandboxes that other tests run right now are not orphans.
func orphanNamespaces(t *testing.T) []string {
	t.Helper()
	var orphans []string
	paths, _ := filepath.Glob("/run/netns/eph-*")
	for _, p := range paths {
		id := strings.TrimPrefix(filepath.Base(p), "eph-")
		lockPath := "/run/ephemeral/netns/" + id + ".lock"
		f, err := os.OpenFile(lockPath, os.O_RDWR, 0)
		if err != nil {
			orphans = append(orphans, id) // a namespace without its lock file
			continue
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			// Free lock: an orphan, unless its owner removed it meanwhile.
			if _, err := os.Stat(p); err == nil {
				orphans = append(orphans, id)
			}
		}
		f.Close()
	}
	return orphans
}
