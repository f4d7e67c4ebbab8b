package vmproc

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startWithChild starts a shell that leaves a sleeping child in its process
// group, as a VMM's helper process would, then runs script. It returns the
// process and the child's pid.
func startWithChild(t *testing.T, script string) (*Process, int) {
	t.Helper()
	pidFile := filepath.Join(t.TempDir(), "child")
	cmd := exec.Command("sh", "-c", `sleep 1000 & echo $! > "$0.tmp" && mv "$0.tmp" "$0"; `+script, pidFile)
	p, err := Start(cmd)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { p.Kill(); p.Wait() })
	for {
		exited := false
		select {
		case <-p.Done():
			exited = true
		default:
		}
		b, err := os.ReadFile(pidFile)
		if err == nil {
			child, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatal(err)
			}
			return p, child
		}
		if exited {
			t.Fatalf("the process exited before its child started: %v", p.Wait())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// gone reports whether pid has exited (a zombie counts: its parent, not
// the process, is what keeps it listed).
func gone(t *testing.T, pid int) bool {
	t.Helper()
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, os.ErrNotExist) {
		return true
	}
	if err != nil {
		t.Fatal(err)
	}
	i := strings.LastIndexByte(string(stat), ')')
	return i >= 0 && i+2 < len(stat) && (stat[i+2] == 'Z' || stat[i+2] == 'X')
}

// waitGone waits a while for pid to exit; the kernel delivers SIGKILL
// asynchronously to a process that is not our child.
func waitGone(t *testing.T, pid int) bool {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if gone(t, pid) {
			return true
		}
	}
	return false
}

func TestKillEndsTheGroup(t *testing.T) {
	p, child := startWithChild(t, "exec sleep 1000")
	if pgid, err := syscall.Getpgid(p.Pid()); err != nil || pgid != p.Pid() {
		t.Errorf("process group %d (%v), want the process's own, %d", pgid, err, p.Pid())
	}
	p.Kill()
	err := p.Wait()
	if err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("Wait() = %v, want killed", err)
	}
	if !p.Killed() {
		t.Error("Killed() = false after Kill ended the process")
	}
	if !waitGone(t, child) {
		t.Errorf("child %d outlived Kill", child)
	}
	p.Kill() // after the exit: must not signal anything
}

func TestExitKillsWhatTheProcessLeft(t *testing.T) {
	p, child := startWithChild(t, "exit 3")
	err := p.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Errorf("Wait() = %v, want exit status 3", err)
	}
	if p.Killed() {
		t.Error("Killed() = true for a process that exited by itself")
	}
	if !waitGone(t, child) {
		t.Errorf("child %d outlived its group leader", child)
	}
	if p.Launched().IsZero() {
		t.Error("Launched() is zero")
	}
}

func TestStartFailure(t *testing.T) {
	if _, err := Start(exec.Command("/nonexistent/vmm")); err == nil {
		t.Fatal("Start of a missing binary succeeded")
	}
}

// The parent-death signal fires when the thread that forked the process
// ends. A process started from a goroutine that exits while locked to its
// thread (which retires the thread) must keep running.
func TestProcessOutlivesStartingThread(t *testing.T) {
	started := make(chan *Process, 1)
	go func() {
		// Never unlocked: the thread ends with this goroutine.
		runtime.LockOSThread()
		p, err := Start(exec.Command("sleep", "1000"))
		if err != nil {
			t.Error(err)
		}
		started <- p
	}()
	p := <-started
	if p == nil {
		t.FailNow()
	}
	defer func() { p.Kill(); p.Wait() }()
	select {
	case <-p.Done():
		t.Fatalf("the process died with the thread that started it: %v", p.Wait())
	case <-time.After(200 * time.Millisecond):
	}
}
