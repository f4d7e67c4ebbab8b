// Package sandbox is the host's handle on disposable microVMs: it boots one
// from the guest image with the machine's VMM, or restores a clone of a
// template booted once per image and shape (template.go), confines every
// VMM in a cgroup of its own and passes the guest its limits (confine.go),
// makes its guest unique (vsockproto.Provision), connects to the guest
// init, runs commands and file transfers in it, and destroys it so that
// nothing remains — no VMM process, socket, directory, cgroup or network
// namespace — also when the caller's context ends mid-boot or the daemon
// itself died. A Pool (pool.go) keeps sandboxes started for whoever takes
// one.
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
	// Start says whether the VM may be restored from a template or must
	// boot; the zero value restores where possible.
	Start Start
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
	driver vmm.Driver
	// stateDir holds the guest image, which currentImage follows; ""
	// keeps image.
	stateDir string
	dir      string // <state>/sandboxes
	logf     func(format string, args ...any)
	killer   leftoverKiller
	// coldStarts is Config.ColdStarts.
	coldStarts bool

	mu       sync.Mutex
	image    *image.Image        // guarded by mu
	live     map[string]*Sandbox // guarded by mu
	draining bool                // guarded by mu
	// pool, when set, refills as sandboxes go (guarded by mu).
	pool *Pool

	templates templates

	limits Limits
	// cgroups confines each VMM, templates' included; nil where the
	// host has none for it, noCgroups says why.
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
	// ColdStarts makes Create boot sandboxes unless asked to restore
	// them (Options.Start): a process that starts one sandbox and exits
	// would boot a template for nothing.
	ColdStarts bool
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
	return &Manager{
		driver:     driver,
		stateDir:   cfg.StateDir,
		image:      img,
		dir:        dir,
		logf:       logf,
		killer:     killLeftoverVMM,
		coldStarts: cfg.ColdStarts,
		live:       make(map[string]*Sandbox),
		templates:  newTemplates(),
		limits:     cfg.Limits.withDefaults(),
		cgroups:    cgroups,
		noCgroups:  noCgroups,
	}, nil
}

// Driver names the VMM in use.
func (m *Manager) Driver() string { return m.driver.Name() }

// Describe says how VMs run here, for logs and benchmarks: DescribeDriver's
// account and the VMMs' cgroup limits, e.g. "qemu (tcg; seccomp, runs as
// ephemeral-vmm in a chroot; cgroup v1: cpu quota, memory, tasks, I/O
// weight (blkio.weight))".
func (m *Manager) Describe() string { return describe(m.driver, m.describeCgroups()) }

// DescribeDriver says how the driver runs VMs on this host: the VMM, its
// accelerator and its confinement where the driver reports them, e.g.
// "qemu (tcg; seccomp, runs as ephemeral-vmm in a chroot)".
func DescribeDriver(driver vmm.Driver) string { return describe(driver) }

// describe is DescribeDriver's account of driver followed by more.
func describe(driver vmm.Driver, more ...string) string {
	var parts []string
	if d, ok := driver.(interface{ Accelerator() (string, error) }); ok {
		if acc, err := d.Accelerator(); err == nil {
			parts = append(parts, acc)
		}
	}
	if d, ok := driver.(interface{ Confinement() (string, error) }); ok {
		c, err := d.Confinement()
		if err != nil {
			c = "confinement unknown: " + err.Error()
		}
		parts = append(parts, c)
	}
	parts = append(parts, more...)
	if len(parts) == 0 {
		return driver.Name()
	}
	return driver.Name() + " (" + strings.Join(parts, "; ") + ")"
}

// Image is the guest image sandboxes start from.
func (m *Manager) Image() *image.Image {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.image
}

// BootTimings break one sandbox's start into phases.
type BootTimings struct {
	// Restored is set when the VM is a clone restored from a template;
	// Kernel and Init are then the template's boot, not this VM's.
	Restored bool
	// Pooled is set when the sandbox was taken from a Pool: it was
	// started (as the other fields say) before anyone asked for it.
	Pooled bool
	// Network is the creation of the network namespace, tap and firewall.
	Network time.Duration
	// VMMStart is from launching the VMM process to the VMM reporting
	// the VM running; for a clone it includes loading the saved state.
	VMMStart time.Duration
	// Hello is from the VMM reporting the VM running to the guest's
	// Hello: for a boot, everything the guest does before it serves
	// (firmware, kernel, init); for a clone, its waking up.
	Hello time.Duration
	// Kernel is the guest kernel's own boot, as its clock counts, up to
	// starting the init.
	Kernel time.Duration
	// Init is the guest init's work up to serving the host (mounts,
	// modules, overlay).
	Init time.Duration
	// Setup is provisioning the guest (vsockproto.Provision) and
	// configuring its network, after the Hello.
	Setup time.Duration
	// Ready is from Create's call to a guest ready for commands: what a
	// user waits.
	Ready time.Duration
}

// GuestCmdline is added to every guest's kernel command line. The kernel's
// crypto self-tests cost about 230 ms of each boot under TCG; the guest's
// kernel crypto guards nothing the host relies on, and the same kernel
// build is self-tested wherever it runs as a host.
const GuestCmdline = "cryptomgr.notests"

// Sandbox is one running microVM with its guest connection.
type Sandbox struct {
	id      string
	dir     string
	lock    *os.File
	network *netns.Network
	machine vmm.Machine
	client  *vsockproto.Client
	hello   vsockproto.Hello
	scratch string
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

// ErrShuttingDown is returned by Create once Shutdown has begun.
var ErrShuttingDown = errors.New("sandbox: manager is shutting down")

// Create starts a sandbox and waits until its guest init serves, made
// unique (vsockproto.Provision) and with its network configured. Where the
// driver can save VMs (vmm.Snapshotter) it restores a clone of the
// template of opts' shape, booting that template first if there is none;
// otherwise it boots the VM. opts.Start can insist on either. On error, or
// when ctx ends first, everything it had started is torn down.
func (m *Manager) Create(ctx context.Context, opts Options) (*Sandbox, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	began := time.Now()
	img, err := m.currentImage()
	if err != nil {
		return nil, err
	}
	id := sandboxid.New()
	vmCfg := m.vmConfig(img, opts, id, filepath.Join(m.dir, id))
	// Checked before anything is built; the tap joins once it exists.
	if err := errors.Join(vmCfg.Validate(), m.limits.Guest.Validate(opts.MemoryMiB)); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	start, err := m.startFunc(img, opts)
	if err != nil {
		return nil, err
	}
	return m.create(ctx, vmCfg, opts, began, start)
}

// vmConfig is the machine of the sandbox id whose directory is dir,
// without its network, which joins once it exists.
func (m *Manager) vmConfig(img *image.Image, opts Options, id, dir string) vmm.Config {
	return vmm.Config{
		ID:        id,
		Kernel:    img.Kernel,
		Initrd:    img.Initrd,
		RootDisk:  img.RootDisk,
		Cmdline:   GuestCmdline + " " + m.limits.Guest.Params(),
		VCPUs:     opts.VCPUs,
		MemoryMiB: opts.MemoryMiB,
		Dir:       filepath.Join(dir, "vm"),
	}
}

// startFunc starts a sandbox's VM: it boots, or restores a clone.
type startFunc func(ctx context.Context, cfg vmm.Config) (vmm.Machine, bool, error)

// boot starts cfg's VM by booting it.
func (m *Manager) boot(ctx context.Context, cfg vmm.Config) (vmm.Machine, bool, error) {
	machine, err := m.driver.Start(ctx, cfg)
	return machine, false, err
}

// create builds sandbox vmCfg.ID around the VM start starts: its
// directory, its network, the guest connection, provisioning and the
// guest's network.
func (m *Manager) create(ctx context.Context, vmCfg vmm.Config, opts Options, began time.Time, start startFunc) (*Sandbox, error) {
	id, dir := vmCfg.ID, filepath.Dir(vmCfg.Dir)
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
	machine, restored, err := start(ctx, vmCfg)
	if err != nil {
		return nil, fmt.Errorf("sandbox: start %s: %w", m.driver.Name(), err)
	}
	undo.AddErr(machine.Close)

	client, hello, err := connect(ctx, machine)
	if err != nil {
		return nil, fmt.Errorf("sandbox: connect to guest: %w\nguest console:\n%s", err, machine.Console())
	}
	helloAt := time.Now()
	undo.AddErr(client.Close)
	// Nothing else may reach the guest before it is unique: a clone
	// still has its template's random state, clock and names.
	provisioned, err := client.Provision(ctx, NewProvision())
	if err != nil {
		return nil, fmt.Errorf("sandbox: provision the guest: %w", err)
	}
	guestNet := network.GuestConfig()
	guestNet.MAC = network.MAC().String()
	if err := client.ConfigureNetwork(ctx, guestNet); err != nil {
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
		scratch: provisioned.ScratchDir,
		m:       m,
		timings: BootTimings{
			Restored: restored,
			Network:  netTook,
			VMMStart: vt.Running.Sub(vt.Launched),
			Hello:    helloAt.Sub(vt.Running),
			Kernel:   hello.KernelUptime - hello.InitDuration,
			Init:     hello.InitDuration,
			Setup:    time.Since(helloAt),
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

// Hello is what the guest init reported when it came up; a clone reports
// its template's boot.
func (s *Sandbox) Hello() vsockproto.Hello { return s.hello }

// ScratchDir is the worker's working directory in the guest,
// /tmp/ephemeral-run-<random>/scratch.
func (s *Sandbox) ScratchDir() string { return s.scratch }

// Network is the sandbox's namespace: its broker listener and drop counters.
func (s *Sandbox) Network() *netns.Network { return s.network }

// Timings are the sandbox's boot phases.
func (s *Sandbox) Timings() BootTimings { return s.timings }

// PID is the VMM's process id, for measuring what the VM costs the host.
func (s *Sandbox) PID() int { return s.machine.PID() }

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

// ListOutputs lists what matches a run's output patterns in the guest.
func (s *Sandbox) ListOutputs(ctx context.Context, req vsockproto.OutputsRequest) (vsockproto.OutputListing, error) {
	l, err := s.client.ListOutputs(ctx, req)
	if err != nil {
		return l, s.explain(fmt.Errorf("sandbox: list outputs: %w", err))
	}
	return l, nil
}

// ReadOutput copies an output file from the guest to w.
func (s *Sandbox) ReadOutput(ctx context.Context, req vsockproto.FileRequest, w io.Writer) error {
	if err := s.client.ReadOutput(ctx, req, w); err != nil {
		return s.explain(fmt.Errorf("sandbox: read output %s: %w", req.Path, err))
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

// Shutdown destroys every sandbox of this manager, its pool and its
// templates, and refuses new ones.
func (m *Manager) Shutdown() error {
	m.mu.Lock()
	pool := m.pool
	m.mu.Unlock()
	var errs []error
	if pool != nil {
		errs = append(errs, pool.Close())
	}
	m.mu.Lock()
	m.draining = true
	var all []*Sandbox
	for _, sb := range m.live {
		if sb != nil {
			all = append(all, sb)
		}
	}
	m.mu.Unlock()
	for _, sb := range all {
		errs = append(errs, sb.Destroy())
	}
	m.stopTemplates()
	return errors.Join(errs...)
}

func (m *Manager) register(id string, sb *Sandbox) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.draining {
		return ErrShuttingDown
	}
	m.live[id] = sb
	return nil
}

func (m *Manager) unregister(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.live, id)
	if m.pool != nil {
		m.pool.nudge() // room for a pooled sandbox, maybe
	}
}

// count is how many sandboxes the manager runs or is starting, pooled
// ones and templates being booted included.
func (m *Manager) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.live)
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
