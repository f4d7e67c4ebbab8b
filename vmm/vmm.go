// Package vmm starts and stops microVMs. Each hypervisor has a driver in a
// sub-package (qemu, cloudhypervisor); callers use the Driver and Machine
// interfaces below and pick a driver with Detect.
package vmm

import (
	"context"
	"net"
	"os"
	"time"
)

// Config describes one microVM. Paths are absolute.
type Config struct {
	// ID names the VM in process listings and leftover reconciliation.
	ID string
	// Kernel is a bzImage, Initrd the initramfs holding the guest init.
	Kernel string
	Initrd string
	// RootDisk is the ext4 root filesystem, attached read-only.
	RootDisk string
	// Cmdline is appended to the driver's own kernel command line.
	Cmdline string
	VCPUs   int
	// MemoryMiB is the guest RAM.
	MemoryMiB int
	// Dir is a private directory for the VM's sockets and logs. The driver
	// creates what it needs in it; the caller removes it after Close.
	Dir string
	// Tap, when set, is an open tap device attached as the guest's only
	// network interface (virtio-net). The driver dups it into the VMM; the
	// caller keeps ownership of this *os.File.
	Tap *os.File
	// MAC is the guest interface's address when Tap is set.
	MAC net.HardwareAddr
}

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
