// Package flock takes flock(2) locks on lock files. The kernel drops such a
// lock when the last descriptor of its open file is closed, also when the
// holding process dies however it dies: that is what the callers build on
// to tell a crashed owner's leftovers from a live owner's state.
//
// Locks belong to an open file, not to a process: two Lock calls for the
// same path conflict even within one process.
package flock

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Mode is how a lock is shared.
type Mode int

const (
	// Shared locks coexist with each other but not with Exclusive.
	Shared Mode = unix.LOCK_SH
	// Exclusive locks exclude every other lock.
	Exclusive Mode = unix.LOCK_EX
)

// ErrHeld is wrapped by TryLock's error when another open file, in this or
// another process, holds a conflicting lock.
var ErrHeld = errors.New("held by another process")

// Lock opens path, creating it (mode 0600) if needed, and waits until it
// holds a lock of mode on it. Closing the returned file releases the lock.
func Lock(path string, mode Mode) (*os.File, error) {
	return lock(path, int(mode))
}

// TryLock is Lock without the wait: when the lock is held elsewhere it
// fails at once with an error wrapping ErrHeld.
func TryLock(path string, mode Mode) (*os.File, error) {
	return lock(path, int(mode)|unix.LOCK_NB)
}

func lock(path string, how int) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err == nil {
		return f, nil
	}
	f.Close()
	if errors.Is(err, unix.EWOULDBLOCK) {
		return nil, fmt.Errorf("lock %s: %w", path, ErrHeld)
	}
	return nil, fmt.Errorf("lock %s: %w", path, os.NewSyscallError("flock", err))
}
