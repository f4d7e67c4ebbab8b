package netns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ephemeralhq/ephemeral/internal/flock"
	"github.com/ephemeralhq/ephemeral/internal/sandboxid"
)

// Reconcile removes the namespace of every sandbox whose owner process is
// gone (see ownerDir) and that live does not report as running, and
// returns their ids. It is meant for daemon start-up, after leftover VMM
// processes are killed: a namespace goes away once its bind mount is
// removed and no process holds its tap. Tap and table live inside the
// namespace and go with it. Entries in /run/netns that are not our prefix
// followed by a sandbox id (package sandboxid) are never touched. Calling
// it again removes nothing. It must not run concurrently with Create for an
// id that live reports as dead.
func Reconcile(ctx context.Context, live func(id string) bool) ([]string, error) {
	entries, err := os.ReadDir(runDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("netns: reconcile: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		id, ok := strings.CutPrefix(e.Name(), namePrefix)
		if !ok || sandboxid.Validate(id) != nil || live(id) {
			continue
		}
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		owner, err := lockOwner(id)
		if errors.Is(err, flock.ErrHeld) {
			continue // a live process owns it
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		err = removeNamed(filepath.Join(runDir, e.Name()))
		errs = append(errs, unlockOwner(owner))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, id)
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("netns: reconcile: %w", err)
	}
	return removed, nil
}
