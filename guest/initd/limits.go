package initd

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/ephemeralhq/ephemeral/guest/limits"
)

// ReadLimits reads the limits the host chose from the kernel command line;
// /proc must be mounted.
func ReadLimits() (limits.Limits, error) {
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return limits.Limits{}, fmt.Errorf("initd: read limits: %w", err)
	}
	l, err := limits.Parse(string(cmdline))
	if err != nil {
		return limits.Limits{}, fmt.Errorf("initd: %w", err)
	}
	return l, nil
}

// RootMountSizes are the sizes, in MiB, of RootMounts' tmpfs under l.
func RootMountSizes(l limits.Limits) map[string]int {
	return map[string]int{"/tmp": l.TmpMiB, "/dev/shm": limits.ShmMiB, "/run": limits.RunMiB}
}

// WithSizes returns a copy of mounts in which each tmpfs whose target
// sizesMiB names is capped at that size. A tmpfs without a size may grow
// to half the guest's RAM, and several of them to more than all of it.
func WithSizes(mounts []Mount, sizesMiB map[string]int) []Mount {
	out := make([]Mount, len(mounts))
	for i, m := range mounts {
		if size, ok := sizesMiB[m.Target]; ok && m.FSType == "tmpfs" {
			m.Data = joinOptions(m.Data, "size="+strconv.Itoa(size)+"m")
		}
		out[i] = m
	}
	return out
}

// ScratchMount is the scratch directory's own tmpfs of sizeMiB, its root
// owned by uid:gid like the directory it covers, so that commands get
// ENOSPC at their limit whatever the rest of /tmp holds.
func ScratchMount(dir string, sizeMiB, uid, gid int) Mount {
	return Mount{
		Source: "scratch", Target: dir, FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV,
		Data: fmt.Sprintf("size=%dm,mode=0755,uid=%d,gid=%d", sizeMiB, uid, gid),
	}
}

// LimitUserProcesses sets the init's RLIMIT_NPROC, which every command
// inherits: each unprivileged user may then have at most n processes and
// threads at once, counted across all of its commands. Root is exempt, so
// the init itself can always fork, also while a fork bomb holds the limit.
func LimitUserProcesses(n int) error {
	lim := unix.Rlimit{Cur: uint64(n), Max: uint64(n)}
	if err := unix.Setrlimit(unix.RLIMIT_NPROC, &lim); err != nil {
		return fmt.Errorf("initd: limit processes to %d: %w", n, os.NewSyscallError("setrlimit", err))
	}
	return nil
}

func joinOptions(a, b string) string {
	if a == "" {
		return b
	}
	return a + "," + b
}
