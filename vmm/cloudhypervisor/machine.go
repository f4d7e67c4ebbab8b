package cloudhypervisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ephemeralhq/ephemeral/vmm"
	"github.com/ephemeralhq/ephemeral/vmm/cloudhypervisor/chapi"
	"github.com/ephemeralhq/ephemeral/vmm/internal/vmproc"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// vmmLogTailSize bounds what is kept of the VMM's own log on stderr; the
// guest serial port gets vmproc.ConsoleTailSize.
const vmmLogTailSize = 16 << 10

// Retry pacing of DialGuest while the guest init is not yet listening.
const (
	dialAttemptTimeout = 2 * time.Second
	dialBackoffMax     = 100 * time.Millisecond
)

// machine is one cloud-hypervisor process and the VM it runs.
type machine struct {
	proc      *vmproc.Process
	api       *chapi.Client
	apiSock   string
	vsockSock string
	pidFile   string
	// snapshotDir is a clone's copy of its template's snapshot; "" for
	// other machines.
	snapshotDir string
	console     *vmproc.TailBuffer
	vmmLog      *vmproc.TailBuffer
	timings     vmm.Timings

	closeOnce sync.Once
	closeErr  error
}

// launch starts the VMM with its API socket in dir, in group unless it is
// nil (no VM exists before the API creates one). The returned machine owns
// the process; kill or Close ends it.
func launch(binary, dir string, group vmm.Cgroup) (*machine, error) {
	m := &machine{
		apiSock:   filepath.Join(dir, apiSocketName),
		vsockSock: filepath.Join(dir, vsockSocketName),
		pidFile:   filepath.Join(dir, pidFileName),
		console:   vmproc.NewTailBuffer(vmproc.ConsoleTailSize),
		vmmLog:    vmproc.NewTailBuffer(vmmLogTailSize),
	}
	m.api = chapi.NewClient(m.apiSock)
	// The VMM refuses to bind over existing socket files, such as those a
	// killed predecessor left.
	if err := m.removeFiles(); err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, "--api-socket", "path="+m.apiSock)
	cmd.Stdout = m.console // serial mode Tty writes the guest's ttyS0 here
	cmd.Stderr = m.vmmLog
	cmd.WaitDelay = pipeDrainTimeout
	proc, err := vmproc.Start(cmd, group)
	if err != nil {
		return nil, fmt.Errorf("launch %s: %w", binary, err)
	}
	m.proc = proc
	m.timings.Launched = proc.Launched()
	if err := os.WriteFile(m.pidFile, []byte(strconv.Itoa(proc.Pid())), 0o644); err != nil {
		m.kill()
		return nil, fmt.Errorf("launch %s: record pid: %w", binary, err)
	}
	return m, nil
}

// kill ends the VMM's process group, waits until the VMM is reaped and
// removes the VM directory's files.
func (m *machine) kill() error {
	m.proc.Kill()
	m.proc.Wait()
	return m.removeFiles()
}

// boot brings the VM from nothing to running.
func (m *machine) boot(ctx context.Context, cfg vmm.Config) error {
	if err := m.waitForAPI(ctx); err != nil {
		return err
	}
	if err := m.api.Create(ctx, vmConfig(cfg, m.vsockSock)); err != nil {
		return err
	}
	if cfg.Tap != nil {
		if _, err := m.api.AddNet(ctx, netConfig(cfg), cfg.Tap); err != nil {
			return err
		}
	}
	if err := m.expectState(ctx, chapi.StateCreated); err != nil {
		return err
	}
	if err := m.api.Boot(ctx); err != nil {
		return err
	}
	if err := m.expectState(ctx, chapi.StateRunning); err != nil {
		return err
	}
	m.timings.Running = time.Now()
	return nil
}

// waitForAPI polls vmm.ping until the VMM answers, giving up early if the
// process exits.
func (m *machine) waitForAPI(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, apiReadyTimeout)
	defer cancel()
	probe := chapi.NewClient(m.apiSock)
	probe.CallTimeout = pingTimeout
	backoff := 2 * time.Millisecond
	for {
		_, err := probe.Ping(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-m.proc.Done():
			return errors.New("wait for API socket: the VMM exited first")
		case <-ctx.Done():
			return fmt.Errorf("wait for API socket: %w (last ping: %v)", ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 50*time.Millisecond)
	}
}

// expectState checks vm.info against the state the last call should have
// produced.
func (m *machine) expectState(ctx context.Context, want chapi.VMState) error {
	info, err := m.api.Info(ctx)
	if err != nil {
		return err
	}
	if info.State != want {
		return fmt.Errorf("vm.info: state %s, want %s", info.State, want)
	}
	return nil
}

// explain adds the VMM's exit status and the end of its log to err once
// the VMM is gone: a VMM that died mid-call is usually the real cause.
func (m *machine) explain(err error) error {
	select {
	case <-m.proc.Done():
	default:
		return err
	}
	var detail strings.Builder
	if !m.proc.Killed() {
		status := "exit status 0"
		if waitErr := m.proc.Wait(); waitErr != nil {
			status = waitErr.Error()
		}
		fmt.Fprintf(&detail, "; the VMM ended: %s", status)
	}
	if log := vmproc.PrintableTail(m.vmmLog.String()); log != "" {
		fmt.Fprintf(&detail, "; VMM log:\n%s", log)
	}
	if detail.Len() == 0 {
		return err
	}
	return fmt.Errorf("%w%s", err, detail.String())
}

// DialGuest implements vmm.Machine.
func (m *machine) DialGuest(ctx context.Context) (net.Conn, error) {
	backoff := 5 * time.Millisecond
	for {
		attempt, cancel := context.WithTimeout(ctx, dialAttemptTimeout)
		conn, err := vsockproto.DialHybrid(attempt, m.vsockSock, vsockproto.Port)
		cancel()
		if err == nil {
			return conn, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("cloud-hypervisor: dial guest port %d: %w (last attempt: %v)", vsockproto.Port, ctx.Err(), err)
		case <-m.proc.Done():
			return nil, m.explain(fmt.Errorf("cloud-hypervisor: dial guest port %d: the VMM exited", vsockproto.Port))
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, dialBackoffMax)
	}
}

// PID implements vmm.Machine.
func (m *machine) PID() int { return m.proc.Pid() }

// Timings implements vmm.Machine.
func (m *machine) Timings() vmm.Timings { return m.timings }

// Console implements vmm.Machine.
func (m *machine) Console() string { return m.console.String() }

// Done implements vmm.Machine.
func (m *machine) Done() <-chan struct{} { return m.proc.Done() }

// Close implements vmm.Machine. It asks the VMM to shut down, which lets it
// release the VM's devices itself, and kills the process group when it
// does not comply promptly.
func (m *machine) Close() error {
	m.closeOnce.Do(func() {
		m.requestShutdown()
		if err := m.kill(); err != nil {
			m.closeErr = fmt.Errorf("cloud-hypervisor: close: %w", err)
		}
	})
	return m.closeErr
}

// requestShutdown sends vmm.shutdown and waits briefly for the exit.
func (m *machine) requestShutdown() {
	select {
	case <-m.proc.Done():
		return
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), shutdownVMMTimeout)
	defer cancel()
	if err := m.api.ShutdownVMM(ctx); err != nil {
		return // the kill that follows does the job
	}
	select {
	case <-m.proc.Done():
	case <-ctx.Done():
	}
}

// removeFiles deletes what the driver and the VMM create in the VM's
// directory.
func (m *machine) removeFiles() error {
	var errs []error
	for _, p := range []string{m.apiSock, m.vsockSock, m.pidFile} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if m.snapshotDir != "" {
		errs = append(errs, os.RemoveAll(m.snapshotDir))
	}
	return errors.Join(errs...)
}
