package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ephemeralhq/ephemeral/internal/flock"
)

// ownerDir holds a lock file per namespace, flocked by the process whose
// Network owns it. The kernel drops the lock when that process dies, however
// it dies, so Reconcile in any process can tell a crashed owner's namespace
// from a live one without knowing who created it.
const ownerDir = "/run/ephemeral/netns"

// lockOwner takes the ownership lock of id without waiting: while another
// Network holds it, the error wraps flock.ErrHeld. Closing the file
// releases the lock.
func lockOwner(id string) (*os.File, error) {
	if err := os.MkdirAll(ownerDir, 0o700); err != nil {
		return nil, fmt.Errorf("netns: owner lock dir: %w", err)
	}
	f, err := flock.TryLock(filepath.Join(ownerDir, id+".lock"), flock.Exclusive)
	if err != nil {
		return nil, fmt.Errorf("netns: owner of %s: %w", id, err)
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
