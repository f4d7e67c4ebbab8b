package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ephemeralhq/ephemeral/internal/flock"
	"github.com/ephemeralhq/ephemeral/internal/sandboxid"
	"github.com/ephemeralhq/ephemeral/netns"
	"github.com/ephemeralhq/ephemeral/vmm/cloudhypervisor"
	"github.com/ephemeralhq/ephemeral/vmm/qemu"
)

// Reconcile removes what dead processes left behind: in the state directory,
// for every sandbox directory whose lock nobody holds (its owner died, for
// example by SIGKILL), it kills the VMM if it still runs and removes the
// directory; then every network namespace and VMM cgroup of ours whose
// owner is gone.
// Sandboxes of live processes, this one included, are untouched, and so is
// anything not named by a sandbox id: it is not a Manager's.
// Running it twice is harmless. It returns the ids it swept.
func (m *Manager) Reconcile(ctx context.Context) ([]string, error) {
	all, err := m.lockAll(flock.Exclusive)
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
		if !e.IsDir() || sandboxid.Validate(e.Name()) != nil {
			continue
		}
		dir := filepath.Join(m.dir, e.Name())
		lock, err := lockDir(dir)
		if errors.Is(err, flock.ErrHeld) {
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
	// Namespaces go after the VMMs holding their taps. Those of live
	// sandboxes, in this or any other process, are protected by their
	// owners' locks, and this manager's own by isLive as well, also while
	// Create builds one.
	namespaces, err := netns.Reconcile(ctx, m.isLive)
	for _, id := range namespaces {
		m.logf("sandbox: reconciled leftover network namespace of %s", id)
	}
	errs = append(errs, err, m.reconcileCgroups(ctx))
	return swept, errors.Join(errs...)
}

// killLeftoverVMM kills whichever VMM a dead process left for vmDir; each
// driver recognises only its own.
func killLeftoverVMM(vmDir string) error {
	return errors.Join(qemu.KillLeftover(vmDir), cloudhypervisor.KillLeftover(vmDir))
}
