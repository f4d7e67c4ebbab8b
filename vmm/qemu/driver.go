// Package qemu runs microVMs with QEMU's microvm machine: KVM where the host
// has hardware virtualization, the TCG emulator everywhere else.
//
// QEMU is launched with every socket it serves already created by the
// driver and passed in as a descriptor (QMP, the guest channel), so there
// is no waiting for sockets to appear and nothing to race. QMP tells when
// the VM runs. The guest channel is vhost-vsock when the host has
// /dev/vhost-vsock, otherwise a virtio-serial port behind a Unix socket.
//
// QEMU runs under its seccomp filter and, where the VMMUser account exists,
// as that user in a chroot: see confinement and Driver.Confinement.
//
// The driver is a vmm.Snapshotter: snapshot.go saves templates into sealed
// memfds and restores clones from them, under the same confinement.
package qemu

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/ephemeralhq/ephemeral/internal/cleanup"
	"github.com/ephemeralhq/ephemeral/vmm"
	"github.com/ephemeralhq/ephemeral/vmm/internal/vmproc"
	"github.com/ephemeralhq/ephemeral/vmm/qemu/internal/qmp"
)

// DefaultBinary is the QEMU looked up in PATH when New is given "".
const DefaultBinary = "qemu-system-x86_64"

// Available reports whether DefaultBinary is installed.
func Available() error {
	if _, err := exec.LookPath(DefaultBinary); err != nil {
		return fmt.Errorf("%s not found: apt-get install qemu-system-x86", DefaultBinary)
	}
	return nil
}

// Driver starts QEMU microVMs. It is safe for concurrent use.
type Driver struct {
	binary string
	// host is probed once: the CPU does not change under a running daemon.
	host func() (hostFacts, error)
	// confine is probed once too: a VMMUser created later takes effect
	// when the daemon restarts.
	confine func() (confinement, error)
}

// hostFacts are what the command line needs to know about the host.
type hostFacts struct {
	accel  accel
	tscKHz int
}

// New returns a driver that runs binary, or DefaultBinary from PATH when
// binary is "".
func New(binary string) *Driver {
	if binary == "" {
		binary = DefaultBinary
	}
	return &Driver{binary: binary, host: sync.OnceValues(probeHost), confine: sync.OnceValues(probeConfinement)}
}

func probeHost() (hostFacts, error) {
	facts := hostFacts{accel: accelTCG}
	if vmm.HardwareKVM() == nil {
		facts.accel = accelKVM
	}
	khz, err := vmm.HostTSCKHz()
	if err != nil {
		return hostFacts{}, fmt.Errorf("qemu: %w", err)
	}
	facts.tscKHz = khz
	return facts, nil
}

var _ vmm.Driver = (*Driver)(nil)

// Name implements vmm.Driver.
func (d *Driver) Name() string { return "qemu" }

// Accelerator reports how guests will run on this host: "kvm" or "tcg".
func (d *Driver) Accelerator() (string, error) {
	facts, err := d.host()
	return string(facts.accel), err
}

// Confinement describes what confines QEMU processes on this host beyond
// the VM boundary, e.g. "seccomp, runs as ephemeral-vmm in a chroot". Where
// VMMUser does not exist it says that QEMU runs as root, and why.
func (d *Driver) Confinement() (string, error) {
	c, err := d.confine()
	return c.String(), err
}

// Files the driver creates in Config.Dir.
const (
	qmpSocketName   = "qmp.sock"
	guestSocketName = "guest.sock"
	pidFileName     = "pid"
)

// Start implements vmm.Driver. ctx bounds the start only; once Start has
// returned, the machine runs until Close or until the guest powers off.
func (d *Driver) Start(ctx context.Context, cfg vmm.Config) (vmm.Machine, error) {
	m, client, err := d.launch(ctx, cfg, boot{})
	if err != nil {
		return nil, err
	}
	defer client.Close()
	if err := m.run(ctx, client); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// Baseline returns QEMU as anyone would start cfg's machine by hand: the
// command line Start runs, less what the driver adds around the machine
// (no confinement, no QMP or pid file, not paused) and with the network
// device on a hub nothing joins instead of a tap (cfg.Tap must be nil).
// Its guest channel is the virtio-serial port on the listening Unix socket
// serial, which the command inherits. Benchmarks run it to tell the
// driver's cost from QEMU's own.
func (d *Driver) Baseline(cfg vmm.Config, serial *os.File) (*exec.Cmd, error) {
	facts, err := d.host()
	if err != nil {
		return nil, err
	}
	l := launch{cfg: cfg, accel: facts.accel, tscKHz: facts.tscKHz, serialFD: 3, baseline: true}
	args, err := l.args()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(d.binary, args...)
	cmd.ExtraFiles = []*os.File{serial}
	return cmd, nil
}

// boot says how a launch gets its guest going: by booting the kernel into
// QEMU's own RAM (the zero value), or with RAM in a memory file the driver
// holds, for a template or a clone restored from one.
type boot struct {
	// ram backs guest RAM: a memfd. A template maps it shared, so that
	// the guest's memory lands in it; a clone maps it private, reading the
	// template's pages and copying those it writes.
	ram       *os.File
	ramShared bool
	// incoming is the template's device state for a clone to load; the
	// guest then starts from it instead of from the kernel.
	incoming *os.File
}

// launch starts QEMU for cfg and returns it paused (-S) and confined, with
// a QMP session the caller closes. If ctx ends or launch fails, nothing is
// left running.
func (d *Driver) launch(ctx context.Context, cfg vmm.Config, b boot) (*machine, *qmp.Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, nil, fmt.Errorf("qemu: start: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("qemu: start: %w", err)
	}
	facts, err := d.host()
	if err != nil {
		return nil, nil, err
	}
	confine, err := d.confine()
	if err != nil {
		return nil, nil, err
	}
	if _, err := exec.LookPath(d.binary); err != nil {
		return nil, nil, fmt.Errorf("qemu: %s not found: apt-get install qemu-system-x86", d.binary)
	}
	m := &machine{
		dir:     cfg.Dir,
		console: vmproc.NewTailBuffer(vmproc.ConsoleTailSize),
	}
	var undo cleanup.Stack
	defer undo.Run()
	// Leftovers of an earlier VM in the same directory would make bind
	// fail or point KillLeftover at a dead pid.
	if err := m.removeFiles(); err != nil {
		return nil, nil, err
	}
	undo.AddErr(m.removeFiles)

	var files childFiles
	defer files.closeOwned()
	l, err := m.plan(cfg, facts, b, &files)
	if err != nil {
		return nil, nil, err
	}
	l.confine = confine
	args, err := l.args()
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(d.binary, args...)
	cmd.ExtraFiles = files.all
	cmd.Stdout = m.console // the serial console
	cmd.Stderr = m.console // QEMU's own complaints, next to what the guest said
	// A process that inherited the console pipe must not hold Wait open.
	cmd.WaitDelay = time.Second
	// vmproc makes QEMU die with the daemon until it switches user
	// (-runas), which clears the parent-death signal: from then on a
	// crashed daemon leaves it running until KillLeftover finds it at the
	// next start.
	m.proc, err = vmproc.Start(cmd, cfg.Cgroup)
	if err != nil {
		return nil, nil, fmt.Errorf("qemu: start %s: %w", d.binary, err)
	}
	m.timings.Launched = m.proc.Launched()
	undo.AddErr(m.Close)
	// QEMU holds the sockets now; a parent copy would keep them alive
	// after QEMU died and hang the QMP handshake below.
	files.closeOwned()

	// QMP I/O fails when QEMU dies (its end of the socket closes), so no
	// separate watch on the process is needed while talking to it.
	client, err := qmp.Dial(ctx, filepath.Join(m.dir, qmpSocketName))
	if err != nil {
		return nil, nil, m.startError(ctx, err)
	}
	undo.AddErr(client.Close)
	if err := m.waitConfined(ctx, confine); err != nil {
		return nil, nil, err
	}
	undo.Release()
	return m, client, nil
}

// plan creates the sockets QEMU will serve, picks the guest channel
// (vhost-vsock when the host has it, virtio-serial otherwise) and hands
// QEMU b's files.
func (m *machine) plan(cfg vmm.Config, facts hostFacts, b boot, files *childFiles) (launch, error) {
	l := launch{cfg: cfg, accel: facts.accel, tscKHz: facts.tscKHz, pidFile: filepath.Join(cfg.Dir, pidFileName)}
	qmpListener, err := listenUnix(filepath.Join(cfg.Dir, qmpSocketName))
	if err != nil {
		return launch{}, err
	}
	l.qmpFD = files.pass(qmpListener)
	if b.ram != nil {
		l.ramFD, l.ramShared = files.lend(b.ram), b.ramShared
	}
	if b.incoming != nil {
		l.incomingFD = files.lend(b.incoming)
		m.incomingFD = l.incomingFD
	}
	// Templates and clones use virtio-serial: a vhost-vsock device holds
	// its guest CID in the saved state, which clones must not share.
	if b.ram == nil {
		if vhost, cid, err := reserveVsockCID(); err == nil {
			l.vhostFD, l.vsockCID = files.pass(vhost), cid
			m.vsockCID = cid
		}
	}
	if l.vhostFD == 0 {
		serial, err := listenUnix(filepath.Join(cfg.Dir, guestSocketName))
		if err != nil {
			return launch{}, err
		}
		l.serialFD = files.pass(serial)
	}
	if cfg.Tap != nil {
		l.tapFD = files.lend(cfg.Tap)
	}
	return l, nil
}

// childFiles are the descriptors QEMU inherits: all[i] becomes its
// descriptor 3+i.
type childFiles struct {
	all []*os.File
	// owned were created for QEMU; the parent closes its copies once QEMU
	// has started (or failed to).
	owned []*os.File
}

// pass hands over f, which the driver created, and returns its number in
// the child.
func (c *childFiles) pass(f *os.File) int {
	c.owned = append(c.owned, f)
	return c.lend(f)
}

// lend gives the child a copy of the caller's f, which stays open.
func (c *childFiles) lend(f *os.File) int {
	c.all = append(c.all, f)
	return 2 + len(c.all)
}

func (c *childFiles) closeOwned() {
	for _, f := range c.owned {
		f.Close()
	}
	c.owned = nil
}

// run lets the paused, confined guest run and returns once QEMU reports
// the VM running, or fails with what QEMU printed when it exits first.
func (m *machine) run(ctx context.Context, client *qmp.Client) error {
	if err := client.Cont(ctx); err != nil {
		return m.startError(ctx, fmt.Errorf("qmp: cont: %w", err))
	}
	const poll = 10 * time.Millisecond
	for {
		status, err := client.QueryStatus(ctx)
		if err != nil {
			return m.startError(ctx, err)
		}
		if status.Running {
			m.timings.Running = time.Now()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("qemu: wait for running (state %q): %w", status.Status, ctx.Err())
		case <-m.Done():
			return m.startError(ctx, fmt.Errorf("state %q", status.Status))
		case <-time.After(poll):
		}
	}
}

// waitConfined returns once QEMU has switched to confine's user. QEMU was
// started paused (-S) and switches late in its start-up, not necessarily
// before it answers QMP; the guest's first instruction must already run
// confined.
func (m *machine) waitConfined(ctx context.Context, confine confinement) error {
	const poll = 5 * time.Millisecond
	for {
		switched, err := confine.switched(m.proc.Pid())
		if err != nil {
			return m.startError(ctx, err)
		}
		if switched {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("qemu: wait for the switch to user %s: %w", confine.runAs, ctx.Err())
		case <-m.Done():
			return m.startError(ctx, fmt.Errorf("exited before switching to user %s", confine.runAs))
		case <-time.After(poll):
		}
	}
}

// startError explains a failed start: the caller's cancellation, or QEMU
// exiting, with the end of its console (QEMU's error message is there).
func (m *machine) startError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("qemu: start: %w", ctx.Err())
	}
	select {
	case <-m.Done():
		return m.exitError()
	case <-time.After(time.Second):
		// A live QEMU that broke QMP: say so, with what it printed.
		return fmt.Errorf("qemu: start: %w; console:\n%s", err, vmproc.PrintableTail(m.console.String()))
	}
}

// listenUnix creates a listening Unix socket at path and returns it as a
// file for QEMU to inherit. Closing the parent's copy leaves the path in
// place: QEMU still listens on it.
func listenUnix(path string) (*os.File, error) {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("qemu: listen: %w", err)
	}
	l.SetUnlinkOnClose(false)
	defer l.Close()
	f, err := l.File()
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("qemu: listen %s: %w", path, err)
	}
	return f, nil
}
