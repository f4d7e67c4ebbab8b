// Package vmm starts and stops microVMs. Each hypervisor has a driver in a
// sub-package (qemu, cloudhypervisor); callers use the Driver and Machine
// interfaces below and pick a driver with Detect.
package vmm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/ephemeralhq/ephemeral/internal/sandboxid"
)

// Config describes one microVM. Validate states its rules; every driver
// enforces them, and callers may check a Config before they build the
// resources it names.
type Config struct {
	// ID is the sandbox's id (package sandboxid); it names the VM in
	// process listings and leftover reconciliation.
	ID string
	// Kernel is a bzImage, Initrd the initramfs holding the guest init.
	Kernel string
	Initrd string
	// RootDisk is the ext4 root filesystem, attached read-only.
	RootDisk string
	// Cmdline is appended to the driver's own kernel command line.
	Cmdline string
	// VCPUs is MinVCPUs..MaxVCPUs.
	VCPUs int
	// MemoryMiB is the guest RAM, MinMemoryMiB..MaxMemoryMiB.
	MemoryMiB int
	// Dir is a private directory for the VM's sockets and logs, at most
	// MaxDirLen bytes long. The driver creates what it needs in it; the
	// caller removes it after Close.
	Dir string
	// Tap, when set, is an open tap device attached as the guest's only
	// network interface (virtio-net). The driver dups it into the VMM; the
	// caller keeps ownership of this *os.File.
	Tap *os.File
	// MAC is the guest interface's address, required with Tap and
	// meaningless without.
	MAC net.HardwareAddr
	// Cgroup, when set, confines the VMM's use of the host: the driver
	// adds the VMM process to it right after starting it, before the
	// guest runs its first instruction. Leave it nil (not a nil pointer
	// in an interface) for none.
	Cgroup Cgroup
}

// Cgroup is a control group that limits one VMM process's CPU, memory and
// tasks (a *cgroup.Group).
type Cgroup interface {
	AddProcess(pid int) error
}

// Bounds of a Config, the same for every driver.
const (
	MinVCPUs = 1
	// MaxVCPUs bounds what one sandbox may take of a host.
	MaxVCPUs = 16
	// MinMemoryMiB is what the guest kernel and init need to come up
	// with room left for the user's commands.
	MinMemoryMiB = 128
	MaxMemoryMiB = 16 << 10
	// MaxSocketNameLen bounds the names of the Unix sockets drivers create
	// in Config.Dir.
	MaxSocketNameLen = 10
	// MaxDirLen keeps the paths of those sockets within a Unix socket
	// address (sun_path holds 107 bytes and a NUL).
	MaxDirLen = 107 - len("/") - MaxSocketNameLen
)

// Validate reports every way c breaks the rules above, so that a driver
// fails before it starts anything, with a clearer message than the VMM's.
func (c Config) Validate() error {
	var errs []error
	if err := sandboxid.Validate(c.ID); err != nil {
		errs = append(errs, fmt.Errorf("id: %w", err))
	}
	for _, p := range []struct{ name, path string }{
		{"kernel", c.Kernel}, {"initrd", c.Initrd}, {"root disk", c.RootDisk}, {"dir", c.Dir},
	} {
		if !filepath.IsAbs(p.path) {
			errs = append(errs, fmt.Errorf("%s path %q: want an absolute path", p.name, p.path))
		}
	}
	if len(c.Dir) > MaxDirLen {
		errs = append(errs, fmt.Errorf("dir %q: longer than %d bytes, its sockets' paths would not fit a Unix socket address", c.Dir, MaxDirLen))
	}
	if c.VCPUs < MinVCPUs || c.VCPUs > MaxVCPUs {
		errs = append(errs, fmt.Errorf("vcpus %d out of range %d..%d", c.VCPUs, MinVCPUs, MaxVCPUs))
	}
	if c.MemoryMiB < MinMemoryMiB || c.MemoryMiB > MaxMemoryMiB {
		errs = append(errs, fmt.Errorf("memory %d MiB out of range %d..%d", c.MemoryMiB, MinMemoryMiB, MaxMemoryMiB))
	}
	switch {
	case c.Tap != nil && len(c.MAC) != 6:
		errs = append(errs, fmt.Errorf("mac %q: want a 6-byte Ethernet address with a tap", c.MAC))
	case c.Tap == nil && c.MAC != nil:
		errs = append(errs, errors.New("mac set without a tap"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("vmm: config: %w", err)
	}
	return nil
}

// CheckClone reports how clone, a Config for a machine restored from a
// template booted with c, differs from c in anything but the identity a
// clone gets of its own (ID, Dir, Tap and MAC) and its Cgroup: the
// restored guest's memory and devices are the template's, so its shape
// must be too.
func (c Config) CheckClone(clone Config) error {
	var errs []error
	for _, f := range []struct{ name, template, clone string }{
		{"kernel", c.Kernel, clone.Kernel}, {"initrd", c.Initrd, clone.Initrd},
		{"root disk", c.RootDisk, clone.RootDisk}, {"cmdline", c.Cmdline, clone.Cmdline},
	} {
		if f.template != f.clone {
			errs = append(errs, fmt.Errorf("%s %q, the template's is %q", f.name, f.clone, f.template))
		}
	}
	if c.VCPUs != clone.VCPUs || c.MemoryMiB != clone.MemoryMiB {
		errs = append(errs, fmt.Errorf("%d vcpus and %d MiB, the template has %d and %d", clone.VCPUs, clone.MemoryMiB, c.VCPUs, c.MemoryMiB))
	}
	if (c.Tap == nil) != (clone.Tap == nil) {
		errs = append(errs, errors.New("a network interface where the template has none, or none where it has one"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("vmm: clone: %w", err)
	}
	return nil
}

// DefaultMemoryOverheadMiB is the memory a VMM is given beyond its guest's
// RAM when it runs in a cgroup (device emulation, QEMU's translation cache
// under TCG, page tables, the page cache of the files it reads). Measured
// for QEMU under TCG, where it is largest: a 512 MiB guest that touched all
// of its RAM peaked at 657 MiB RSS with QEMU's default translation cache;
// the QEMU driver bounds that cache at 128 MiB.
const DefaultMemoryOverheadMiB = 256

// Driver boots machines with one hypervisor.
type Driver interface {
	// Name is "qemu" or "cloud-hypervisor".
	Name() string
	// Start launches the VMM process and boots cfg. It returns once the
	// VMM reports the VM running; the guest may still be booting. If ctx
	// is cancelled or Start fails, nothing is left running. ctx bounds
	// the start only: a started machine runs until Close.
	Start(ctx context.Context, cfg Config) (Machine, error)
}

// Snapshotter is a Driver that can also save a freshly booted machine as a
// Template and start clones of it, which skips the boot.
type Snapshotter interface {
	Driver
	// Snapshot boots cfg and waits until the guest init waits for its
	// host (vsockproto.WaitingForHost) — before any connection to the
	// guest is made, so that every clone greets its own host — then saves
	// the machine into a Template and stops it. cfg.Dir holds whatever
	// the driver keeps on disk for the template, until Template.Close.
	Snapshot(ctx context.Context, cfg Config) (Template, error)
	// Restore starts a clone of t like Start starts a machine. cfg gives
	// the clone its own ID, Dir, Tap and MAC; the rest must be the
	// template's (Config.CheckClone). The clone's guest wakes with the
	// template's memory, down to its random state and clock: its host
	// must make it unique (vsockproto.Provision) before anything else.
	Restore(ctx context.Context, t Template, cfg Config) (Machine, error)
}

// Template is a saved machine that clones start from. It is safe for
// concurrent use.
type Template interface {
	// Config is what the template was booted with.
	Config() Config
	// Close releases the template. Clones already started run on.
	Close() error
}

// Machine is one running microVM.
type Machine interface {
	// DialGuest opens the byte stream to the guest init (the vsockproto
	// connection). It retries until the guest answers or ctx ends. Over
	// virtio-serial the stream exists before the guest init is up: the
	// guest's Hello, not the dial, says it is ready.
	DialGuest(ctx context.Context) (net.Conn, error)
	// PID is the VMM process id.
	PID() int
	// Timings reports when the VMM was launched and when it reported
	// the VM running.
	Timings() Timings
	// Console returns the tail of the guest's serial console (bounded).
	Console() string
	// Done is closed when the VMM process has exited.
	Done() <-chan struct{}
	// Close kills the VMM process, waits for it and removes what the
	// driver created in Config.Dir. It is idempotent.
	Close() error
}

// Timings are host-side timestamps of a machine's start.
type Timings struct {
	Launched time.Time // VMM process started
	Running  time.Time // VMM reported the VM running
}
