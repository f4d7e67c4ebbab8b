package image

import (
	"bufio"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"

	"github.com/ephemeralhq/ephemeral/guest/kmod"
)

// DefaultMirror is the Debian mirror debootstrap uses unless told otherwise.
const DefaultMirror = "http://deb.debian.org/debian"

// Suite is the Debian release of the root filesystem and kernel.
const Suite = "bookworm"

// KernelMetaPackage is resolved to the versioned kernel package it depends on.
const KernelMetaPackage = "linux-image-cloud-amd64"

// Packages go into the root filesystem on top of debootstrap's minbase:
// what the agent's shell commands commonly need, plus ping and nc for
// network checks.
var Packages = []string{
	"bash", "coreutils", "python3", "curl", "ca-certificates", "procps",
	"iproute2", "iputils-ping", "netcat-openbsd", "less", "file", "xz-utils",
}

// Options configure Build.
type Options struct {
	StateDir string
	// InitBinary is the static guest init placed at /init.
	InitBinary string
	// Mirror is the Debian mirror for debootstrap.
	Mirror string
	// Force rebuilds every part even when a cached one matches.
	Force bool
	// Progress receives human-readable progress lines.
	Progress io.Writer
}

// hostTools maps each program the builder runs to the Debian package that
// provides it, for the error message when it is missing.
var hostTools = map[string]string{
	"debootstrap": "debootstrap",
	"mkfs.ext4":   "e2fsprogs",
	"apt-get":     "apt",
	"apt-cache":   "apt",
	"dpkg-deb":    "dpkg",
}

// CheckHostTools reports the first program the builder needs but cannot
// find, naming the package to install.
func CheckHostTools() error {
	for _, tool := range []string{"apt-get", "apt-cache", "dpkg-deb", "debootstrap", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("image: %s not found: install it with `apt-get install %s`", tool, hostTools[tool])
		}
	}
	return nil
}

// Build produces the image described by opts, reusing cached parts whose
// inputs are unchanged, and records it as the current image.
func Build(ctx context.Context, opts Options) (*Image, error) {
	if opts.Mirror == "" {
		opts.Mirror = DefaultMirror
	}
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	if err := CheckHostTools(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("image: build: debootstrap and device nodes need root; run as root")
	}
	initSum, err := checkInitBinary(opts.InitBinary)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(imagesDir(opts.StateDir), 0o755); err != nil {
		return nil, fmt.Errorf("image: build: %w", err)
	}
	b := builder{opts: opts}

	kernelPkg, kernelVersion, err := resolveKernelPackage(ctx)
	if err != nil {
		return nil, err
	}
	kKey := kernelKey(kernelPkg, kernelVersion)
	kernel := newCachedPart(opts.StateDir, "kernel", kKey)
	if err := b.ensure(kernel, "kernel "+kernelPkg+" "+kernelVersion, func(dir string) error {
		if err := extractKernel(ctx, kernelPkg, kernelVersion, dir); err != nil {
			return err
		}
		// Without a PVH kernel the bzImage boots, only slower.
		if err := extractPVHKernel(filepath.Join(dir, kernelImageFile), filepath.Join(dir, pvhKernelFile)); err != nil {
			b.progress("%v; VMs will boot the bzImage", err)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	release, err := os.ReadFile(kernel.path(kernelReleaseFile))
	if err != nil {
		return nil, fmt.Errorf("image: read kernel release: %w", err)
	}

	var wanted []string
	for _, w := range kmod.GuestModules {
		wanted = append(wanted, w.Name)
	}
	iKey := initrdKey(initSum, kKey, wanted)
	initrd := newCachedPart(opts.StateDir, "initrd", iKey)
	if err := b.ensure(initrd, "initramfs", func(dir string) error {
		return writeInitramfs(filepath.Join(dir, initrdFile), opts.InitBinary, kernel.path(kernelModulesDir))
	}); err != nil {
		return nil, err
	}

	rKey := rootfsKey(Suite, opts.Mirror, Packages)
	rootfs := newCachedPart(opts.StateDir, "rootfs", rKey)
	if err := b.ensure(rootfs, "root filesystem ("+Suite+")", func(dir string) error {
		return b.buildRootfs(ctx, dir)
	}); err != nil {
		return nil, err
	}

	img := &Image{
		Kernel:        bootKernel(kernel),
		Initrd:        initrd.path(initrdFile),
		RootDisk:      rootfs.path(rootfsFile),
		KernelRelease: string(release),
		Hash:          imageHash(rKey, kKey, iKey),
	}
	for _, p := range []*string{&img.Kernel, &img.Initrd, &img.RootDisk} {
		if *p, err = filepath.Abs(*p); err != nil {
			return nil, fmt.Errorf("image: build: %w", err)
		}
	}
	if err := writeManifest(opts.StateDir, img); err != nil {
		return nil, err
	}
	return img, nil
}

// Files inside the part directories.
const (
	kernelImageFile   = "vmlinuz"
	pvhKernelFile     = "vmlinux"
	kernelReleaseFile = "release"
	kernelModulesDir  = "modules"
	initrdFile        = "initrd.cpio"
	rootfsFile        = "rootfs.ext4"
)

type builder struct {
	opts Options
}

func (b builder) progress(format string, args ...any) {
	fmt.Fprintf(b.opts.Progress, format+"\n", args...)
}

// ensure builds part unless a cached copy exists and Force is off.
func (b builder) ensure(part cachedPart, what string, fill func(dir string) error) error {
	if part.exists() && !b.opts.Force {
		b.progress("%s: cached (%s)", what, part.dir)
		return nil
	}
	b.progress("%s: building", what)
	if err := part.build(fill); err != nil {
		return err
	}
	b.progress("%s: done (%s)", what, part.dir)
	return nil
}

// checkInitBinary makes sure path is a static executable, since a dynamic
// one would make the kernel panic at boot with no useful message, and
// returns its SHA-256.
func checkInitBinary(path string) (string, error) {
	if path == "" {
		return "", errors.New("image: no guest init binary given; build it with `make build`")
	}
	f, err := elf.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("image: guest init %s not found; build it with `make build` or pass --init: %w", path, err)
	}
	if err != nil {
		return "", fmt.Errorf("image: guest init %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", fmt.Errorf("image: guest init %s is dynamically linked; build it with CGO_ENABLED=0", path)
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("image: guest init: %w", err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]), nil
}

// run executes a host command, passing each output line to progress with a
// prefix so that long steps (debootstrap) show they are alive.
func (b builder) run(ctx context.Context, prefix string, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive")
	pr, pw := io.Pipe()
	cmd.Stdout = pw
	cmd.Stderr = pw
	var tail lineTail
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			tail.add(sc.Text())
			if prefix != "" {
				b.progress("%s: %s", prefix, sc.Text())
			}
		}
		io.Copy(io.Discard, pr) // drain an over-long line so the command never blocks
	}()
	err := cmd.Run()
	pw.Close()
	wg.Wait()
	if err != nil {
		return fmt.Errorf("image: %s: %w\n%s", name, err, tail.String())
	}
	return nil
}

// lineTail keeps the last lines of a command's output for its error message.
type lineTail struct {
	lines []string
}

func (t *lineTail) add(line string) {
	const keep = 15
	t.lines = append(t.lines, line)
	if len(t.lines) > keep {
		t.lines = t.lines[len(t.lines)-keep:]
	}
}

func (t *lineTail) String() string {
	var s string
	for _, l := range t.lines {
		s += "  " + l + "\n"
	}
	return s
}
