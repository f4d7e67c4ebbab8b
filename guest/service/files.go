package service

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/ephemeralhq/ephemeral/guest/worker"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// defaultFileMode applies when a write request gives no mode.
const defaultFileMode = 0o644

// WriteFile creates or truncates req.Path as req.User (default worker).
// The whole write runs with that user's filesystem identity, so the kernel
// checks every path component with the user's permissions: guest code that
// plants a symlink (scratch/out -> /etc) cannot make the root init write
// where the user could not. The final component is never followed at all.
func (s *Service) WriteFile(ctx context.Context, req vsockproto.FileRequest, r io.Reader) error {
	if err := s.ready(); err != nil {
		return err
	}
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
	return withFilesystemIDs(acct.UID, acct.GID, func() error {
		return writeFile(path, mode, req.MaxBytes, r)
	})
}

func writeFile(path string, mode os.FileMode, maxBytes int64, r io.Reader) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, mode)
	if err != nil {
		return fmt.Errorf("write file: %w", err)
	}
	defer f.Close()
	// The umask narrowed the mode at creation, and an existing file kept
	// its old one; the request's mode is the contract.
	if err := f.Chmod(mode); err != nil {
		return fmt.Errorf("write file %s: %w", path, err)
	}
	src := r
	if maxBytes > 0 {
		src = io.LimitReader(r, maxBytes+1)
	}
	n, err := io.Copy(f, src)
	if err != nil {
		return fmt.Errorf("write file %s: %w", path, err)
	}
	if maxBytes > 0 && n > maxBytes {
		return fmt.Errorf("write file %s: more than %d bytes", path, maxBytes)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write file %s: %w", path, err)
	}
	return nil
}

// withFilesystemIDs runs f on a thread whose filesystem uid and gid are
// uid and gid. setfsuid(2) is per thread, so the goroutine is locked to
// its thread; if the ids cannot be restored the thread stays locked and
// the runtime discards it when the goroutine ends.
func withFilesystemIDs(uid, gid uint32, f func() error) error {
	runtime.LockOSThread()
	// setfsuid reports the previous id, never an error; asking with -1
	// (an invalid id) reads the current one back.
	prevGID, _ := unix.SetfsgidRetGid(int(gid))
	prevUID, _ := unix.SetfsuidRetUid(int(uid))
	curUID, _ := unix.SetfsuidRetUid(-1)
	curGID, _ := unix.SetfsgidRetGid(-1)
	var err error
	if curUID != int(uid) || curGID != int(gid) {
		err = fmt.Errorf("switch to uid %d gid %d: %w", uid, gid, unix.EPERM)
	} else {
		err = f()
	}
	unix.SetfsuidRetUid(prevUID)
	unix.SetfsgidRetGid(prevGID)
	if u, _ := unix.SetfsuidRetUid(-1); u == prevUID {
		if g, _ := unix.SetfsgidRetGid(-1); g == prevGID {
			runtime.UnlockOSThread()
		}
	}
	return err
}

// ReadFile copies a regular file to w, failing before sending anything
// when it is larger than req.MaxBytes. Devices and FIFOs are refused: a
// read of /dev/zero would never end.
func (s *Service) ReadFile(ctx context.Context, req vsockproto.FileRequest, w io.Writer) error {
	if err := s.ready(); err != nil {
		return err
	}
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
