// Package cloudhypervisor is the vmm.Driver for Cloud Hypervisor: it
// launches `cloud-hypervisor --api-socket path=<dir>/api.sock`, defines and
// boots the VM over the REST API (package chapi), passes the sandbox's tap by
// file descriptor, and reaches the guest init over Cloud Hypervisor's hybrid
// vsock (a Unix socket, <dir>/vsock.sock, speaking the CONNECT handshake).
//
// When the product uses it: Cloud Hypervisor runs only on KVM with hardware
// virtualization and has no emulation fallback. The daemon picks this driver
// when Available() and vmm.HardwareKVM() both return nil, and QEMU
// otherwise (QEMU with TCG is what runs on PVM hosts such as the development
// machines, where /dev/kvm exists but stock kernels hang).
//
// The driver records the VMM's pid in <dir>/vmm.pid; after a daemon crash,
// KillLeftover(dir) ends a VMM still serving that directory.
//
// It is a vmm.Snapshotter: see snapshot.go for how templates are saved with
// vm.snapshot and clones restored with vm.restore.
//
// The guest's serial port goes to the VMM's stdout (serial mode Tty), which
// is a pipe into a bounded tail buffer: nothing the guest prints reaches the
// disk or grows host memory. The virtio console is switched off explicitly
// because Cloud Hypervisor enables it on its terminal by default.
package cloudhypervisor

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/ephemeralhq/ephemeral/internal/cleanup"
	"github.com/ephemeralhq/ephemeral/vmm"
	"github.com/ephemeralhq/ephemeral/vmm/cloudhypervisor/chapi"
)

// DefaultBinary is the program New looks up in PATH when given none.
const DefaultBinary = "cloud-hypervisor"

// Names of what the driver creates in vmm.Config.Dir.
const (
	apiSocketName   = "api.sock"
	vsockSocketName = "vsock.sock"
	// pidFileName records the VMM's pid for KillLeftover.
	pidFileName = "vmm.pid"
	// snapshotDirName holds a template's snapshot, or a clone's copy of
	// it.
	snapshotDirName = "snapshot"
)

// guestCID is the guest's vsock context id. Hybrid vsock never reaches the
// host kernel's vsock layer, so every VM can use the lowest guest CID.
const guestCID = 3

// netQueuePairs is the virtio-net queue pairs, one per tap descriptor
// passed (vmm.Config.Tap is a single-queue tap).
const netQueuePairs = 1

// netDeviceID names the VM's net device, so that a clone restored from a
// snapshot can give it a tap of its own.
const netDeviceID = "net0"

// Timeouts of the start sequence. Each API call is also bounded by
// chapi.DefaultCallTimeout.
const (
	// apiReadyTimeout bounds the wait for the API socket when the caller's
	// context has no earlier deadline; the real VMM answers within
	// milliseconds of exec.
	apiReadyTimeout = 10 * time.Second
	// pingTimeout bounds one readiness probe.
	pingTimeout = 250 * time.Millisecond
	// shutdownVMMTimeout bounds Close's polite request before SIGKILL.
	shutdownVMMTimeout = time.Second
	// pipeDrainTimeout bounds how long reaping waits for the VMM's stdout
	// and stderr to close, should a process outside its group hold them.
	pipeDrainTimeout = 2 * time.Second
)

// Driver starts machines with one cloud-hypervisor binary.
type Driver struct {
	binary string
}

var _ vmm.Driver = (*Driver)(nil)

// New returns a driver that runs binary, a path or a name looked up in
// PATH; "" means DefaultBinary.
func New(binary string) *Driver {
	if binary == "" {
		binary = DefaultBinary
	}
	return &Driver{binary: binary}
}

// Available reports whether DefaultBinary is in PATH.
func Available() error {
	if _, err := exec.LookPath(DefaultBinary); err != nil {
		return fmt.Errorf("cloud-hypervisor: binary %q not found in PATH (install Cloud Hypervisor v39 or newer to use it on KVM hosts): %w", DefaultBinary, err)
	}
	return nil
}

// Name implements vmm.Driver.
func (d *Driver) Name() string { return "cloud-hypervisor" }

// Start implements vmm.Driver: it launches the VMM, creates the VM, adds the
// tap, boots, and returns once vm.info reports the VM running. On any
// failure, or when ctx ends first, the VMM is killed and its sockets
// removed before Start returns.
func (d *Driver) Start(ctx context.Context, cfg vmm.Config) (vmm.Machine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("cloud-hypervisor: start: %w", err)
	}
	var undo cleanup.Stack
	defer undo.Run()

	m, err := launch(d.binary, cfg.Dir, cfg.Cgroup)
	if err != nil {
		return nil, fmt.Errorf("cloud-hypervisor: start %s: %w", cfg.ID, err)
	}
	undo.AddErr(m.kill)

	if err := m.boot(ctx, cfg); err != nil {
		undo.Run() // the VMM's log is complete only once it is gone
		return nil, fmt.Errorf("cloud-hypervisor: start %s: %w", cfg.ID, m.explain(err))
	}
	undo.Release()
	return m, nil
}

// vmConfig is the VmConfig for cfg. The tap is not in it: vm.create ignores
// descriptors, so the tap is added with vm.add-net before boot.
func vmConfig(cfg vmm.Config, vsockPath string) chapi.VMConfig {
	return chapi.VMConfig{
		Payload: chapi.Payload{
			Kernel:    cfg.Kernel,
			Initramfs: cfg.Initrd,
			Cmdline:   strings.TrimSpace("console=ttyS0 " + cfg.Cmdline),
		},
		CPUs:    &chapi.CPUs{Boot: cfg.VCPUs, Max: cfg.VCPUs},
		Memory:  &chapi.Memory{SizeBytes: int64(cfg.MemoryMiB) << 20},
		RNG:     &chapi.RNG{Src: "/dev/urandom"},
		Serial:  &chapi.Console{Mode: chapi.ConsoleTty},
		Console: &chapi.Console{Mode: chapi.ConsoleOff},
		Vsock:   &chapi.Vsock{CID: guestCID, Socket: vsockPath},
		Disks:   []chapi.Disk{{Path: cfg.RootDisk, Readonly: true, ImageType: chapi.ImageTypeRaw, ID: "root"}},
	}
}

// netConfig is the virtio-net device for cfg.Tap.
func netConfig(cfg vmm.Config) chapi.Net {
	n := chapi.Net{NumQueues: 2 * netQueuePairs, ID: netDeviceID}
	if cfg.MAC != nil {
		n.MAC = cfg.MAC.String()
	}
	return n
}
