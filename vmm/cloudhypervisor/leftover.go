package cloudhypervisor

import (
	"fmt"
	"path/filepath"

	"github.com/ephemeralhq/ephemeral/vmm/internal/vmproc"
)

// KillLeftover kills the cloud-hypervisor that a crashed daemon left
// running for the VM directory dir, then removes the driver's files there.
// It is a no-op when there is no pid file or its process is gone, and it
// never signals a process that is not a VMM serving dir's API socket: the
// pid may have been reused since the pid file was written.
func KillLeftover(dir string) error {
	pidFile := filepath.Join(dir, pidFileName)
	apiSock := filepath.Join(dir, apiSocketName)
	if err := vmproc.KillLeftover(pidFile, func(argv []string) bool { return servesSocket(argv, apiSock) }); err != nil {
		return fmt.Errorf("cloud-hypervisor: %w", err)
	}
	m := machine{
		apiSock:   apiSock,
		vsockSock: filepath.Join(dir, vsockSocketName),
		pidFile:   pidFile,
	}
	if err := m.removeFiles(); err != nil {
		return fmt.Errorf("cloud-hypervisor: kill leftover: %w", err)
	}
	return nil
}

// servesSocket reports whether argv is a VMM launched by this driver with
// its API on apiSock.
func servesSocket(argv []string, apiSock string) bool {
	for i := 1; i+1 < len(argv); i++ {
		if argv[i] == "--api-socket" && argv[i+1] == "path="+apiSock {
			return true
		}
	}
	return false
}
