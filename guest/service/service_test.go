package service

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/guest/worker"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// newService returns a Service whose "worker" account is the test's own
// user, so that file ownership can be set without privileges.
func newService(t *testing.T) *Service {
	t.Helper()
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	passwd := fmt.Sprintf("worker:x:%d:%d::/home/worker:/bin/bash\n", os.Getuid(), os.Getgid())
	if err := os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "group"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s := &Service{Runner: &worker.Runner{Root: root}, Identity: func(vsockproto.Provision) error { return nil }, ScratchBase: t.TempDir()}
	if _, err := s.Provision(context.Background(), testProvision("Test01")); err != nil {
		t.Fatal(err)
	}
	return s
}

func testProvision(scratchName string) vsockproto.Provision {
	return vsockproto.Provision{
		Entropy:     bytes.Repeat([]byte{1}, vsockproto.MinProvisionEntropy),
		Time:        time.Now(),
		Hostname:    "ephemeral-test",
		MachineID:   "0123456789abcdef0123456789abcdef",
		ScratchName: scratchName,
	}
}

// A guest serves nothing of the user's before it is provisioned, applies a
// provision once, and makes the scratch directory the provision names.
func TestProvisionGatesUserOperations(t *testing.T) {
	s := newService(t)
	s.provisioned = false
	ctx := context.Background()
	if _, err := s.Exec(ctx, vsockproto.ExecRequest{Argv: []string{"true"}}, vsockproto.ExecIO{}); err == nil || !strings.Contains(err.Error(), "not provisioned") {
		t.Errorf("Exec before provision = %v, want refused", err)
	}
	if err := s.WriteFile(ctx, vsockproto.FileRequest{Path: "/tmp/x"}, strings.NewReader("x")); err == nil || !strings.Contains(err.Error(), "not provisioned") {
		t.Errorf("WriteFile before provision = %v, want refused", err)
	}
	if err := s.ReadFile(ctx, vsockproto.FileRequest{Path: "/etc/passwd"}, new(bytes.Buffer)); err == nil || !strings.Contains(err.Error(), "not provisioned") {
		t.Errorf("ReadFile before provision = %v, want refused", err)
	}

	var applied []vsockproto.Provision
	s.Identity = func(p vsockproto.Provision) error { applied = append(applied, p); return nil }
	done, err := s.Provision(ctx, testProvision("Fresh1"))
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(s.ScratchBase, "ephemeral-run-Fresh1", "scratch"); done.ScratchDir != want || s.Runner.ScratchDir != want {
		t.Errorf("scratch dir = %q (runner %q), want %q", done.ScratchDir, s.Runner.ScratchDir, want)
	}
	if fi, err := os.Stat(done.ScratchDir); err != nil || !fi.IsDir() {
		t.Errorf("scratch dir not made: %v", err)
	}
	if len(applied) != 1 || applied[0].Hostname != "ephemeral-test" {
		t.Errorf("identity applied %+v, want the provision once", applied)
	}
	if err := s.WriteFile(ctx, vsockproto.FileRequest{Path: "ok"}, strings.NewReader("x")); err != nil {
		t.Errorf("WriteFile after provision: %v", err)
	}
	if _, err := s.Provision(ctx, testProvision("Again1")); err == nil {
		t.Error("a second provision was applied")
	}
}

func TestProvisionFailureLeavesGuestUnprovisioned(t *testing.T) {
	s := newService(t)
	s.provisioned = false
	s.Identity = func(vsockproto.Provision) error { return errors.New("reseed refused") }
	if _, err := s.Provision(context.Background(), testProvision("Fail01")); err == nil {
		t.Fatal("Provision succeeded though the identity failed")
	}
	if _, err := os.Stat(filepath.Join(s.ScratchBase, "ephemeral-run-Fail01")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("scratch dir made despite the failure: %v", err)
	}
	if err := s.ready(); err == nil {
		t.Error("the guest counts as provisioned after a failed provision")
	}
}

func TestWriteThenReadFile(t *testing.T) {
	s := newService(t)
	ctx := context.Background()
	if err := s.WriteFile(ctx, vsockproto.FileRequest{Path: "data.txt", Mode: 0o600}, strings.NewReader("hello")); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(s.Runner.ScratchDir, "data.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode = %v, want 0600", fi.Mode().Perm())
	}
	var out bytes.Buffer
	if err := s.ReadFile(ctx, vsockproto.FileRequest{Path: filepath.Join(s.Runner.ScratchDir, "data.txt"), MaxBytes: 5}, &out); err != nil {
		t.Fatal(err)
	}
	if out.String() != "hello" {
		t.Errorf("read %q", out.String())
	}
}

func TestFileLimits(t *testing.T) {
	s := newService(t)
	ctx := context.Background()
	if err := s.WriteFile(ctx, vsockproto.FileRequest{Path: "big", MaxBytes: 4}, strings.NewReader("12345")); err == nil {
		t.Error("write of 5 bytes with MaxBytes 4 succeeded")
	}
	os.WriteFile(filepath.Join(s.Runner.ScratchDir, "f"), []byte("12345"), 0o644)
	var out bytes.Buffer
	if err := s.ReadFile(ctx, vsockproto.FileRequest{Path: "f", MaxBytes: 4}, &out); err == nil || out.Len() != 0 {
		t.Errorf("read of 5 bytes with MaxBytes 4: err %v, sent %d bytes; want an error before sending", err, out.Len())
	}
	if err := s.ReadFile(ctx, vsockproto.FileRequest{Path: "/dev/zero"}, &out); err == nil {
		t.Error("read of /dev/zero succeeded")
	}
}

func TestWriteFileDoesNotFollowSymlink(t *testing.T) {
	s := newService(t)
	target := filepath.Join(t.TempDir(), "precious")
	os.WriteFile(target, []byte("keep"), 0o644)
	if err := os.Symlink(target, filepath.Join(s.Runner.ScratchDir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := s.WriteFile(context.Background(), vsockproto.FileRequest{Path: "link"}, strings.NewReader("overwritten")); err == nil {
		t.Error("write through a symlink succeeded")
	}
	if got, _ := os.ReadFile(target); string(got) != "keep" {
		t.Errorf("symlink target now holds %q", got)
	}
}

// TestWriteFileChecksPathAsTheUser plants a symlinked parent directory
// pointing at a root-only directory, as hostile guest code could; the
// init (root) must not write through it on the worker's behalf.
func TestWriteFileChecksPathAsTheUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to act as another user; run the tests as root")
	}
	s := newService(t)
	const nobody = 65534
	passwd := fmt.Sprintf("worker:x:%d:%d::/nonexistent:/bin/sh\n", nobody, nobody)
	if err := os.WriteFile(filepath.Join(s.Runner.Root, "etc", "passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(s.Runner.ScratchDir, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	// t.TempDir's parents are private to root; the guest's /tmp is not.
	for d := filepath.Dir(s.Runner.ScratchDir); d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	protected := t.TempDir() // root-owned, 0700
	if err := os.Symlink(protected, filepath.Join(s.Runner.ScratchDir, "out")); err != nil {
		t.Fatal(err)
	}
	err := s.WriteFile(context.Background(), vsockproto.FileRequest{Path: "out/planted"}, strings.NewReader("x"))
	if err == nil {
		t.Error("write through a symlinked parent into a root-only directory succeeded")
	}
	if _, err := os.Stat(filepath.Join(protected, "planted")); err == nil {
		t.Error("file was created in the protected directory")
	}

	// The same user can still write where it may.
	if err := s.WriteFile(context.Background(), vsockproto.FileRequest{Path: "ok"}, strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(s.Runner.ScratchDir, "ok"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != nobody || st.Gid != nobody {
		t.Errorf("written file owned by %d:%d, want %d:%d", st.Uid, st.Gid, nobody, nobody)
	}
}
