package netns

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

const (
	// runDir is where iproute2 keeps named namespaces; leftovers there are
	// visible to `ip netns list` and to Reconcile after a crash.
	runDir = "/run/netns"
	// namePrefix marks the namespaces this package owns.
	namePrefix = "eph-"
)

var runDirOnce struct {
	sync.Mutex
	done bool
}

// prepareRunDir makes runDir a shared mount point, as iproute2 does. Without
// it a mount namespace created later (a systemd service with PrivateTmp)
// would copy our bind mounts and keep the namespaces alive after we unmount
// them; with shared propagation the unmount reaches those copies too.
func prepareRunDir() error {
	runDirOnce.Lock()
	defer runDirOnce.Unlock()
	if runDirOnce.done {
		return nil
	}
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return fmt.Errorf("netns: create %s: %w", runDir, err)
	}
	err := unix.Mount("", runDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) {
		// Not a mount point yet: make it one, then share it.
		if err := unix.Mount(runDir, runDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("netns: bind %s onto itself: %w", runDir, os.NewSyscallError("mount", err))
		}
		err = unix.Mount("", runDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("netns: make %s shared: %w", runDir, os.NewSyscallError("mount", err))
	}
	runDirOnce.done = true
	return nil
}

// createNamed creates a new network namespace and bind-mounts it on path,
// which must not exist.
func createNamed(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return fmt.Errorf("netns: create mount point: %w", err)
	}
	if err := f.Close(); err != nil {
		return errors.Join(fmt.Errorf("netns: create mount point: %w", err), os.Remove(path))
	}
	err = onLockedThread(
		func() error { return os.NewSyscallError("unshare", unix.Unshare(unix.CLONE_NEWNET)) },
		func() error {
			return os.NewSyscallError("mount", unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, ""))
		},
	)
	if err != nil {
		return errors.Join(fmt.Errorf("netns: create %s: %w", path, err), os.Remove(path))
	}
	return nil
}

// removeNamed detaches the bind mount on path and removes the mount point.
// A path that is missing or no longer mounted (a crash between the two
// steps of createNamed) is not an error, so removal can be repeated.
func removeNamed(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("netns: unmount %s: %w", path, os.NewSyscallError("umount2", err))
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("netns: remove %s: %w", path, err)
	}
	return nil
}

// runIn runs fn on an OS thread that has joined the network namespace ns.
// Sockets fn creates belong to that namespace for their whole life.
func runIn(ns *os.File, fn func() error) error {
	return onLockedThread(func() error {
		return os.NewSyscallError("setns", unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET))
	}, fn)
}

// onLockedThread runs enter and then fn on a dedicated, locked OS thread,
// then returns the thread to the process's network namespace. If that
// fails the thread stays locked, and the runtime ends it with the
// goroutine, so no other goroutine ever runs in a foreign namespace.
func onLockedThread(enter, fn func() error) error {
	errc := make(chan error, 1)
	go func() { errc <- lockedThreadBody(enter, fn) }()
	return <-errc
}

func lockedThreadBody(enter, fn func() error) error {
	runtime.LockOSThread()
	own, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open own network namespace: %w", err)
	}
	defer own.Close()
	err = enter()
	if err == nil {
		err = fn()
	}
	if rerr := unix.Setns(int(own.Fd()), unix.CLONE_NEWNET); rerr != nil {
		return errors.Join(err, fmt.Errorf("restore network namespace: %w", os.NewSyscallError("setns", rerr)))
	}
	runtime.UnlockOSThread()
	return err
}

// disableIPv6 turns IPv6 off for every present and future interface of the
// calling thread's network namespace (/proc/sys/net follows the thread).
func disableIPv6() error {
	for _, p := range []string{
		"/proc/sys/net/ipv6/conf/all/disable_ipv6",
		"/proc/sys/net/ipv6/conf/default/disable_ipv6",
	} {
		if err := os.WriteFile(p, []byte("1\n"), 0); err != nil {
			return fmt.Errorf("disable ipv6: %w", err)
		}
	}
	return nil
}
