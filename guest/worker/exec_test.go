package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// newRunner returns a Runner whose account files describe the test's own
// user as "worker", so that commands run without privileges.
func newRunner(t *testing.T) *Runner {
	t.Helper()
	// Orphans of the commands come to this process, as they would to
	// PID 1, so that the reaper's handling of them is exercised.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatalf("prctl: %v", err)
	}
	root := t.TempDir()
	home := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	uid, gid := os.Getuid(), os.Getgid()
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/bin/bash\nworker:x:%d:%d::%s:/bin/bash\n", uid, gid, home)
	if err := os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "group"), []byte(fmt.Sprintf("worker:x:%d:\n", gid)), 0o644); err != nil {
		t.Fatal(err)
	}
	r := &Runner{Reaper: NewReaper(), Root: root, ScratchDir: t.TempDir(), OutputGrace: 50 * time.Millisecond}
	t.Cleanup(func() {
		r.Wait()
		r.Reaper.Close()
	})
	return r
}

// lockedBuffer is written by the output copiers while tests may read it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type outcome struct {
	status         vsockproto.ExitStatus
	stdout, stderr string
}

func run(t *testing.T, r *Runner, req vsockproto.ExecRequest, stdin string, signals <-chan int) outcome {
	t.Helper()
	var stdout, stderr lockedBuffer
	status, err := r.Run(context.Background(), req, vsockproto.ExecIO{
		Stdin: strings.NewReader(stdin), Stdout: &stdout, Stderr: &stderr, Signals: signals,
	})
	if err != nil {
		t.Fatalf("Run(%+v): %v", req, err)
	}
	return outcome{status: status, stdout: stdout.String(), stderr: stderr.String()}
}

func TestRunReportsOutputAndExit(t *testing.T) {
	r := newRunner(t)
	cases := []struct {
		name       string
		req        vsockproto.ExecRequest
		stdin      string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{"argv", vsockproto.ExecRequest{Argv: []string{"echo", "a b", "c"}}, "", 0, "a b c\n", ""},
		{"shell exit code", vsockproto.ExecRequest{Shell: "echo out; echo err >&2; exit 3"}, "", 3, "out\n", "err\n"},
		{"stdin", vsockproto.ExecRequest{Argv: []string{"tr", "a-z", "A-Z"}}, "hello\n", 0, "HELLO\n", ""},
		{"not found", vsockproto.ExecRequest{Argv: []string{"no-such-program-xyz"}}, "", 127, "", "no-such-program-xyz: command not found\n"},
		{"missing path", vsockproto.ExecRequest{Argv: []string{"./nope"}}, "", 127, "", "./nope: No such file or directory\n"},
		{"scratch dir", vsockproto.ExecRequest{Shell: "pwd"}, "", 0, r.ScratchDir + "\n", ""},
		{"relative dir", vsockproto.ExecRequest{Shell: "mkdir -p sub && cd sub && pwd"}, "", 0, r.ScratchDir + "/sub\n", ""},
		{"environment", vsockproto.ExecRequest{Argv: []string{"sh", "-c", "echo $USER $LANG $X; [ -d \"$HOME\" ] && echo home"}, Env: []string{"X=1", "X=2"}}, "", 0, "worker C.UTF-8 2\nhome\n", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := run(t, r, c.req, c.stdin, nil)
			if got.status.Code != c.wantCode || got.stdout != c.wantStdout || got.stderr != c.wantStderr {
				t.Errorf("got exit %d stdout %q stderr %q; want exit %d stdout %q stderr %q",
					got.status.Code, got.stdout, got.stderr, c.wantCode, c.wantStdout, c.wantStderr)
			}
		})
	}
}

func TestRunRejectsBadRequests(t *testing.T) {
	r := newRunner(t)
	for _, req := range []vsockproto.ExecRequest{
		{},
		{Argv: []string{"true"}, Shell: "true"},
		{Argv: []string{"true"}, User: "nobody-here"},
	} {
		if _, err := r.Run(context.Background(), req, vsockproto.ExecIO{Stdout: &lockedBuffer{}, Stderr: &lockedBuffer{}}); err == nil {
			t.Errorf("Run(%+v): no error", req)
		}
	}
}

// gone reports whether pid no longer exists (it was killed and reaped).
func gone(t *testing.T, pid int) bool {
	t.Helper()
	// The reaper collects the orphan asynchronously; this bounds the
	// wait for it, it does not measure anything.
	for i := 0; i < 500; i++ {
		if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

func TestTimeoutKillsWholeGroup(t *testing.T) {
	r := newRunner(t)
	got := run(t, r, vsockproto.ExecRequest{
		Shell:   "sh -c 'sleep 1000 & echo $! > bg.pid; sleep 1000'",
		Timeout: 300 * time.Millisecond,
	}, "", nil)
	if !got.status.TimedOut || got.status.Signal != int(unix.SIGKILL) || got.status.Code != -1 {
		t.Fatalf("status = %+v, want timed out, killed by SIGKILL", got.status)
	}
	data, err := os.ReadFile(filepath.Join(r.ScratchDir, "bg.pid"))
	if err != nil {
		t.Fatal(err)
	}
	bg, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	if !gone(t, bg) {
		t.Errorf("background sleep %d survived the timeout", bg)
	}
}

func TestBackgroundChildDoesNotBlockExit(t *testing.T) {
	r := newRunner(t)
	got := run(t, r, vsockproto.ExecRequest{Shell: "sleep 1000 & echo $! > bg.pid; echo started"}, "", nil)
	if got.status.Code != 0 || got.stdout != "started\n" {
		t.Fatalf("got %+v stdout %q", got.status, got.stdout)
	}
	data, err := os.ReadFile(filepath.Join(r.ScratchDir, "bg.pid"))
	if err != nil {
		t.Fatal(err)
	}
	bg, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	if err := unix.Kill(bg, unix.SIGKILL); err != nil {
		t.Fatalf("background child should still run after the exit was reported: %v", err)
	}
	if !gone(t, bg) {
		t.Errorf("orphan %d was not reaped", bg)
	}
}

func TestSignalsReachProcessGroup(t *testing.T) {
	r := newRunner(t)
	signals := make(chan int, 1)
	signals <- int(unix.SIGTERM)
	got := run(t, r, vsockproto.ExecRequest{Argv: []string{"sleep", "1000"}}, "", signals)
	if got.status.Signal != int(unix.SIGTERM) || got.status.Code != -1 || got.status.TimedOut {
		t.Fatalf("status = %+v, want killed by SIGTERM", got.status)
	}
}

// TestReaperDeliversEachStatusToItsOwner starts many short processes at
// once; a reaper that raced with registration would lose or swap statuses.
func TestReaperDeliversEachStatusToItsOwner(t *testing.T) {
	r := newRunner(t)
	var wg sync.WaitGroup
	for code := 0; code < 40; code++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got := run(t, r, vsockproto.ExecRequest{Argv: []string{"sh", "-c", "exit " + strconv.Itoa(code)}}, "", nil)
			if got.status.Code != code {
				t.Errorf("exit %d reported as %+v", code, got.status)
			}
		}()
	}
	wg.Wait()
}

func TestContextCancelKillsCommand(t *testing.T) {
	r := newRunner(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	status, err := r.Run(ctx, vsockproto.ExecRequest{Argv: []string{"sleep", "1000"}}, vsockproto.ExecIO{
		Stdin: strings.NewReader(""), Stdout: &lockedBuffer{}, Stderr: &lockedBuffer{},
	})
	if err != nil {
		t.Fatal(err)
	}
	if status.Signal != int(unix.SIGKILL) {
		t.Errorf("status = %+v, want SIGKILL after the stream's context ended", status)
	}
}

// A command the user's process limit leaves no room for fails with a
// message saying so, as a shell's failed fork would, not with a protocol
// error.
func TestProcessLimitFailsTheCommandClearly(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: the limit binds unprivileged users only, and only root can run commands as one")
	}
	r := newRunner(t)
	// The worker becomes nobody, which the limit binds.
	const nobody = 65534
	passwd := fmt.Sprintf("worker:x:%d:%d::/nonexistent:/bin/sh\n", nobody, nobody)
	if err := os.WriteFile(filepath.Join(r.Root, "etc", "passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.Root, "etc", "group"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// t.TempDir's parents are private to root: nobody needs a way in.
	scratch, err := os.MkdirTemp("", "worker-scratch-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(scratch)
	if err := os.Chmod(scratch, 0o777); err != nil {
		t.Fatal(err)
	}
	r.ScratchDir = scratch
	// The kernel checks the limit against the user's other processes
	// when a command switches to the user: give it one.
	other := exec.Command("sleep", "60")
	other.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { other.Process.Kill(); other.Wait() }()
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NPROC, &old); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_NPROC, &unix.Rlimit{Cur: 0, Max: 0}); err != nil {
		t.Fatal(err)
	}
	defer unix.Setrlimit(unix.RLIMIT_NPROC, &old)

	got := run(t, r, vsockproto.ExecRequest{Argv: []string{"true"}}, "", nil)
	if got.status.Code != 126 || !strings.Contains(got.stderr, "true: cannot start: user worker has as many processes as it may (0)") {
		t.Errorf("command over the process limit: %+v, stderr %q", got.status, got.stderr)
	}
}
