// Package sandbox is the host's handle on disposable microVMs: it boots one
// from the guest image with the machine's VMM, connects to the guest init,
// runs commands and file transfers in it, and destroys it so that nothing
// remains — no VMM process, socket, directory or network namespace — also
// when the caller's context ends mid-boot or the daemon itself died.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ephemeralhq/ephemeral/guest/image"
	"github.com/ephemeralhq/ephemeral/internal/cleanup"
	"github.com/ephemeralhq/ephemeral/internal/flock"
	"github.com/ephemeralhq/ephemeral/internal/sandboxid"
	"github.com/ephemeralhq/ephemeral/netns"
	"github.com/ephemeralhq/ephemeral/vmm"
	"github.com/ephemeralhq/ephemeral/vmm/cgroup"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// Options shape one sandbox.
type Options struct {
	// VCPUs defaults to 1, MemoryMiB to 512; both must be within the
	// bounds of vmm.Config.
	VCPUs     int
	MemoryMiB int
	// Network is the sandbox's firewall; the zero value is netns.Sealed:
	// nothing leaves the VM.
	Network netns.Config
	// Env is added to every exec's environment after the proxy variables,
	// e.g. EPHEMERAL_CONNECTIONS_URL (broker.Grants.GuestEnv).
	Env []string
}

func (o *Options) withDefaults() (Options, error) {
	out := *o
	if out.VCPUs == 0 {
		out.VCPUs = 1
	}
	if out.MemoryMiB == 0 {
		out.MemoryMiB = 512
	}
	if err := out.Network.Validate(); err != nil {
		return out, fmt.Errorf("sandbox: %w", err)
	}
	return out, nil
}

// Manager creates sandboxes from one guest image with one VMM driver. It is
// safe for concurrent use; several processes may share a state directory.
type Manager struct {
	driver   vmm.Driver
	image    *image.Image
	dir      string // <state>/sandboxes
	logf     func(format string, args ...any)
	killer   leftoverKiller
	mu       sync.Mutex
	live     map[string]*Sandbox // guarded by mu
	draining bool                // guarded by mu

	limits Limits
	// cgroups confines each VMM; nil where the host has none for it,
	// noCgroups says why.
	cgroups   *cgroup.Hierarchy
	noCgroups string
}

// leftoverKiller kills a VMM that a dead process left running for a
// sandbox directory.
type leftoverKiller func(vmDir string) error

// Config configures a Manager.
type Config struct {
	// StateDir holds the guest image and, under sandboxes/, the
	// sandboxes' directories.
	StateDir string
	// RunDir overrides where the sandboxes' directories go.
	RunDir string
	// Driver is the VMM; nil means Detect("auto").
	Driver vmm.Driver
	// Logf receives diagnostics; nil means log.Printf.
	Logf func(format string, args ...any)
	// Limits bound each sandbox; unset fields take DefaultLimits'.
	Limits Limits
}

// NewManager loads the guest image, picks the VMM driver and finds the
// host's cgroups for the VMMs (without them VMMs run unconfined, with a
// warning). It does not touch leftovers of other processes; call Reconcile
// for that.
func NewManager(cfg Config) (*Manager, error) {
	img, err := image.Load(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	driver := cfg.Driver
	if driver == nil {
		if driver, err = Detect("auto"); err != nil {
			return nil, err
		}
	}
	logf := cfg.Logf
	if logf == nil {
		logf = log.Printf
	}
	dir := cfg.RunDir
	if dir == "" {
		dir = filepath.Join(cfg.StateDir, "sandboxes")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("sandbox: create state dir: %w", err)
	}
	cgroups, noCgroups := detectCgroups()
	if cgroups == nil {
		logf("sandbox: VMMs run without cgroup limits on their CPU, memory and tasks: %s", noCgroups)
	}
	m := &Manager{
		driver: driver,
		image:  img,
		dir:    dir,
		logf:   logf,
		killer: killLeftoverVMM,
		live:   make(map[string]*Sandbox),
	}
	m.limits, m.cgroups, m.noCgroups = cfg.Limits.withDefaults(), cgroups, noCgroups
	return m, nil
}

// Driver names the VMM in use.
func (m *Manager) Driver() string { return m.driver.Name() }

// Describe says how VMs run here, for logs and benchmarks: the VMM, its
// accelerator and its confinement where the driver reports them, and its
// cgroup limits, e.g. "qemu (tcg; seccomp, runs as ephemeral-vmm in a
// chroot; cgroup v1: cpu quota, memory, tasks, I/O weight (blkio.weight))".
func (m *Manager) Describe() string {
	var parts []string
	if d, ok := m.driver.(interface{ Accelerator() (string, error) }); ok {
		if acc, err := d.Accelerator(); err == nil {
			parts = append(parts, acc)
		}
	}
	if d, ok := m.driver.(interface{ Confinement() (string, error) }); ok {
		c, err := d.Confinement()
		if err != nil {
			c = "confinement unknown: " + err.Error()
		}
		parts = append(parts, c)
	}
	parts = append(parts, m.describeCgroups())
	return m.driver.Name() + " (" + strings.Join(parts, "; ") + ")"
}

// Image is the guest image sandboxes boot from.
func (m *Manager) Image() *image.Image { return m.image }

// BootTimings break one sandbox's start into phases.
type BootTimings struct {
	// Network is the creation of the network namespace, tap and firewall.
	Network time.Duration
	// VMMStart is from launching the VMM process to the VMM reporting
	// the VM running.
	VMMStart time.Duration
	// Kernel is the guest kernel's own boot, up to starting the init.
	Kernel time.Duration
	// Init is the guest init's work up to serving the host (mounts,
	// modules, overlay).
	Init time.Duration
	// Ready is from Create's call to the guest's Hello: what a user waits.
	Ready time.Duration
}

// guestCmdline is added to every guest's kernel command line. The kernel's
// crypto self-tests cost about 230 ms of each boot under TCG; the guest's
// kernel crypto guards nothing the host relies on, and the same kernel
// build is self-tested wherever it runs as a host.
const guestCmdline = "cryptomgr.notests"

// Sandbox is one running microVM with its guest connection.
type Sandbox struct {
	id      string
	dir     string
	lock    *os.File
	network *netns.Network
	machine vmm.Machine
	client  *vsockproto.Client
	hello   vsockproto.Hello
	// cgroup confines the VMM; nil where the host has none.
	cgroup *cgroup.Group
	// env is added to every exec's environment: the proxy variables in
	// broker mode.
	env     []string
	timings BootTimings
	m       *Manager

	destroyOnce sync.Once
	destroyErr  error
}

// ErrDestroyed is returned by operations on a destroyed sandbox.
var ErrDestroyed = errors.New("sandbox destroyed")

// Create boots a sandbox and waits until its guest init is serving. On
// error, or when ctx ends first, everything it had started is torn down.
func (m *Manager) Create(ctx context.Context, opts Options) (*Sandbox, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	began := time.Now()
	id := sandboxid.New()
	dir := filepath.Join(m.dir, id)
	vmCfg := vmm.Config{
		ID:        id,
		Kernel:    m.image.Kernel,
		Initrd:    m.image.Initrd,
		RootDisk:  m.image.RootDisk,
		Cmdline:   guestCmdline + " " + m.limits.Guest.Params(),
		VCPUs:     opts.VCPUs,
		MemoryMiB: opts.MemoryMiB,
		Dir:       filepath.Join(dir, "vm"),
	}
	// Checked before anything is built; the tap joins once it exists.
	if err := errors.Join(vmCfg.Validate(), m.limits.Guest.Validate(opts.MemoryMiB)); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	var undo cleanup.Stack
	defer undo.Run()

	lock, err := m.makeOwnedDir(dir)
	if err != nil {
		return nil, err
	}
	undo.Add(func() { os.RemoveAll(dir); lock.Close() })

	if err := m.register(id, nil); err != nil {
		return nil, err
	}
	undo.Add(func() { m.unregister(id) })

	netBegan := time.Now()
	network, err := netns.Create(ctx, id, opts.Network)
	if err != nil {
		return nil, fmt.Errorf("sandbox: network: %w", err)
	}
	netTook := time.Since(netBegan)
	undo.AddErr(network.Close)

	if err := os.Mkdir(vmCfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("sandbox: create vm dir: %w", err)
	}
	group, err := m.confine(id, opts)
	if err != nil {
		return nil, err
	}
	if group != nil {
		undo.AddErr(group.Remove)
		vmCfg.Cgroup = group
	}
	vmCfg.Tap, vmCfg.MAC = network.Tap(), network.MAC()
	machine, err := m.driver.Start(ctx, vmCfg)
	if err != nil {
		return nil, fmt.Errorf("sandbox: start %s: %w", m.driver.Name(), err)
	}
	undo.AddErr(machine.Close)

	client, hello, err := connect(ctx, machine)
	if err != nil {
		return nil, fmt.Errorf("sandbox: connect to guest: %w\nguest console:\n%s", err, machine.Console())
	}
	undo.AddErr(client.Close)
	if err := client.ConfigureNetwork(ctx, network.GuestConfig()); err != nil {
		return nil, fmt.Errorf("sandbox: configure guest network: %w", err)
	}

	vt := machine.Timings()
	sb := &Sandbox{
		id:      id,
		dir:     dir,
		lock:    lock,
		network: network,
		cgroup:  group,
		env:     append(proxyEnv(opts.Network), opts.Env...),
		machine: machine,
		client:  client,
		hello:   hello,
		m:       m,
		timings: BootTimings{
			Network:  netTook,
			VMMStart: vt.Running.Sub(vt.Launched),
			Kernel:   hello.KernelUptime - hello.InitDuration,
			Init:     hello.InitDuration,
			Ready:    time.Since(began),
		},
	}
	if err := m.register(id, sb); err != nil {
		return nil, err
	}
	undo.Release()
	return sb, nil
}

// connect dials the guest and waits for its Hello, giving up when the VMM
// dies so a guest that never comes up fails fast instead of at ctx's end.
func connect(ctx context.Context, machine vmm.Machine) (*vsockproto.Client, vsockproto.Hello, error) {
	ctx, cancel := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-machine.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	defer func() { cancel(); <-watched }()
	conn, err := machine.DialGuest(ctx)
	if err != nil {
		return nil, vsockproto.Hello{}, vmmExited(machine, err)
	}
	client := vsockproto.NewClient(conn)
	hello, err := client.Hello(ctx)
	if err != nil {
		client.Close()
		return nil, vsockproto.Hello{}, vmmExited(machine, err)
	}
	return client, hello, nil
}

func vmmExited(machine vmm.Machine, err error) error {
	select {
	case <-machine.Done():
		return fmt.Errorf("VMM exited during boot: %w", err)
	default:
		return err
	}
}

// proxyEnv points the guest's HTTP clients at the broker, the only thing
// the firewall lets them reach in broker mode.
func proxyEnv(cfg netns.Config) []string {
	if cfg.Mode != netns.Broker {
		return nil
	}
	proxy := fmt.Sprintf("http://%s:%d", netns.GatewayAddr, cfg.BrokerPort)
	return []string{
		"HTTP_PROXY=" + proxy, "HTTPS_PROXY=" + proxy,
		"http_proxy=" + proxy, "https_proxy=" + proxy,
	}
}

// ID identifies the sandbox in its state directory and network namespace.
func (s *Sandbox) ID() string { return s.id }

// Hello is what the guest init reported when it came up.
func (s *Sandbox) Hello() vsockproto.Hello { return s.hello }

// Network is the sandbox's namespace: its broker listener and drop counters.
func (s *Sandbox) Network() *netns.Network { return s.network }

// Timings are the sandbox's boot phases.
func (s *Sandbox) Timings() BootTimings { return s.timings }

// Exec runs req in the guest, streaming its output to stdout and stderr
// (nil discards) and feeding it stdin (nil is empty).
func (s *Sandbox) Exec(ctx context.Context, req vsockproto.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (vsockproto.ExitStatus, error) {
	if err := req.Validate(); err != nil {
		return vsockproto.ExitStatus{}, err
	}
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	req.Env = append(slices.Clone(s.env), req.Env...)
	st, err := s.client.Exec(ctx, req, stdin, stdout, stderr)
	if err != nil {
		return st, s.explain(fmt.Errorf("sandbox: exec: %w", err))
	}
	return st, nil
}

// Start starts req in the guest and returns at once; the caller must Wait
// for the process. Stdout and stderr (nil discards) receive the output as it
// streams, with backpressure: a slow writer slows the guest process down.
func (s *Sandbox) Start(ctx context.Context, req vsockproto.ExecRequest, stdout, stderr io.Writer) (*vsockproto.Process, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	req.Env = append(slices.Clone(s.env), req.Env...)
	p, err := s.client.Start(ctx, req, stdout, stderr)
	if err != nil {
		return nil, s.explain(fmt.Errorf("sandbox: exec: %w", err))
	}
	return p, nil
}

// WriteFile writes r to path in the guest.
func (s *Sandbox) WriteFile(ctx context.Context, req vsockproto.FileRequest, r io.Reader) error {
	if err := s.client.WriteFile(ctx, req, r); err != nil {
		return s.explain(fmt.Errorf("sandbox: write %s: %w", req.Path, err))
	}
	return nil
}

// ReadFile copies path in the guest to w.
func (s *Sandbox) ReadFile(ctx context.Context, req vsockproto.FileRequest, w io.Writer) error {
	if err := s.client.ReadFile(ctx, req, w); err != nil {
		return s.explain(fmt.Errorf("sandbox: read %s: %w", req.Path, err))
	}
	return nil
}

// vmExitGrace bounds how long a failed operation waits for the VMM's exit
// to explain it: a VMM the kernel killed drops its connection to the guest
// moments before it is reaped.
const vmExitGrace = 2 * time.Second

// explain marks errors caused by the VM having gone away, with why where
// the host can tell.
func (s *Sandbox) explain(err error) error {
	var guestErr *vsockproto.GuestError
	if errors.As(err, &guestErr) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// The guest answered, or the caller gave up: the VM may well live.
		select {
		case <-s.machine.Done():
		default:
			return err
		}
	}
	select {
	case <-s.machine.Done():
	case <-time.After(vmExitGrace):
		return err
	}
	if cause := s.StopCause(); cause != nil {
		return fmt.Errorf("%w (the VM is gone: %w)", err, cause)
	}
	return fmt.Errorf("%w (the VM is gone)", err)
}

// Done is closed when the VM has stopped, for whatever reason.
func (s *Sandbox) Done() <-chan struct{} { return s.machine.Done() }

// Destroy kills the VM and removes everything the sandbox created. It is
// idempotent and safe to call concurrently with other operations, which then
// fail.
func (s *Sandbox) Destroy() error {
	s.destroyOnce.Do(func() {
		var errs []error
		s.client.Close()
		if err := s.machine.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close VM: %w", err))
		}
		if s.cgroup != nil {
			if err := s.cgroup.Remove(); err != nil {
				errs = append(errs, err)
			}
		}
		if err := s.network.Close(); err != nil {
			errs = append(errs, err)
		}
		if err := os.RemoveAll(s.dir); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", s.dir, err))
		}
		s.lock.Close()
		s.m.unregister(s.id)
		if len(errs) > 0 {
			s.destroyErr = fmt.Errorf("sandbox %s: destroy: %w", s.id, errors.Join(errs...))
		}
	})
	return s.destroyErr
}

// Shutdown destroys every sandbox of this manager and refuses new ones.
func (m *Manager) Shutdown() error {
	m.mu.Lock()
	m.draining = true
	var all []*Sandbox
	for _, sb := range m.live {
		if sb != nil {
			all = append(all, sb)
		}
	}
	m.mu.Unlock()
	var errs []error
	for _, sb := range all {
		errs = append(errs, sb.Destroy())
	}
	return errors.Join(errs...)
}

func (m *Manager) register(id string, sb *Sandbox) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.draining {
		return errors.New("sandbox: manager is shutting down")
	}
	m.live[id] = sb
	return nil
}

func (m *Manager) unregister(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.live, id)
}

// isLive reports whether id is a sandbox of this manager, running or being
// created.
func (m *Manager) isLive(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.live[id]
	return ok
}

// makeOwnedDir creates dir with its ownership lock held. The lock marks the
// sandbox as owned by a live process: Reconcile, in this or another process,
// only sweeps directories whose lock it can take, and the kernel drops the
// lock when its owner dies, however it dies. The manager-wide lock, shared
// here and exclusive in Reconcile, keeps a sweep from taking the lock of a
// directory between its mkdir and its owner's flock.
func (m *Manager) makeOwnedDir(dir string) (*os.File, error) {
	all, err := m.lockAll(flock.Shared)
	if err != nil {
		return nil, err
	}
	defer all.Close()
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("sandbox: create dir: %w", err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return lock, nil
}

// lockAll takes the manager-wide lock in mode, waiting for it; closing the
// file releases it.
func (m *Manager) lockAll(mode flock.Mode) (*os.File, error) {
	f, err := flock.Lock(filepath.Join(m.dir, ".lock"), mode)
	if err != nil {
		return nil, fmt.Errorf("sandbox: state %w", err)
	}
	return f, nil
}

// lockDir takes the exclusive ownership lock of the sandbox directory dir
// for the life of the returned file, without waiting: while a live owner
// holds it, the error wraps flock.ErrHeld.
func lockDir(dir string) (*os.File, error) {
	f, err := flock.TryLock(filepath.Join(dir, "lock"), flock.Exclusive)
	if err != nil {
		return nil, fmt.Errorf("sandbox: ownership %w", err)
	}
	return f, nil
}
