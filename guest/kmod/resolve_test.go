// The test is outside package kmod because testenv imports the image
// builder, which imports kmod.
package kmod_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ephemeralhq/ephemeral/guest/kmod"
	"github.com/ephemeralhq/ephemeral/internal/testenv"
)

// TestResolveDebianKernel runs against a real extracted kernel package when
// one is given, checking the .modinfo reader on real ELF files.
func TestResolveDebianKernel(t *testing.T) {
	dir := os.Getenv("EPHEMERAL_TEST_MODULE_DIR")
	if dir == "" {
		// The guest image's kernel part keeps the module tree.
		trees, _ := filepath.Glob(filepath.Join(testenv.StateDir(), "images", "kernel-*", "modules"))
		if len(trees) == 0 {
			testenv.Skip(t, "no kernel modules in %s: build the image (make image) or set EPHEMERAL_TEST_MODULE_DIR to an extracted lib/modules/<release>", testenv.StateDir())
		}
		dir = trees[len(trees)-1]
	}
	mods, err := kmod.Resolve(dir, kmod.GuestModules)
	if err != nil {
		t.Fatal(err)
	}
	pos := map[string]int{}
	for i, m := range mods {
		pos[m.Name] = i
	}
	for _, m := range mods {
		for _, d := range m.Depends {
			if p, ok := pos[d]; ok && p > pos[m.Name] {
				t.Errorf("%s loads before its dependency %s", m.Name, d)
			}
		}
	}
	if _, ok := pos["vmw_vsock_virtio_transport"]; !ok {
		t.Errorf("vsock transport missing from %v", mods)
	}
	t.Logf("order: %v", mods)
}
