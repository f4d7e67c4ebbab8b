package cgroup

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/internal/sandboxid"
	"github.com/ephemeralhq/ephemeral/internal/testenv"
)

// kernelHierarchy detects this host's hierarchy with a subtree of the
// test's own, removed at the end.
func kernelHierarchy(t *testing.T) *Hierarchy {
	t.Helper()
	testenv.RequireRoot(t)
	h, err := Detect("ephemeral-test-" + sandboxid.New())
	if err != nil {
		testenv.Skip(t, "no usable cgroups on this host: %v", err)
	}
	t.Cleanup(func() {
		for _, dir := range h.subtrees() {
			if err := os.Remove(dir); err != nil {
				t.Errorf("remove the test's subtree: %v", err)
			}
		}
		os.Remove(h.lockDir)
	})
	t.Logf("%s", h)
	return h
}

// startHeld starts script under sh, waiting on its stdin until release is
// called: the test adds it to a group first, so that everything it starts
// is born there.
func startHeld(t *testing.T, script string) (cmd *exec.Cmd, release func()) {
	t.Helper()
	cmd = exec.Command("sh", "-c", "read go; "+script)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr testenv.SyncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("stderr of %q: %s", script, stderr.String())
		}
	})
	return cmd, func() { io.WriteString(stdin, "go\n") }
}

func inGroup(t *testing.T, pid int, id string) bool {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(raw), "/"+id+"\n")
}

// Two threads of work that would each take a CPU get one CPU's worth
// between them: the quota, measured by the group's own accounting.
func TestKernelCPUQuota(t *testing.T) {
	h := kernelHierarchy(t)
	if runtime.NumCPU() < 2 {
		t.Skip("needs two CPUs: on one, two spinners cannot exceed a one-CPU quota anyway")
	}
	id := sandboxid.New()
	g, err := h.Create(id, Limits{CPUs: 1, MemoryBytes: 64 << 20, Tasks: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Remove()
	cmd, release := startHeld(t, "spin() { while :; do :; done; }; spin & spin & wait")
	if err := g.AddProcess(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if !inGroup(t, cmd.Process.Pid, id) {
		t.Fatalf("pid %d is not in group %s", cmd.Process.Pid, id)
	}
	release()
	time.Sleep(200 * time.Millisecond) // both spinners running
	const window = 2 * time.Second
	before, err := g.CPUTime()
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	time.Sleep(window)
	after, err := g.CPUTime()
	elapsed := time.Since(began)
	if err != nil {
		t.Fatal(err)
	}
	used := after - before
	// CFS enforces the quota per 100 ms period: one period of slack
	// covers a window that starts or ends mid-period.
	if limit := elapsed + cpuPeriodMicros*time.Microsecond; used > limit {
		t.Errorf("the group used %v of CPU in %v with a one-CPU quota (limit %v)", used, elapsed, limit)
	}
	if used < window/10 {
		t.Errorf("the group used only %v of CPU in %v: its accounting does not see the spinners", used, elapsed)
	}
	t.Logf("two spinners under a one-CPU quota used %v of CPU in %v", used, elapsed)
}

func TestKernelTasksLimit(t *testing.T) {
	h := kernelHierarchy(t)
	id := sandboxid.New()
	g, err := h.Create(id, Limits{CPUs: 1, MemoryBytes: 64 << 20, Tasks: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Remove()
	forks, release := startHeld(t, "for i in 1 2 3 4 5 6 7 8; do sleep 60 & done; wait")
	if err := g.AddProcess(forks.Process.Pid); err != nil {
		t.Fatal(err)
	}
	release()
	time.Sleep(500 * time.Millisecond)
	raw, err := os.ReadFile(filepath.Join(h.pids, id, "pids.current"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.TrimSpace(string(raw)); n != "4" {
		t.Errorf("pids.current = %s with a limit of 4 and nine processes wanted", n)
	}
}

func TestKernelMemoryLimit(t *testing.T) {
	h := kernelHierarchy(t)
	const python = "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Skipf("needs %s to allocate memory", python)
	}
	g, err := h.Create(sandboxid.New(), Limits{CPUs: 1, MemoryBytes: 48 << 20, Tasks: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Remove()
	hog, release := startHeld(t, "exec "+python+` -c 'b = b"x" * (256 << 20); print(len(b))'`)
	if err := g.AddProcess(hog.Process.Pid); err != nil {
		t.Fatal(err)
	}
	release()
	err = hog.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("a process allocating 256 MiB in a 48 MiB group ended with %v, want killed", err)
	}
	if kills, err := g.OOMKills(); err != nil || kills < 1 {
		t.Errorf("OOMKills() = %d, %v; want the kill counted", kills, err)
	}
	if peak, err := g.MemoryPeak(); err != nil || peak > 48<<20 || peak < 32<<20 {
		t.Errorf("MemoryPeak() = %d, %v; want close to the 48 MiB limit", peak, err)
	}
}

// Remove kills what runs in the group; Reconcile does the same for a
// group whose owner died, and leaves a live owner's alone.
func TestKernelRemoveAndReconcile(t *testing.T) {
	h := kernelHierarchy(t)
	limits := Limits{CPUs: 1, MemoryBytes: 64 << 20, Tasks: 16, IOWeight: 100}
	start := func(g *Group) *exec.Cmd {
		cmd, release := startHeld(t, "sleep 600 & wait")
		if err := g.AddProcess(cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
		release()
		return cmd
	}
	exited := func(cmd *exec.Cmd) bool {
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
			return true
		case <-time.After(10 * time.Second):
			return false
		}
	}

	removed, err := h.Create(sandboxid.New(), limits)
	if err != nil {
		t.Fatal(err)
	}
	cmd := start(removed)
	if err := removed.Remove(); err != nil {
		t.Fatal(err)
	}
	if !exited(cmd) {
		t.Error("Remove left the group's process running")
	}
	if h.exists(removed.id) {
		t.Errorf("Remove left %q", h.Dirs(removed.id))
	}

	live, err := h.Create(sandboxid.New(), limits)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Remove()
	liveCmd := start(live)
	dead, err := h.Create(sandboxid.New(), limits)
	if err != nil {
		t.Fatal(err)
	}
	deadCmd := start(dead)
	dead.owner.Close() // its owner dies

	swept, err := h.Reconcile(context.Background(), func(string) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	if len(swept) != 1 || swept[0] != dead.id {
		t.Errorf("Reconcile swept %q, want only %s", swept, dead.id)
	}
	if !exited(deadCmd) {
		t.Error("Reconcile left the dead owner's process running")
	}
	if h.exists(dead.id) {
		t.Errorf("Reconcile left %q", h.Dirs(dead.id))
	}
	if liveCmd.ProcessState != nil || !inGroup(t, liveCmd.Process.Pid, live.id) {
		t.Error("Reconcile touched a live owner's group")
	}
}
