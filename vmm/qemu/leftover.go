package qemu

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/ephemeralhq/ephemeral/vmm/internal/vmproc"
)

// KillLeftover kills the QEMU that a crashed daemon left running for the
// VM directory dir, then removes the driver's files there. It is a no-op
// when there is no pid file or its process is gone, and it never signals a
// process that is not this driver's QEMU for dir: the pid may have been
// reused since the pid file was written.
func KillLeftover(dir string) error {
	pidFile := filepath.Join(dir, pidFileName)
	if err := vmproc.KillLeftover(pidFile, func(argv []string) bool { return launchedFor(argv, pidFile) }); err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	m := machine{dir: dir}
	return m.removeFiles()
}

// launchedFor reports whether argv is a QEMU started by this driver with
// -pidfile pidFile.
func launchedFor(argv []string, pidFile string) bool {
	if len(argv) == 0 || !strings.Contains(filepath.Base(argv[0]), "qemu") {
		return false
	}
	for i := 1; i+1 < len(argv); i++ {
		if argv[i] == "-pidfile" && argv[i+1] == pidFile {
			return true
		}
	}
	return false
}
