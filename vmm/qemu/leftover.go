package qemu

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// leftoverExitTimeout bounds the wait for a killed leftover to disappear.
const leftoverExitTimeout = 10 * time.Second

// KillLeftover kills the QEMU that a crashed daemon left running for the
// VM directory dir, then removes the driver's files there. It is a no-op
// when there is no pid file or its process is gone, and it never signals a
// process that is not this driver's QEMU for dir: the pid may have been
// reused since the pid file was written.
func KillLeftover(dir string) error {
	pidFile := filepath.Join(dir, pidFileName)
	b, err := os.ReadFile(pidFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("qemu: kill leftover: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return fmt.Errorf("qemu: kill leftover: pid file %s holds %.20q, not a pid", pidFile, b)
	}
	if err := killIfOurs(pid, pidFile); err != nil {
		return fmt.Errorf("qemu: kill leftover pid %d: %w", pid, err)
	}
	m := machine{dir: dir}
	return m.removeFiles()
}

// killIfOurs kills pid if its command line shows it is the QEMU that
// writes pidFile, and waits for it to exit. A pidfd pins the process
// between the check and the kill, so a reused pid is never signalled.
func killIfOurs(pid int, pidFile string) error {
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
	if !launchedFor(cmdline, pidFile) {
		return nil
	}
	if err := unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return os.NewSyscallError("pidfd_send_signal", err)
	}
	// The leftover is not our child (its parent crashed): it is reaped by
	// init, and the pidfd turns readable when it has exited.
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

// launchedFor reports whether a NUL-separated /proc/<pid>/cmdline is a
// QEMU started by this driver with -pidfile pidFile.
func launchedFor(cmdline []byte, pidFile string) bool {
	argv := strings.Split(string(bytes.TrimRight(cmdline, "\x00")), "\x00")
	if len(argv) == 0 || !strings.Contains(filepath.Base(argv[0]), "qemu") {
		return false
	}
	for i := 1; i+1 < len(argv); i++ {
		if argv[i] == "-pidfile" && argv[i+1] == pidFile {
			return true
		}
	}
	return false
}
