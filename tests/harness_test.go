package tests

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/sandbox"
	"github.com/ephemeralhq/ephemeral/internal/testenv"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// stateDir is where `make image` put the guest image.
var stateDir = testenv.StateDir

// requireVM skips (or, under EPHEMERAL_REQUIRE_VM=1, fails) a test that
// cannot boot VMs here, saying what to do about it.
func requireVM(t testing.TB) {
	t.Helper()
	testenv.RequireVM(t)
	if _, err := sandbox.Detect("auto"); err != nil {
		testenv.Skip(t, "%v", err)
	}
}

// newManager returns a manager whose sandboxes live in a directory of the
// test's own, and checks at the end of the test that nothing is left there
// or running.
func newManager(t *testing.T) (*sandbox.Manager, string) {
	t.Helper()
	return newManagerWithLimits(t, sandbox.Limits{})
}

// newManagerWithLimits is newManager with limits other than the defaults.
func newManagerWithLimits(t *testing.T, limits sandbox.Limits) (*sandbox.Manager, string) {
	t.Helper()
	requireVM(t)
	runDir := t.TempDir()
	m, err := sandbox.NewManager(sandbox.Config{StateDir: stateDir(), RunDir: runDir, Logf: t.Logf, Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Shutdown(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		assertNothingLeft(t, runDir)
	})
	return m, runDir
}

// assertNothingLeft fails when a sandbox directory, socket or VMM process
// of runDir survives.
func assertNothingLeft(t testing.TB, runDir string) {
	t.Helper()
	entries, _ := os.ReadDir(runDir)
	for _, e := range entries {
		if e.Name() == ".lock" {
			continue
		}
		t.Errorf("left behind in %s: %s", runDir, e.Name())
	}
	if pids := vmmProcesses(runDir); len(pids) > 0 {
		t.Errorf("VMM processes still running for %s: %v", runDir, pids)
	}
}

// vmmProcesses lists processes whose command line mentions dir: the VMMs
// started for sandboxes in it.
func vmmProcesses(dir string) []string {
	var pids []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if bytes.Contains(b, []byte(dir)) {
			pids = append(pids, strings.Split(p, "/")[2]+" "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return pids
}

func newSandbox(t *testing.T, m *sandbox.Manager) *sandbox.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := m.Create(ctx, sandbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Destroy(); err != nil {
			t.Errorf("destroy: %v", err)
		}
	})
	return sb
}

// result is a finished command as a user sees it.
type result struct {
	vsockproto.ExitStatus
	stdout, stderr string
}

func run(t *testing.T, sb *sandbox.Sandbox, script string) result {
	t.Helper()
	return runReq(t, sb, vsockproto.ExecRequest{Shell: script, Timeout: time.Minute})
}

func runReq(t *testing.T, sb *sandbox.Sandbox, req vsockproto.ExecRequest) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	st, err := sb.Exec(ctx, req, nil, &stdout, &stderr)
	if err != nil {
		t.Fatalf("exec %q: %v", req.Shell+strings.Join(req.Argv, " "), err)
	}
	return result{st, stdout.String(), stderr.String()}
}

// buildCLI builds the ephemeral and ephemeral-init binaries once per test
// binary.
func buildCLI(t *testing.T) string {
	t.Helper()
	cliOnce.Do(func() {
		dir, err := os.MkdirTemp("", "ephemeral-cli-")
		if err != nil {
			cliErr = err
			return
		}
		cliPath = filepath.Join(dir, "ephemeral")
		cmd := exec.Command("go", "build", "-o", cliPath, "../tools/ephemeral")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			cliErr = err
			cliPath = string(out)
		}
	})
	if cliErr != nil {
		t.Fatalf("build ephemeral: %v\n%s", cliErr, cliPath)
	}
	return cliPath
}

var (
	cliOnce sync.Once
	cliPath string
	cliErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if cliPath != "" && cliErr == nil {
		os.RemoveAll(filepath.Dir(cliPath))
	}
	os.Exit(code)
}
