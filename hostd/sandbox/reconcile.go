package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/ephemeralhq/ephemeral/vmm/qemu"
)

// Reconcile removes what dead processes left behind in the state directory:
// for every sandbox directory whose lock nobody holds (its owner died, for
// example by SIGKILL), it kills the VMM if it still runs and removes the
// directory. Sandboxes of live processes, this one included, are untouched.
// Running it twice is harmless. It returns the ids it swept.
func (m *Manager) Reconcile(ctx context.Context) ([]string, error) {
	all, err := m.lockAll(syscall.LOCK_EX)
	if err != nil {
		return nil, err
	}
	defer all.Close()
	entries, err := os.ReadDir(m.dir)
	if err != nil {
		return nil, fmt.Errorf("sandbox: reconcile: %w", err)
	}
	var swept []string
	var errs []error
	for _, e := range entries {
		if ctx.Err() != nil {
			return swept, ctx.Err()
		}
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(m.dir, e.Name())
		lock, err := lockDir(dir)
		if errors.Is(err, syscall.EWOULDBLOCK) {
			continue // a live process owns it
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := m.killer(filepath.Join(dir, "vm")); err != nil {
			errs = append(errs, fmt.Errorf("sandbox %s: kill leftover VMM: %w", e.Name(), err))
			lock.Close()
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("sandbox %s: remove: %w", e.Name(), err))
		} else {
			swept = append(swept, e.Name())
			m.logf("sandbox: reconciled leftover %s", e.Name())
		}
		lock.Close()
	}
	return swept, errors.Join(errs...)
}

func killLeftoverVMM(vmDir string) error { return qemu.KillLeftover(vmDir) }
