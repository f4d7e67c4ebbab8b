package vmproc

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// leftoverExitTimeout bounds the wait for a killed leftover to disappear.
const leftoverExitTimeout = 10 * time.Second

// KillLeftover kills the VMM whose pid pidFile holds, if ours says its
// command line (argv) is the VMM the pid file was written for, and waits
// for it to exit. It is a no-op when there is no pid file or its process is
// gone. A pidfd pins the process between the check and the kill, so a
// process that reused the pid is never signalled.
func KillLeftover(pidFile string, ours func(argv []string) bool) error {
	b, err := os.ReadFile(pidFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("kill leftover: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return fmt.Errorf("kill leftover: pid file %s holds %.20q, not a pid", pidFile, b)
	}
	if err := killIfOurs(pid, ours); err != nil {
		return fmt.Errorf("kill leftover pid %d: %w", pid, err)
	}
	return nil
}

func killIfOurs(pid int, ours func(argv []string) bool) error {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return os.NewSyscallError("pidfd_open", err)
	}
	defer unix.Close(pidfd)
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !ours(Argv(cmdline)) {
		return nil
	}
	if err := unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return os.NewSyscallError("pidfd_send_signal", err)
	}
	// The leftover is not our child (its parent crashed): init reaps it,
	// and the pidfd turns readable once it has exited.
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, int(leftoverExitTimeout/time.Millisecond))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return os.NewSyscallError("poll pidfd", err)
		}
		if n == 0 {
			return fmt.Errorf("still running %v after SIGKILL", leftoverExitTimeout)
		}
		return nil
	}
}

// Argv splits a NUL-separated /proc/<pid>/cmdline.
func Argv(cmdline []byte) []string {
	return strings.Split(string(bytes.TrimRight(cmdline, "\x00")), "\x00")
}
