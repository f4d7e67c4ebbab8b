package vmproc

import (
	"errors"
	"math"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// closeOnExecAll marks every descriptor of this process above stderr
// close-on-exec, so that a VMM inherits only what its exec.Cmd hands it:
// its stdio and ExtraFiles, which the child gets as fresh copies whatever
// their flags here. Go opens its own files close-on-exec, SQLite's
// included; what is not comes from elsewhere, such as descriptors the
// daemon inherited from whatever started it (a shell, a supervisor).
func closeOnExecAll() error {
	err := unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
	if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EINVAL) {
		if err != nil {
			return os.NewSyscallError("close_range", err)
		}
		return nil
	}
	// Before Linux 5.11: one descriptor at a time.
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < 3 {
			continue
		}
		// EBADF: the descriptor ReadDir read through, closed since.
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil && !errors.Is(err, unix.EBADF) {
			return os.NewSyscallError("fcntl", err)
		}
	}
	return nil
}
