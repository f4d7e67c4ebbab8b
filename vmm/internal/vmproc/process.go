package vmproc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeralhq/ephemeral/vmm"
)

// Process is a started VMM process, leading its own process group, which
// Start's supervisor reaps. Its methods are safe for concurrent use.
type Process struct {
	cmd      *exec.Cmd
	launched time.Time

	// done is closed once the process has been reaped; waitErr is
	// cmd.Wait's result, set before.
	done    chan struct{}
	waitErr error

	// mu orders Kill's signal to the group against the supervisor's
	// reaping: while exited is false the leader has not been reaped, so
	// its pid, the group id, cannot have been reused by a stranger.
	mu     sync.Mutex
	exited bool
	// killed records that Kill, not the VMM itself, ended the process.
	killed bool
}

// Start starts cmd in its own process group (so that Kill ends whatever
// the VMM spawned too) with SIGKILL as its parent-death signal (so that it
// dies with the daemon, even on a crash), no_new_privs set (so that
// nothing it executes gains privileges through set-user-ID bits or file
// capabilities) and no descriptor of the daemon but those cmd names (see
// closeOnExecAll), adds it to group unless group is nil, and supervises it
// until it exits. It overwrites Setpgid and Pdeathsig of cmd.SysProcAttr;
// the rest of cmd is the caller's.
//
// group receives the process before Start returns: a VMM that starts its
// guest paused (QEMU's -S) or only on request (Cloud Hypervisor's API) has
// run no guest instruction by then. A process that cannot be added is
// killed, and Start fails.
//
// The supervisor holds its OS thread from start to exit, for two reasons.
// The parent-death signal fires when the forking thread ends, not the
// daemon: a thread returned to the pool could later be retired (a
// goroutine that exits while locked to it, as network namespace code does)
// and take a healthy VM down with it. And no_new_privs is a property of
// the thread, inherited across fork: setting it on the forking thread
// confines the VMM and nothing else of the daemon, provided that thread
// never runs another goroutine, so it is retired with the supervisor. The
// kernel clears the parent-death signal when the VMM switches user: from
// then on only a leftover sweep ends it after a crash.
func Start(cmd *exec.Cmd, group vmm.Cgroup) (*Process, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	p := &Process{cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go p.supervise(started, group)
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// supervise starts the process, places it in group, reports the outcome on
// started, then waits for the process to exit, kills whatever it left in
// its group, reaps it and closes done.
func (p *Process) supervise(started chan<- error, group vmm.Cgroup) {
	// Never unlocked: see Start. The thread ends with this goroutine.
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		started <- os.NewSyscallError("prctl PR_SET_NO_NEW_PRIVS", err)
		return
	}
	if err := closeOnExecAll(); err != nil {
		started <- fmt.Errorf("close the daemon's descriptors on exec: %w", err)
		return
	}
	p.launched = time.Now()
	if err := p.cmd.Start(); err != nil {
		started <- err
		return
	}
	pid := p.cmd.Process.Pid
	if group != nil {
		if err := group.AddProcess(pid); err != nil {
			syscall.Kill(-pid, syscall.SIGKILL)
			p.cmd.Wait()
			started <- fmt.Errorf("confine pid %d: %w", pid, err)
			return
		}
	}
	started <- nil
	defer close(p.done)
	// WNOWAIT leaves the leader a zombie, keeping the group id ours until
	// the group has been killed below.
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
	for errors.Is(err, unix.EINTR) {
		err = unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
	}
	p.mu.Lock()
	if err == nil {
		syscall.Kill(-pid, syscall.SIGKILL) // ESRCH: the leader was alone
	}
	// Should waitid fail, whether the leader is reaped is unknown: the
	// group is left alone rather than risk signalling a stranger.
	p.exited = true
	p.mu.Unlock()
	p.waitErr = p.cmd.Wait()
}

// Pid is the VMM's process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Launched is when the process was started.
func (p *Process) Launched() time.Time { return p.launched }

// Done is closed once the process has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Kill sends SIGKILL to the process group, VMM and everything it spawned,
// unless it has exited already. It does not wait: see Done and Wait.
func (p *Process) Kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.exited {
		if syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) == nil {
			p.killed = true
		}
		return
	}
	// The group is no longer safe to signal, but os.Process never signals
	// a reaped process: this ends a leader still running after the
	// supervisor's waitid failed.
	p.cmd.Process.Kill()
}

// Wait blocks until the process has been reaped and returns its exit as
// exec.Cmd.Wait reported it.
func (p *Process) Wait() error {
	<-p.done
	return p.waitErr
}

// Killed reports whether Kill ended the process rather than the process
// exiting by itself. It is meaningful once Done is closed.
func (p *Process) Killed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.killed
}
