package cloudhypervisor

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

// KillLeftover kills the cloud-hypervisor that a crashed daemon left
// running for the VM directory dir, then removes the driver's files there.
// It is a no-op when there is no pid file or its process is gone, and it
// never signals a process that is not a VMM serving dir's API socket: the
// pid may have been reused since the pid file was written.
func KillLeftover(dir string) error {
	pidFile := filepath.Join(dir, pidFileName)
	b, err := os.ReadFile(pidFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cloud-hypervisor: kill leftover: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return fmt.Errorf("cloud-hypervisor: kill leftover: pid file %s holds %.20q, not a pid", pidFile, b)
	}
	if err := killIfOurs(pid, filepath.Join(dir, apiSocketName)); err != nil {
		return fmt.Errorf("cloud-hypervisor: kill leftover pid %d: %w", pid, err)
	}
	m := machine{
		apiSock:   filepath.Join(dir, apiSocketName),
		vsockSock: filepath.Join(dir, vsockSocketName),
		pidFile:   pidFile,
	}
	if err := m.removeFiles(); err != nil {
		return fmt.Errorf("cloud-hypervisor: kill leftover: %w", err)
	}
	return nil
}

// killIfOurs kills pid if its command line shows it serves apiSock, and
// waits for it to exit. A pidfd pins the process between the check and the
// kill, so a reused pid is never signalled.
func killIfOurs(pid int, apiSock string) error {
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
	if !servesSocket(cmdline, apiSock) {
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

// servesSocket reports whether a NUL-separated /proc/<pid>/cmdline is a
// VMM launched by this driver with its API on apiSock.
func servesSocket(cmdline []byte, apiSock string) bool {
	argv := strings.Split(string(bytes.TrimRight(cmdline, "\x00")), "\x00")
	for i := 1; i+1 < len(argv); i++ {
		if argv[i] == "--api-socket" && argv[i+1] == "path="+apiSock {
			return true
		}
	}
	return false
}
