// Package service is the guest side of the host's requests: it implements
// vsockproto.Handler on top of the worker (processes), netconf (network),
// provision (entropy, clock, names) and initd (scratch directory, power
// off).
package service

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"

	"github.com/ephemeralhq/ephemeral/guest/initd"
	"github.com/ephemeralhq/ephemeral/guest/netconf"
	"github.com/ephemeralhq/ephemeral/guest/worker"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// Service answers host requests. Until the host's Provision has been
// applied it runs nothing for the user and touches no file: a guest
// restored from a snapshot is not yet unique before that.
type Service struct {
	// Runner runs the user's processes; Provision sets its ScratchDir.
	Runner *worker.Runner
	// Identity applies a Provision's entropy, clock and names; it is
	// provision.Apply in the guest.
	Identity func(vsockproto.Provision) error
	// ScratchBase is the directory Provision makes the worker's scratch
	// directory in (/tmp in the guest).
	ScratchBase string
	// ScratchMiB, when positive, sizes the scratch directory: Provision
	// mounts a tmpfs of its own there, so that commands get ENOSPC at that
	// limit whatever the rest of /tmp holds. Mounting needs root: tests
	// on a host leave it zero.
	ScratchMiB int
	// PowerOff ends the VM; it is initd.PowerOff in the guest.
	PowerOff func() error
	// Logf reports failures nobody else will see (a failed power off).
	Logf func(format string, args ...any)

	mu          sync.Mutex
	provisioned bool
}

var _ vsockproto.Handler = (*Service)(nil)

// errNotProvisioned refuses user operations that come before Provision.
var errNotProvisioned = errors.New("the guest is not provisioned yet: the host must send provision first")

// ready reports whether Provision has completed. Taking the lock orders the
// Runner's ScratchDir, set by Provision, before any use.
func (s *Service) ready() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.provisioned {
		return errNotProvisioned
	}
	return nil
}

// Provision applies p once: the entropy, clock and names, then the
// worker's scratch directory named by p, sized by ScratchMiB.
func (s *Service) Provision(ctx context.Context, p vsockproto.Provision) (vsockproto.Provisioned, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.provisioned {
		return vsockproto.Provisioned{}, errors.New("provision: already provisioned")
	}
	if err := p.Validate(); err != nil {
		return vsockproto.Provisioned{}, err
	}
	if err := s.Identity(p); err != nil {
		return vsockproto.Provisioned{}, err
	}
	acct, err := worker.LookupAccount(s.Runner.Root, worker.DefaultUser)
	if err != nil {
		return vsockproto.Provisioned{}, fmt.Errorf("provision: %w", err)
	}
	scratch, err := initd.CreateScratch(s.ScratchBase, p.ScratchName, int(acct.UID), int(acct.GID))
	if err != nil {
		return vsockproto.Provisioned{}, fmt.Errorf("provision: %w", err)
	}
	if s.ScratchMiB > 0 {
		// Mounted here rather than at boot: the directory's name is the
		// host's, fresh for each guest restored from one snapshot.
		if err := initd.MountAll([]initd.Mount{initd.ScratchMount(scratch, s.ScratchMiB, int(acct.UID), int(acct.GID))}); err != nil {
			return vsockproto.Provisioned{}, fmt.Errorf("provision: %w", err)
		}
	}
	s.Runner.ScratchDir = scratch
	s.provisioned = true
	return vsockproto.Provisioned{ScratchDir: scratch}, nil
}

// Exec runs a command through the worker.
func (s *Service) Exec(ctx context.Context, req vsockproto.ExecRequest, stdio vsockproto.ExecIO) (vsockproto.ExitStatus, error) {
	if err := s.ready(); err != nil {
		return vsockproto.ExitStatus{}, err
	}
	return s.Runner.Run(ctx, req, stdio)
}

// resolve makes relative paths relative to the scratch directory, where
// the commands run.
func (s *Service) resolve(path string) string {
	if filepath.IsAbs(path) {
		return filepath.Clean(path)
	}
	return filepath.Join(s.Runner.ScratchDir, path)
}

// ConfigureNetwork applies the host's network plan.
func (s *Service) ConfigureNetwork(ctx context.Context, cfg vsockproto.NetConfig) error {
	plan, err := netconf.ParseConfig(cfg)
	if err != nil {
		return err
	}
	return netconf.Apply(plan)
}

// Shutdown powers the VM off; it returns only if that failed.
func (s *Service) Shutdown(ctx context.Context) {
	if err := s.PowerOff(); err != nil {
		s.Logf("shutdown: %v", err)
	}
}
