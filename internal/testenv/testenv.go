// Package testenv holds what tests across the repository need to know about
// the machine they run on: where the guest image is, whether VMs can boot
// and whether the test runs as root, with one policy for missing
// prerequisites. Tests skip with an actionable message, unless
// EPHEMERAL_REQUIRE_VM=1 (as `make test` and CI set, after installing
// everything) promises nothing is missing: then the same message fails the
// test, so a broken setup can never pass as a run of skips.
//
// Only tests import it: libraries take values and never read the
// environment.
package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ephemeralhq/ephemeral/guest/image"
)

// RequireVMEnv names the variable that turns skips into failures.
const RequireVMEnv = "EPHEMERAL_REQUIRE_VM"

// DefaultStateDir is where `make image` builds the guest image unless
// EPHEMERAL_STATE_DIR says otherwise.
const DefaultStateDir = "/var/lib/ephemeral"

// qemuBinary is the VMM every machine can run (TCG where KVM cannot).
const qemuBinary = "qemu-system-x86_64"

// StateDir is the state directory holding the guest image:
// EPHEMERAL_STATE_DIR, or DefaultStateDir.
func StateDir() string {
	if d := os.Getenv("EPHEMERAL_STATE_DIR"); d != "" {
		return d
	}
	return DefaultStateDir
}

// Skip skips t with the message, or fails it with the message when
// EPHEMERAL_REQUIRE_VM=1.
func Skip(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv(RequireVMEnv) == "1" {
		t.Fatalf("%s=1 but: %s", RequireVMEnv, msg)
	}
	t.Skip(msg)
}

// RequireRoot skips (see Skip) unless the test runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Skip(t, "needs root (namespaces, tap devices, nftables, VMM confinement): run the tests as root, e.g. `sudo make test`")
	}
}

// RequireVM skips (see Skip) unless this machine can boot the guest image:
// the test runs as root (the VMM drivers confine their process as another
// user), QEMU is installed and the image is built in StateDir. It returns
// that image.
func RequireVM(t testing.TB) *image.Image {
	t.Helper()
	RequireRoot(t)
	if _, err := exec.LookPath(qemuBinary); err != nil {
		Skip(t, "%s not found: install QEMU with `apt-get install qemu-system-x86` (or run tools/install-deps.sh)", qemuBinary)
	}
	img, err := image.Load(StateDir())
	if errors.Is(err, image.ErrNoImage) {
		Skip(t, "no guest image in %s: build it with `make image` (or set EPHEMERAL_STATE_DIR): %v", StateDir(), err)
	}
	if err != nil {
		t.Fatalf("load the guest image: %v", err)
	}
	return img
}

// SharedReference returns the path of name in shared/reference beside the
// repository (reference documents that are not part of it, such as Cloud
// Hypervisor's API description), and skips the test when it is missing.
// It skips even under EPHEMERAL_REQUIRE_VM=1: a clone alone has no
// shared/ directory.
func SharedReference(t testing.TB, name string) string {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatalf("find the repository: %v", err)
	}
	path := filepath.Join(root, "..", "shared", "reference", name)
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		t.Skipf("reference document missing: put %s in %s", name, filepath.Dir(path))
	} else if err != nil {
		t.Fatal(err)
	}
	return path
}

// repoRoot walks up from the working directory (a test runs in its
// package's directory) to the directory holding go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// SyncBuffer is a bytes.Buffer that one goroutine may write while others
// read it, e.g. a process's output that a test polls.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
