// Package worker runs commands in the guest on behalf of the host: as an
// unprivileged user, in their own process group and cgroup, with timeouts
// that kill all of a command's processes, a bound on how many it may have,
// and with PID 1's duty of reaping every orphan.
package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeralhq/ephemeral/internal/cleanup"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// DefaultUser runs commands whose request names no user.
const DefaultUser = "worker"

// DefaultOutputGrace is how long Run keeps reading output after the main
// process exited, for background children that still hold stdout open.
const DefaultOutputGrace = 250 * time.Millisecond

// Runner executes guest commands. Its zero value is not usable; fill the
// exported fields.
type Runner struct {
	Reaper *Reaper
	// Root is where the account files are read ("/" in the guest).
	Root string
	// ScratchDir is the default and the base of relative working dirs.
	ScratchDir string
	// OutputGrace overrides DefaultOutputGrace when positive.
	OutputGrace time.Duration
	// Groups, when set, puts each command in a cgroup of its own: the
	// guest init sets it; tests on a host may leave it nil.
	Groups *CommandGroups

	// stdinPumps copy host stdin into processes. A pump blocks in the
	// host stream's Read until the stream ends, which happens only after
	// Run returns, so Run cannot wait for it; Wait does.
	stdinPumps sync.WaitGroup
}

// Wait waits for the stdin pumps of finished commands, which end once the
// protocol closes their streams.
func (r *Runner) Wait() {
	r.stdinPumps.Wait()
}

// Run executes req and reports how it ended. An error means the command
// could not be started; a command that is not found exits with 127 like
// in a shell.
func (r *Runner) Run(ctx context.Context, req vsockproto.ExecRequest, stdio vsockproto.ExecIO) (vsockproto.ExitStatus, error) {
	if err := req.Validate(); err != nil {
		return vsockproto.ExitStatus{}, fmt.Errorf("worker: %w", err)
	}
	user := req.User
	if user == "" {
		user = DefaultUser
	}
	acct, err := LookupAccount(r.Root, user)
	if err != nil {
		return vsockproto.ExitStatus{}, err
	}
	env := buildEnv(acct, req.Env)
	dir := req.Dir
	if dir == "" {
		dir = r.ScratchDir
	} else if !filepath.IsAbs(dir) {
		dir = filepath.Join(r.ScratchDir, dir)
	}
	argv := req.Argv
	if req.Shell != "" {
		argv = []string{"/bin/bash", "-c", req.Shell}
	}
	path, found := lookPath(argv[0], envPath(env), dir)
	if !found {
		msg := "command not found"
		if strings.Contains(argv[0], "/") {
			msg = "No such file or directory"
		}
		fmt.Fprintf(stdio.Stderr, "%s: %s\n", argv[0], msg)
		return vsockproto.ExitStatus{Code: 127}, nil
	}

	p, err := r.start(path, argv, env, dir, acct)
	if errors.Is(err, unix.EAGAIN) {
		// The user has all the processes its limit allows (RLIMIT_NPROC,
		// set by the init); a shell that cannot fork fails the same way.
		fmt.Fprintf(stdio.Stderr, "%s: cannot start: user %s has as many processes as it may%s\n", argv[0], user, processLimit())
		return vsockproto.ExitStatus{Code: 126}, nil
	}
	if err != nil {
		return vsockproto.ExitStatus{}, err
	}
	return r.supervise(ctx, p, req.Timeout, stdio), nil
}

// process is a started command and the parent's ends of its pipes.
type process struct {
	pid     int
	exited  <-chan unix.WaitStatus
	started time.Time
	stdin   *os.File
	stdout  *os.File
	stderr  *os.File
	// group is the command's cgroup; nil without Runner.Groups.
	group *commandGroup
}

func (r *Runner) start(path string, argv, env []string, dir string, acct Account) (*process, error) {
	// undo closes everything opened so far unless start succeeds.
	var undo cleanup.Stack
	defer undo.Run()
	pipe := func() (*os.File, *os.File, error) {
		rd, wr, err := os.Pipe()
		if err != nil {
			return nil, nil, fmt.Errorf("worker: pipe: %w", err)
		}
		undo.AddErr(rd.Close)
		undo.AddErr(wr.Close)
		return rd, wr, nil
	}
	inR, inW, err := pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := pipe()
	if err != nil {
		return nil, err
	}
	attr := &syscall.ProcAttr{
		Dir:   dir,
		Env:   env,
		Files: []uintptr{inR.Fd(), outW.Fd(), errW.Fd()},
		Sys: &syscall.SysProcAttr{
			// Its own group, so that timeouts and host signals reach
			// every process the command spawned.
			Setpgid:    true,
			Credential: credential(acct),
		},
	}
	var group *commandGroup
	if r.Groups != nil {
		if group, err = r.Groups.create(); err != nil {
			return nil, err
		}
		undo.Add(func() { r.Groups.discard(group) })
		attr.Sys.UseCgroupFD, attr.Sys.CgroupFD = true, group.fd
	}
	started := time.Now()
	pid, exited, err := r.Reaper.Start(path, argv, attr)
	if err != nil {
		return nil, err
	}
	// The child has its copies; the parent keeps only its own ends.
	inR.Close()
	outW.Close()
	errW.Close()
	undo.Release()
	return &process{pid: pid, exited: exited, started: started, stdin: inW, stdout: outR, stderr: errR, group: group}, nil
}

// credential switches the child to acct. An unprivileged parent (tests)
// can only run commands as itself and cannot call setgroups, so then the
// credentials are inherited as they are.
func credential(acct Account) *syscall.Credential {
	if os.Getuid() != 0 && int(acct.UID) == os.Getuid() && int(acct.GID) == os.Getgid() {
		return nil
	}
	return &syscall.Credential{Uid: acct.UID, Gid: acct.GID, Groups: acct.Groups}
}

// supervise pumps stdio, forwards signals and enforces the timeout until
// the main process exits.
func (r *Runner) supervise(ctx context.Context, p *process, timeout time.Duration, stdio vsockproto.ExecIO) vsockproto.ExitStatus {
	var output sync.WaitGroup
	output.Add(2)
	go func() { defer output.Done(); io.Copy(stdio.Stdout, p.stdout) }()
	go func() { defer output.Done(); io.Copy(stdio.Stderr, p.stderr) }()

	r.stdinPumps.Add(1)
	go func() {
		defer r.stdinPumps.Done()
		if stdio.Stdin != nil {
			io.Copy(p.stdin, stdio.Stdin)
		}
		p.stdin.Close()
	}()

	stopSignals := make(chan struct{})
	var signals sync.WaitGroup
	signals.Add(1)
	go func() {
		defer signals.Done()
		forwardSignals(p.pid, stdio.Signals, stopSignals)
	}()

	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	var limitCheck <-chan time.Time
	if p.group != nil {
		t := time.NewTicker(sweepInterval)
		defer t.Stop()
		limitCheck = t.C
	}
	var status vsockproto.ExitStatus
	var ws unix.WaitStatus
wait:
	for {
		select {
		case ws = <-p.exited:
			break wait
		case <-expired:
			status.TimedOut = true
			p.kill()
			ws = <-p.exited
			break wait
		case <-ctx.Done():
			// The host is gone: nobody will read the result, but nothing
			// the command started may outlive its stream either.
			p.kill()
			ws = <-p.exited
			break wait
		case <-limitCheck:
			if overLimit(p.group.dir) {
				status.ProcessLimit = r.Groups.maxProcesses
				p.kill()
				ws = <-p.exited
				break wait
			}
		}
	}
	status.Duration = time.Since(p.started)
	close(stopSignals)
	signals.Wait()

	r.drainOutput(&output, p)
	// A process that never read its stdin must not keep the pump blocked
	// in a pipe write.
	p.stdin.Close()
	if p.group != nil {
		r.Groups.release(p.group)
	}

	switch {
	case ws.Signaled():
		status.Code, status.Signal = -1, int(ws.Signal())
	default:
		status.Code = ws.ExitStatus()
	}
	return status
}

// drainOutput waits for the output copiers. Background children may hold
// the pipes open forever; after the grace period the reads are abandoned
// (those children then get EPIPE) so that the exit is reported.
func (r *Runner) drainOutput(output *sync.WaitGroup, p *process) {
	copied := make(chan struct{})
	go func() { output.Wait(); close(copied) }()
	grace := r.OutputGrace
	if grace <= 0 {
		grace = DefaultOutputGrace
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-copied:
	case <-t.C:
	}
	// Closing the pollable read ends unblocks the copiers' Reads.
	p.stdout.Close()
	p.stderr.Close()
	<-copied
}

// forwardSignals delivers host signals to the command's process group.
func forwardSignals(pgid int, signals <-chan int, stop <-chan struct{}) {
	for {
		select {
		case sig, ok := <-signals:
			if !ok {
				return
			}
			// Hostile input: only real signal numbers, never 0 (a probe)
			// or out-of-range values.
			if sig < 1 || sig > 64 {
				continue
			}
			if err := unix.Kill(-pgid, unix.Signal(sig)); err != nil && !errors.Is(err, unix.ESRCH) {
				fmt.Fprintf(os.Stderr, "worker: signal %d to group %d: %v\n", sig, pgid, err)
			}
		case <-stop:
			return
		}
	}
}

// processLimit describes RLIMIT_NPROC for a message, e.g. " (256)".
func processLimit() string {
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NPROC, &lim) != nil || lim.Cur == unix.RLIM_INFINITY {
		return ""
	}
	return fmt.Sprintf(" (%d)", lim.Cur)
}

// kill SIGKILLs every process of the command: its process group, and
// everything in its cgroup, where processes that left the group are too.
func (p *process) kill() {
	_ = unix.Kill(-p.pid, unix.SIGKILL) // ESRCH: already gone
	if p.group != nil {
		_ = killAll(p.group.dir)
	}
}
