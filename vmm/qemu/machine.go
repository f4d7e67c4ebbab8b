package qemu

import (
	"context"
	"errors"
	"fmt"
	"github.com/ephemeralhq/ephemeral/vmm/internal/vmproc"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeralhq/ephemeral/vmm"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// machine is one QEMU process. Its run goroutine is started by Start and
// waited for by Close.
type machine struct {
	dir      string
	cmd      *exec.Cmd
	vsockCID uint32 // 0: the guest channel is virtio-serial
	console  *vmproc.TailBuffer
	timings  vmm.Timings

	// done is closed by run once QEMU has exited and been reaped; exitErr
	// is set before.
	done    chan struct{}
	exitErr error

	// mu orders Close's kill against run's reaping: while exited is false
	// the QEMU process (at worst a zombie) still holds its pid, so its
	// process group id cannot have been reused by a stranger.
	mu     sync.Mutex
	exited bool

	closeOnce sync.Once
	closeErr  error
}

var _ vmm.Machine = (*machine)(nil)

// run starts QEMU, reports the outcome on started, then waits for QEMU
// to exit and closes done. Close waits for it.
//
// It holds its OS thread from start to exit because Pdeathsig fires when
// the forking thread ends, not the daemon: had any goroutine started QEMU,
// the thread could later be retired (a goroutine that exits while locked
// to it, as network namespace code does) and kill a healthy VM.
func (m *machine) run(started chan<- error) {
	defer close(m.done)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := m.cmd.Start(); err != nil {
		m.exitErr = err
		started <- err
		return
	}
	m.timings.Launched = time.Now()
	started <- nil

	pid := m.cmd.Process.Pid
	// Wait for the exit without reaping (WNOWAIT), so the pid stays ours
	// while the rest of the group is killed under mu.
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			break
		}
	}
	m.mu.Lock()
	// Anything QEMU left behind in its group goes with it.
	syscall.Kill(-pid, syscall.SIGKILL)
	m.exited = true
	m.mu.Unlock()
	m.exitErr = m.cmd.Wait()
}

// PID implements vmm.Machine.
func (m *machine) PID() int { return m.cmd.Process.Pid }

// Timings implements vmm.Machine.
func (m *machine) Timings() vmm.Timings { return m.timings }

// Console implements vmm.Machine: the tail of the serial console and of
// QEMU's stderr, interleaved as written.
func (m *machine) Console() string { return m.console.String() }

// Done implements vmm.Machine.
func (m *machine) Done() <-chan struct{} { return m.done }

// Close implements vmm.Machine. It is idempotent, and concurrent calls all
// return once the process is gone.
func (m *machine) Close() error {
	m.closeOnce.Do(func() {
		m.mu.Lock()
		if !m.exited {
			// The whole group: QEMU and anything it spawned.
			syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
		}
		m.mu.Unlock()
		<-m.done
		m.closeErr = m.removeFiles()
	})
	return m.closeErr
}

// removeFiles deletes the sockets and pid file the driver puts in dir.
func (m *machine) removeFiles() error {
	var errs []error
	for _, name := range []string{qmpSocketName, guestSocketName, pidFileName} {
		if err := os.Remove(filepath.Join(m.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("qemu: remove files: %w", err)
	}
	return nil
}

// exitError describes QEMU's exit; call it only after done is closed.
func (m *machine) exitError() error {
	return fmt.Errorf("qemu exited (%v); console:\n%s", m.exitErr, vmproc.PrintableTail(m.console.String()))
}

// DialGuest implements vmm.Machine. Over virtio-serial the connection is
// made at once (QEMU holds the port open) and the guest speaks when it is
// up; over vsock it is retried until the guest listens. Only one
// connection to the guest may be open at a time.
func (m *machine) DialGuest(ctx context.Context) (net.Conn, error) {
	select {
	case <-m.done:
		return nil, fmt.Errorf("qemu: dial guest: %w", m.exitError())
	default:
	}
	if m.vsockCID == 0 {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "unix", filepath.Join(m.dir, guestSocketName))
		if err != nil {
			return nil, fmt.Errorf("qemu: dial guest serial port: %w", err)
		}
		return conn, nil
	}
	return m.dialVsock(ctx)
}

// dialVsock retries until the guest init listens on its port: until then
// the guest kernel refuses (or has no vsock transport yet).
func (m *machine) dialVsock(ctx context.Context) (net.Conn, error) {
	backoff := 10 * time.Millisecond
	for {
		conn, err := vsockproto.DialVsock(ctx, m.vsockCID, vsockproto.Port)
		if err == nil {
			return conn, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("qemu: dial guest vsock cid %d: %w (last: %v)", m.vsockCID, ctx.Err(), err)
		case <-m.done:
			return nil, fmt.Errorf("qemu: dial guest vsock cid %d: %w", m.vsockCID, m.exitError())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}
