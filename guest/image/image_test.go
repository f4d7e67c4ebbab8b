package image

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestPartKeysChangeOnlyWithTheirInputs(t *testing.T) {
	pkgs := []string{"bash", "curl"}
	base := rootfsKey("bookworm", DefaultMirror, pkgs)
	for name, other := range map[string]string{
		"suite":    rootfsKey("trixie", DefaultMirror, pkgs),
		"mirror":   rootfsKey("bookworm", "http://mirror.example/debian", pkgs),
		"packages": rootfsKey("bookworm", DefaultMirror, []string{"bash"}),
	} {
		if other == base {
			t.Errorf("changing the %s leaves the rootfs key unchanged", name)
		}
	}
	k := kernelKey("linux-image-6.1.0-57-cloud-amd64", "6.1.192-3")
	if k == kernelKey("linux-image-6.1.0-57-cloud-amd64", "6.1.192-4") {
		t.Error("kernel key ignores the package version")
	}
	mods := []string{"virtio", "vsock"}
	i := initrdKey("sum1", k, mods)
	for name, other := range map[string]string{
		"init":    initrdKey("sum2", k, mods),
		"kernel":  initrdKey("sum1", "otherkernel", mods),
		"modules": initrdKey("sum1", k, []string{"virtio"}),
	} {
		if other == i {
			t.Errorf("changing the %s leaves the initrd key unchanged", name)
		}
	}
	if imageHash(base, k, i) == imageHash(base, k, initrdKey("sum2", k, mods)) {
		t.Error("image hash ignores the initrd")
	}
}

func TestLoadWithoutImage(t *testing.T) {
	_, err := Load(t.TempDir())
	if !errors.Is(err, ErrNoImage) || !strings.Contains(err.Error(), "ephemeral image build") {
		t.Fatalf("Load on empty state dir = %v, want ErrNoImage telling how to build", err)
	}
}

func TestManifestRoundTrip(t *testing.T) {
	state := t.TempDir()
	if err := os.MkdirAll(imagesDir(state), 0o755); err != nil {
		t.Fatal(err)
	}
	img := &Image{KernelRelease: "6.1.0-57-cloud-amd64", Hash: "abc"}
	for _, p := range []*string{&img.Kernel, &img.Initrd, &img.RootDisk} {
		f, err := os.CreateTemp(state, "part-")
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		*p = f.Name()
	}
	if err := writeManifest(state, img); err != nil {
		t.Fatal(err)
	}
	got, err := Load(state)
	if err != nil {
		t.Fatal(err)
	}
	if *got != *img {
		t.Errorf("Load = %+v, want %+v", got, img)
	}
	// A manifest whose files were deleted is no image at all.
	os.Remove(img.RootDisk)
	if _, err := Load(state); !errors.Is(err, ErrNoImage) {
		t.Errorf("Load with a missing root disk = %v, want ErrNoImage", err)
	}
}

func TestCachedPartBuildIsAtomic(t *testing.T) {
	state := t.TempDir()
	if err := os.MkdirAll(imagesDir(state), 0o755); err != nil {
		t.Fatal(err)
	}
	part := newCachedPart(state, "rootfs", "k1")
	failing := errors.New("debootstrap failed")
	if err := part.build(func(dir string) error {
		os.WriteFile(filepath.Join(dir, "half"), nil, 0o644)
		return failing
	}); !errors.Is(err, failing) {
		t.Fatalf("build = %v, want the fill error", err)
	}
	if part.exists() {
		t.Fatal("a failed build left a cached part")
	}
	for _, content := range []string{"first", "second"} {
		if err := part.build(func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "f"), []byte(content), 0o644)
		}); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(part.path("f")); string(got) != content {
			t.Errorf("after rebuild: %q, want %q", got, content)
		}
	}
	entries, _ := os.ReadDir(imagesDir(state))
	if len(entries) != 1 {
		t.Errorf("images dir holds %d entries, want only the part (no temp leftovers)", len(entries))
	}
}

func TestKernelDependency(t *testing.T) {
	out := []byte("Package: linux-image-cloud-amd64\nVersion: 6.1.192-3\nDepends: linux-image-6.1.0-57-cloud-amd64 (= 6.1.192-3)\nDescription: Linux for x86-64 cloud\n continued line\n\nPackage: second\n")
	fields := parseControl(out)
	if fields["Version"] != "6.1.192-3" || fields["Package"] != "linux-image-cloud-amd64" {
		t.Fatalf("parseControl = %v", fields)
	}
	pkg, err := kernelDependency(fields["Depends"])
	if err != nil || pkg != "linux-image-6.1.0-57-cloud-amd64" {
		t.Errorf("kernelDependency = %q, %v", pkg, err)
	}
	if _, err := kernelDependency("libc6 (>= 2.36), kmod"); err == nil {
		t.Error("no kernel in Depends: no error")
	}
}

func TestCheckInitBinary(t *testing.T) {
	dir := t.TempDir()
	if _, err := checkInitBinary(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "make build") {
		t.Errorf("missing init: %v, want a hint to run make build", err)
	}
	script := filepath.Join(dir, "script")
	os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755)
	if _, err := checkInitBinary(script); err == nil {
		t.Error("a shell script was accepted as init")
	}
	// The test binary itself is dynamically linked whenever cgo is on.
	self, _ := os.Executable()
	if out, _ := exec.Command("file", self).Output(); bytes.Contains(out, []byte("dynamically linked")) {
		if _, err := checkInitBinary(self); err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
			t.Errorf("dynamic init: %v, want a hint to build static", err)
		}
	}
}

// TestBuild builds a whole image into a temporary state directory, then
// checks that an unchanged rebuild is all cache hits and that a new init
// rebuilds only the initramfs. It downloads packages and takes minutes.
func TestBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("image build takes minutes; not in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("image build needs root (debootstrap); run as root")
	}
	if err := CheckHostTools(); err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	initBin := filepath.Join(dir, "ephemeral-init")
	build := exec.Command("go", "build", "-o", initBin, "github.com/ephemeralhq/ephemeral/guest/cmd/ephemeral-init")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build init: %v\n%s", err, out)
	}
	state := filepath.Join(dir, "state")
	var progress bytes.Buffer
	opts := Options{StateDir: state, InitBinary: initBin, Progress: &progress,
		Mirror: os.Getenv("EPHEMERAL_DEBIAN_MIRROR")}
	first, err := Build(context.Background(), opts)
	if err != nil {
		t.Fatalf("build: %v\n%s", err, progress.String())
	}
	// Debian's cloud kernel is an LZ4 bzImage with CONFIG_PVH: VMs must
	// get the decompressed kernel, which skips in-guest decompression.
	if filepath.Base(first.Kernel) != pvhKernelFile {
		t.Errorf("boot kernel %s, want the PVH %s\n%s", first.Kernel, pvhKernelFile, progress.String())
	}
	loaded, err := Load(state)
	if err != nil || *loaded != *first {
		t.Fatalf("Load = %+v, %v; want %+v", loaded, err, first)
	}

	progress.Reset()
	again, err := Build(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if *again != *first || strings.Count(progress.String(), ": cached") != 3 {
		t.Errorf("unchanged rebuild was not all cache hits:\n%s", progress.String())
	}

	data, _ := os.ReadFile(initBin)
	if err := os.WriteFile(initBin, append(data, 0), 0o755); err != nil {
		t.Fatal(err)
	}
	progress.Reset()
	changed, err := Build(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if changed.Initrd == first.Initrd || changed.Kernel != first.Kernel || changed.RootDisk != first.RootDisk || changed.Hash == first.Hash {
		t.Errorf("new init: got %+v from %+v, want only the initrd (and hash) changed", changed, first)
	}
}
