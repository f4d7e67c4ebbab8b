package worker

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Reaper is the only caller of wait(2) in the process. As PID 1 the init
// inherits every orphan and must reap them, but a wait4(-1) loop would also
// steal the exit status of the processes it started itself; so all
// children are started through Start, and the reaper hands each status to
// whoever registered that pid and discards the rest.
type Reaper struct {
	// mu is held across fork and registration: a child that exits at once
	// is reaped only after its pid is registered, because dispatch takes
	// mu too.
	mu      sync.Mutex
	waiters map[int]chan<- unix.WaitStatus
	sigchld chan os.Signal
	stop    chan struct{}
	done    chan struct{}
}

// NewReaper starts the reaping goroutine; Close stops it.
func NewReaper() *Reaper {
	r := &Reaper{
		waiters: map[int]chan<- unix.WaitStatus{},
		sigchld: make(chan os.Signal, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	signal.Notify(r.sigchld, unix.SIGCHLD)
	go r.loop()
	return r
}

// Start forks and execs argv0 and returns its pid and a channel that
// receives its exit status exactly once.
func (r *Reaper) Start(argv0 string, argv []string, attr *syscall.ProcAttr) (int, <-chan unix.WaitStatus, error) {
	ch := make(chan unix.WaitStatus, 1)
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := syscall.ForkExec(argv0, argv, attr)
	if err != nil {
		return 0, nil, fmt.Errorf("worker: start %s: %w", argv0, err)
	}
	r.waiters[pid] = ch
	return pid, ch, nil
}

// Close stops the reaping goroutine and waits for it. Children still
// running are no longer reaped.
func (r *Reaper) Close() {
	signal.Stop(r.sigchld)
	close(r.stop)
	<-r.done
}

func (r *Reaper) loop() {
	defer close(r.done)
	for {
		r.reapAll()
		// SIGCHLD coalesces, but one pending notification is enough:
		// reapAll collects every exited child, not just one.
		select {
		case <-r.sigchld:
		case <-r.stop:
			return
		}
	}
}

// reapAll collects every child that has exited, without blocking.
func (r *Reaper) reapAll() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return // ECHILD (no children) or none exited yet
		}
		r.mu.Lock()
		ch, ok := r.waiters[pid]
		delete(r.waiters, pid)
		r.mu.Unlock()
		if ok {
			ch <- ws
		}
	}
}
