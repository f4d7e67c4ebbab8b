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

	"golang.org/x/sys/unix"
)

// startWithChild starts a shell that leaves a sleeping child in its process
// group, as a VMM's helper process would, then runs script. It returns the
// process and the child's pid.
func startWithChild(t *testing.T, script string) (*Process, int) {
	t.Helper()
	pidFile := filepath.Join(t.TempDir(), "child")
	cmd := exec.Command("sh", "-c", `sleep 1000 & echo $! > "$0.tmp" && mv "$0.tmp" "$0"; `+script, pidFile)
	p, err := Start(cmd, nil)
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
	if _, err := Start(exec.Command("/nonexistent/vmm"), nil); err == nil {
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
		p, err := Start(exec.Command("sleep", "1000"), nil)
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

// noNewPrivs reads the NoNewPrivs flag of a task's status file.
func noNewPrivs(t *testing.T, status string) bool {
	t.Helper()
	raw, err := os.ReadFile(status)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "NoNewPrivs:"); ok {
			return strings.TrimSpace(v) == "1"
		}
	}
	t.Fatalf("%s has no NoNewPrivs line", status)
	return false
}

// threadsWithNoNewPrivs counts this process's threads that have it,
// leaving out the main thread: the Go runtime never retires that one, it
// parks it for good when a goroutine exits locked to it, so it runs no
// goroutine again whatever its flags.
func threadsWithNoNewPrivs(t *testing.T) int {
	t.Helper()
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil {
		t.Fatal(err)
	}
	main := "/proc/self/task/" + strconv.Itoa(os.Getpid()) + "/status"
	n := 0
	for _, status := range tasks {
		if status == main {
			continue
		}
		if _, err := os.Stat(status); err == nil && noNewPrivs(t, status) {
			n++
		}
	}
	return n
}

// waitThreadsWithNoNewPrivs waits a while for the count to become want:
// a thread is retired shortly after its goroutine ends.
func waitThreadsWithNoNewPrivs(t *testing.T, want int) int {
	t.Helper()
	n := threadsWithNoNewPrivs(t)
	for deadline := time.Now().Add(5 * time.Second); n != want && time.Now().Before(deadline); n = threadsWithNoNewPrivs(t) {
		time.Sleep(10 * time.Millisecond)
	}
	return n
}

// goroutinesSeeNoNewPrivs runs goroutines on threads of the pool and
// reports whether any of them runs with no_new_privs.
func goroutinesSeeNoNewPrivs(t *testing.T) bool {
	t.Helper()
	const probes = 64
	seen := make(chan bool, probes)
	for range probes {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			v, _ := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
			time.Sleep(time.Millisecond) // keep the thread, so the others spread out
			seen <- v == 1
		}()
	}
	any := false
	for range probes {
		any = <-seen || any
	}
	return any
}

// The VMM runs with no_new_privs; of the daemon, only the thread that
// forked it has the flag, and that thread runs nothing else and ends with
// the VMM.
func TestNoNewPrivsForTheVMMOnly(t *testing.T) {
	p, err := Start(exec.Command("sleep", "1000"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !noNewPrivs(t, "/proc/"+strconv.Itoa(p.Pid())+"/status") {
		t.Error("the VMM process runs without no_new_privs")
	}
	if goroutinesSeeNoNewPrivs(t) {
		t.Error("other goroutines run with no_new_privs while a VMM runs")
	}
	p.Kill()
	p.Wait()
	if n := waitThreadsWithNoNewPrivs(t, 0); n != 0 {
		t.Errorf("%d threads of the daemon keep no_new_privs after the VMM exited: the supervisor's thread went back to the pool", n)
	}
	if goroutinesSeeNoNewPrivs(t) {
		t.Error("goroutines run with no_new_privs after the VMM exited")
	}
}

// recordingGroup is a cgroup that records what it is given.
type recordingGroup struct {
	pids  []int
	alive bool // the process existed when it was added
	err   error
}

func (g *recordingGroup) AddProcess(pid int) error {
	g.pids = append(g.pids, pid)
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	g.alive = err == nil
	return g.err
}

func TestStartAddsTheProcessToItsGroup(t *testing.T) {
	group := &recordingGroup{}
	p, err := Start(exec.Command("sleep", "1000"), group)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { p.Kill(); p.Wait() }()
	if len(group.pids) != 1 || group.pids[0] != p.Pid() || !group.alive {
		t.Errorf("group got %v (process alive: %v), want the VMM's pid %d once", group.pids, group.alive, p.Pid())
	}
}

// A VMM that cannot be confined does not run.
func TestStartFailsWhenTheGroupRefuses(t *testing.T) {
	group := &recordingGroup{err: errors.New("no such group")}
	p, err := Start(exec.Command("sleep", "1000"), group)
	if err == nil {
		p.Kill()
		p.Wait()
		t.Fatal("Start succeeded although the group refused the process")
	}
	if !strings.Contains(err.Error(), "no such group") {
		t.Errorf("Start error %v: want the group's reason", err)
	}
	if len(group.pids) != 1 || !gone(t, group.pids[0]) {
		t.Errorf("the refused process %v is still running", group.pids)
	}
}

// The VMM gets its stdio and ExtraFiles, nothing else of the daemon: not a
// descriptor the daemon inherited without close-on-exec either.
func TestVMMInheritsOnlyItsOwnDescriptors(t *testing.T) {
	// Named memory files, so the child's descriptors can be told apart
	// from what its own start-up (the dynamic loader) opens for a moment.
	inherited, err := unix.MemfdCreate("leaked-canary", 0) // no close-on-exec, as from a parent shell
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(inherited)
	extraFD, err := unix.MemfdCreate("extra-canary", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	extra := os.NewFile(uintptr(extraFD), "extra")
	defer extra.Close()
	cmd := exec.Command("sleep", "1000")
	cmd.ExtraFiles = []*os.File{extra}
	p, err := Start(cmd, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { p.Kill(); p.Wait() }()
	fdDir := "/proc/" + strconv.Itoa(p.Pid()) + "/fd"
	entries, err := os.ReadDir(fdDir)
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]string{}
	for _, e := range entries {
		targets[e.Name()], _ = os.Readlink(filepath.Join(fdDir, e.Name()))
	}
	for fd, target := range targets {
		if strings.Contains(target, "leaked-canary") {
			t.Errorf("the VMM inherited the daemon's descriptor %d as its %s", inherited, fd)
		}
	}
	if !strings.Contains(targets["3"], "extra-canary") {
		t.Errorf("the VMM's descriptor 3 is %q, want its extra file", targets["3"])
	}
}
