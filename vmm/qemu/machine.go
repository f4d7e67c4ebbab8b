package qemu

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ephemeralhq/ephemeral/vmm"
	"github.com/ephemeralhq/ephemeral/vmm/internal/vmproc"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// machine is one QEMU process.
type machine struct {
	dir      string
	proc     *vmproc.Process
	vsockCID uint32 // 0: the guest channel is virtio-serial
	// incomingFD is the descriptor number of a clone's saved state in
	// QEMU, for migrate-incoming; 0 for other machines.
	incomingFD int
	console    *vmproc.TailBuffer
	timings    vmm.Timings

	closeOnce sync.Once
	closeErr  error
}

var _ vmm.Machine = (*machine)(nil)

// PID implements vmm.Machine.
func (m *machine) PID() int { return m.proc.Pid() }

// Timings implements vmm.Machine.
func (m *machine) Timings() vmm.Timings { return m.timings }

// Console implements vmm.Machine: the tail of the serial console and of
// QEMU's stderr, interleaved as written.
func (m *machine) Console() string { return m.console.String() }

// Done implements vmm.Machine.
func (m *machine) Done() <-chan struct{} { return m.proc.Done() }

// Close implements vmm.Machine. It is idempotent, and concurrent calls all
// return once the process is gone.
func (m *machine) Close() error {
	m.closeOnce.Do(func() {
		m.proc.Kill()
		m.proc.Wait()
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

// exitError describes QEMU's exit; call it only after Done is closed.
func (m *machine) exitError() error {
	return fmt.Errorf("qemu exited (%v); console:\n%s", m.proc.Wait(), vmproc.PrintableTail(m.console.String()))
}

// DialGuest implements vmm.Machine. Over virtio-serial the connection is
// made at once (QEMU holds the port open) and the guest speaks when it is
// up; over vsock it is retried until the guest listens. Only one
// connection to the guest may be open at a time.
func (m *machine) DialGuest(ctx context.Context) (net.Conn, error) {
	select {
	case <-m.Done():
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
		case <-m.Done():
			return nil, fmt.Errorf("qemu: dial guest vsock cid %d: %w", m.vsockCID, m.exitError())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}
