// Package service is the guest side of the host's requests: it implements
// vsockproto.Handler on top of the worker (processes), netconf (network)
// and initd (power off).
package service

import (
	"context"
	"path/filepath"

	"github.com/ephemeralhq/ephemeral/guest/netconf"
	"github.com/ephemeralhq/ephemeral/guest/worker"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// Service answers host requests.
type Service struct {
	Runner *worker.Runner
	// PowerOff ends the VM; it is initd.PowerOff in the guest.
	PowerOff func() error
	// Logf reports failures nobody else will see (a failed power off).
	Logf func(format string, args ...any)
}

var _ vsockproto.Handler = (*Service)(nil)

// Exec runs a command through the worker.
func (s *Service) Exec(ctx context.Context, req vsockproto.ExecRequest, stdio vsockproto.ExecIO) (vsockproto.ExitStatus, error) {
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
