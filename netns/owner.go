package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// ownerDir holds a lock file per namespace, flocked by the process whose
// Network owns it. The kernel drops the lock when that process dies, however
// it dies, so Reconcile in any process can tell a crashed owner's namespace
// from a live one without knowing who created it.
const ownerDir = "/run/ephemeral/netns"

// lockOwner takes the ownership lock of id; closing the file releases it.
func lockOwner(id string) (*os.File, error) {
	if err := os.MkdirAll(ownerDir, 0o700); err != nil {
		return nil, fmt.Errorf("netns: owner lock dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(ownerDir, id+".lock"), os.O_CREATE|os.O_RDWR|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("netns: owner lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("netns: owner lock %s: %w", id, os.NewSyscallError("flock", err))
	}
	return f, nil
}

// unlockOwner removes the lock file while still holding the lock, so no
// other process can be holding a lock on a file that is about to vanish.
func unlockOwner(f *os.File) error {
	err := os.Remove(f.Name())
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	return errors.Join(err, f.Close())
}
