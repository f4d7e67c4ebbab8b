// Package service is the guest side of the host's requests: it implements
// vsockproto.Handler on top of the worker (processes), netconf (network)
// and initd (power off).
package service

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

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

// defaultFileMode applies when a write request gives no mode.
const defaultFileMode = 0o644

// WriteFile creates or truncates req.Path, owned by req.User (default
// worker). The final path component is never followed if it is a symlink:
// guest code could otherwise point it at a system file and have the root
// init overwrite and chown it.
func (s *Service) WriteFile(ctx context.Context, req vsockproto.FileRequest, r io.Reader) error {
	path := s.resolve(req.Path)
	user := req.User
	if user == "" {
		user = worker.DefaultUser
	}
	acct, err := worker.LookupAccount(s.Runner.Root, user)
	if err != nil {
		return err
	}
	mode := os.FileMode(req.Mode).Perm()
	if req.Mode == 0 {
		mode = defaultFileMode
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, mode)
	if err != nil {
		return fmt.Errorf("write file: %w", err)
	}
	defer f.Close()
	// Through the descriptor, not the path: what was opened is what gets
	// chowned, even if the path changes meanwhile.
	if err := f.Chown(int(acct.UID), int(acct.GID)); err != nil {
		return fmt.Errorf("write file %s: %w", path, err)
	}
	if err := f.Chmod(mode); err != nil {
		return fmt.Errorf("write file %s: %w", path, err)
	}
	src := r
	if req.MaxBytes > 0 {
		src = io.LimitReader(r, req.MaxBytes+1)
	}
	n, err := io.Copy(f, src)
	if err != nil {
		return fmt.Errorf("write file %s: %w", path, err)
	}
	if req.MaxBytes > 0 && n > req.MaxBytes {
		return fmt.Errorf("write file %s: more than %d bytes", path, req.MaxBytes)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write file %s: %w", path, err)
	}
	return nil
}

// ReadFile copies a regular file to w, failing before sending anything
// when it is larger than req.MaxBytes. Devices and FIFOs are refused: a
// read of /dev/zero would never end.
func (s *Service) ReadFile(ctx context.Context, req vsockproto.FileRequest, w io.Writer) error {
	path := s.resolve(req.Path)
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("read file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("read file %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("read file %s: not a regular file (%s)", path, fi.Mode().Type())
	}
	if req.MaxBytes > 0 && fi.Size() > req.MaxBytes {
		return fmt.Errorf("read file %s: %d bytes exceed the limit of %d", path, fi.Size(), req.MaxBytes)
	}
	src := io.Reader(f)
	if req.MaxBytes > 0 {
		// The file may grow while it is read.
		src = io.LimitReader(f, req.MaxBytes)
	}
	if _, err := io.Copy(w, src); err != nil {
		return fmt.Errorf("read file %s: %w", path, err)
	}
	return nil
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
