package initd

import (
	"fmt"
	"os"
	"path/filepath"
)

// CreateScratch makes <base>/ephemeral-run-<name>/scratch owned by
// uid:gid, with the run directory private to that user, and returns the
// scratch path. The host picks name (vsockproto.Provision.ScratchName),
// fresh for every VM, also for clones of one snapshot.
func CreateScratch(base, name string, uid, gid int) (string, error) {
	if name == "" || filepath.Base(name) != name {
		return "", fmt.Errorf("initd: scratch dir: name %q is not a plain file name", name)
	}
	run := filepath.Join(base, "ephemeral-run-"+name)
	scratch := filepath.Join(run, "scratch")
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{run, 0o700}, {scratch, 0o755}} {
		if err := os.Mkdir(d.path, d.mode); err != nil {
			return "", fmt.Errorf("initd: scratch dir: %w", err)
		}
		// Mkdir applies the umask; the mode is part of the contract.
		if err := os.Chmod(d.path, d.mode); err != nil {
			return "", fmt.Errorf("initd: scratch dir: %w", err)
		}
		if err := os.Chown(d.path, uid, gid); err != nil {
			return "", fmt.Errorf("initd: scratch dir: %w", err)
		}
	}
	return scratch, nil
}
