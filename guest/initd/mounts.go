// Package initd holds the boot steps of the guest init: mounting the
// kernel filesystems, loading modules, building the overlay root and
// switching into it, and preparing the worker's scratch directory. The
// steps are described as data (mount tables, link tables) where possible.
package initd

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Mount is one mount(2) call.
type Mount struct {
	Source string
	Target string
	FSType string
	Flags  uintptr
	Data   string
}

// EarlyMounts are made in the initramfs, before modules load: the kernel
// filesystems the boot steps need. They are moved into the new root later.
var EarlyMounts = []Mount{
	{Source: "proc", Target: "/proc", FSType: "proc", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
	{Source: "sysfs", Target: "/sys", FSType: "sysfs", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
	{Source: "devtmpfs", Target: "/dev", FSType: "devtmpfs", Flags: unix.MS_NOSUID, Data: "mode=0755"},
}

// movedMounts are carried from the initramfs into the new root.
var movedMounts = []string{"/dev", "/proc", "/sys"}

// RootMounts complete the new root after the switch. /tmp and /run are
// tmpfs of their own rather than overlay upper dirs, so that the scratch
// directory lives on a plain filesystem. WithSizes caps the tmpfs.
var RootMounts = []Mount{
	{Source: "devpts", Target: "/dev/pts", FSType: "devpts", Flags: unix.MS_NOSUID | unix.MS_NOEXEC, Data: "gid=5,mode=0620,ptmxmode=0666"},
	{Source: "shm", Target: "/dev/shm", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=1777"},
	{Source: "tmpfs", Target: "/tmp", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=1777"},
	{Source: "tmpfs", Target: "/run", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=0755"},
	{Source: "cgroup2", Target: CgroupRoot, FSType: "cgroup2", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
}

// CgroupRoot is where the cgroup v2 hierarchy is mounted: the worker puts
// each command in a group of its own below it.
const CgroupRoot = "/sys/fs/cgroup"

// DevLinks are the /dev symlinks devtmpfs does not create but shells rely
// on (process substitution uses /dev/fd).
var DevLinks = map[string]string{
	"/dev/fd":     "/proc/self/fd",
	"/dev/stdin":  "/proc/self/fd/0",
	"/dev/stdout": "/proc/self/fd/1",
	"/dev/stderr": "/proc/self/fd/2",
}

// MountAll mounts each entry in order, creating its target directory.
func MountAll(mounts []Mount) error {
	for _, m := range mounts {
		if err := os.MkdirAll(m.Target, 0o755); err != nil {
			return fmt.Errorf("initd: mount %s: %w", m.Target, err)
		}
		if err := unix.Mount(m.Source, m.Target, m.FSType, m.Flags, m.Data); err != nil {
			return fmt.Errorf("initd: mount %s on %s: %w", m.FSType, m.Target, os.NewSyscallError("mount", err))
		}
	}
	return nil
}

// MakeDevLinks creates DevLinks, replacing what devtmpfs put there.
func MakeDevLinks() error {
	for link, target := range DevLinks {
		if err := os.Remove(link); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("initd: dev link %s: %w", link, err)
		}
		if err := os.Symlink(target, link); err != nil {
			return fmt.Errorf("initd: dev link %s: %w", link, err)
		}
	}
	return nil
}
