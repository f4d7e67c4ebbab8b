package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeralhq/ephemeral/vmm"
	"github.com/ephemeralhq/ephemeral/vmm/qemu/internal/qmp"
)

// How a template is saved and a clone restored, with QEMU's migration to
// and from a file, keeping every part of the confinement (-sandbox
// spawn=deny rules out exec: migration; fd: needs nothing QEMU cannot do
// confined):
//
//   - The template boots with its RAM in a memfd the driver creates,
//     allocates in full (see allocate) and QEMU maps shared. Once the
//     guest init waits for its host, the driver
//     stops the guest and migrates it into a second memfd with
//     x-ignore-shared, which leaves shared RAM out of the stream: the
//     stream is the device state (tens of KiB), the RAM is already in the
//     first memfd. QEMU is then killed and both memfds sealed against
//     writes, growing and shrinking, for good.
//   - A clone maps the RAM memfd private: it reads the template's pages,
//     which the kernel shares between all clones, and gets a copy of each
//     page it writes. It loads the device state and continues. Its QEMU
//     holds the memfd open read-write (QEMU opens the file itself), but
//     the seals make every write to the shared pages fail, also for a
//     QEMU a guest took over.
//
// Snapshot and Restore use the virtio-serial channel even where the host
// has vhost-vsock, whose saved state names a guest CID.
const (
	// ignoreShared is the migration capability that leaves shared RAM
	// out of the stream.
	ignoreShared = "x-ignore-shared"
	// snapshotFDName names the state memfd handed to the template's QEMU.
	snapshotFDName = "snapshot"
	// migrationPoll paces the polls of a migration or of the guest port.
	migrationPoll = 5 * time.Millisecond
)

// template is a saved QEMU machine: RAM and device state in sealed memfds.
type template struct {
	cfg   vmm.Config
	ram   *os.File
	state *os.File

	closeOnce sync.Once
	closeErr  error
}

var _ vmm.Template = (*template)(nil)

// Config implements vmm.Template. Its Tap and Cgroup, if any, were the
// template's at boot and may be gone since; only whether there was a Tap
// matters.
func (t *template) Config() vmm.Config { return t.cfg }

// Close implements vmm.Template: the memfds go once no clone maps them.
func (t *template) Close() error {
	t.closeOnce.Do(func() {
		t.closeErr = errors.Join(t.ram.Close(), t.state.Close())
	})
	return t.closeErr
}

var _ vmm.Snapshotter = (*Driver)(nil)

// Snapshot implements vmm.Snapshotter.
func (d *Driver) Snapshot(ctx context.Context, cfg vmm.Config) (_ vmm.Template, err error) {
	ram, err := newMemfd("ephemeral-template-ram", int64(cfg.MemoryMiB)<<20)
	if err != nil {
		return nil, err
	}
	if err := allocate(ram); err != nil {
		ram.Close()
		return nil, err
	}
	state, err := newMemfd("ephemeral-template-state", 0)
	if err != nil {
		ram.Close()
		return nil, err
	}
	t := &template{cfg: cfg, ram: ram, state: state}
	defer func() {
		if err != nil {
			t.Close()
		}
	}()

	m, client, err := d.launch(ctx, cfg, boot{ram: ram, ramShared: true})
	if err != nil {
		return nil, err
	}
	defer m.Close()
	defer client.Close()
	if err := m.run(ctx, client); err != nil {
		return nil, err
	}
	if err := m.waitGuestPortOpen(ctx, client); err != nil {
		return nil, err
	}
	if err := m.migrateOut(ctx, client, state); err != nil {
		return nil, err
	}
	// The seals need QEMU's shared, writable mapping of the RAM gone.
	client.Close()
	if err := m.Close(); err != nil {
		return nil, err
	}
	if err := errors.Join(seal(ram), seal(state)); err != nil {
		return nil, err
	}
	return t, nil
}

// waitGuestPortOpen returns once the guest has opened its end of the
// virtio-serial port: the init has booted and waits for its host, which has
// not connected (nobody ever connects to a template).
func (m *machine) waitGuestPortOpen(ctx context.Context, client *qmp.Client) error {
	for {
		chardevs, err := client.QueryChardevs(ctx)
		if err != nil {
			return m.startError(ctx, err)
		}
		for _, c := range chardevs {
			if c.Label == guestChardevID && c.FrontendOpen {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("qemu: snapshot: wait for the guest init: %w", ctx.Err())
		case <-m.Done():
			return m.exitError()
		case <-time.After(migrationPoll):
		}
	}
}

// migrateOut stops the guest and writes its device state to state.
func (m *machine) migrateOut(ctx context.Context, client *qmp.Client, state *os.File) error {
	if err := client.Stop(ctx); err != nil {
		return fmt.Errorf("qemu: snapshot: %w", err)
	}
	if err := client.SetMigrationCapability(ctx, ignoreShared, true); err != nil {
		return fmt.Errorf("qemu: snapshot: %w", err)
	}
	if err := client.GetFD(ctx, snapshotFDName, state); err != nil {
		return fmt.Errorf("qemu: snapshot: %w", err)
	}
	if err := client.Execute(ctx, "migrate", map[string]string{"uri": "fd:" + snapshotFDName}, nil); err != nil {
		return fmt.Errorf("qemu: snapshot: %w", err)
	}
	if err := m.waitMigration(ctx, client); err != nil {
		return fmt.Errorf("qemu: snapshot: %w", err)
	}
	return nil
}

// waitMigration polls until the migration in either direction completed.
func (m *machine) waitMigration(ctx context.Context, client *qmp.Client) error {
	for {
		st, err := client.QueryMigrate(ctx)
		if err != nil {
			return m.startError(ctx, err)
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %q", st.Status, st.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for migration (%q): %w", st.Status, ctx.Err())
		case <-m.Done():
			return m.exitError()
		case <-time.After(migrationPoll):
		}
	}
}

// Restore implements vmm.Snapshotter.
func (d *Driver) Restore(ctx context.Context, tv vmm.Template, cfg vmm.Config) (vmm.Machine, error) {
	t, ok := tv.(*template)
	if !ok {
		return nil, fmt.Errorf("qemu: restore: template %T is not QEMU's", tv)
	}
	if err := t.cfg.CheckClone(cfg); err != nil {
		return nil, fmt.Errorf("qemu: restore: %w", err)
	}
	// A description of the state of its own: clones read it from the
	// start, however many do so at once.
	state, err := os.Open("/proc/self/fd/" + strconv.Itoa(int(t.state.Fd())))
	if err != nil {
		return nil, fmt.Errorf("qemu: restore: open the saved state: %w", err)
	}
	defer state.Close()
	m, client, err := d.launch(ctx, cfg, boot{ram: t.ram, incoming: state})
	if err != nil {
		return nil, err
	}
	defer client.Close()
	if err := m.migrateIn(ctx, client); err != nil {
		m.Close()
		return nil, err
	}
	if err := m.run(ctx, client); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// migrateIn loads the template's device state into the paused clone.
func (m *machine) migrateIn(ctx context.Context, client *qmp.Client) error {
	if err := client.SetMigrationCapability(ctx, ignoreShared, true); err != nil {
		return fmt.Errorf("qemu: restore: %w", err)
	}
	uri := "fd:" + strconv.Itoa(m.incomingFD)
	if err := client.Execute(ctx, "migrate-incoming", map[string]string{"uri": uri}, nil); err != nil {
		return fmt.Errorf("qemu: restore: %w", err)
	}
	if err := m.waitMigration(ctx, client); err != nil {
		return fmt.Errorf("qemu: restore: %w", err)
	}
	return nil
}

// newMemfd creates a sealable memory file of size bytes.
func newMemfd(name string, size int64) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("qemu: memfd %s: %w", name, os.NewSyscallError("memfd_create", err))
	}
	f := os.NewFile(uintptr(fd), name)
	if err := f.Truncate(size); err != nil {
		f.Close()
		return nil, fmt.Errorf("qemu: memfd %s: %w", name, err)
	}
	return f, nil
}

// allocate gives every page of the memory file f its memory now, charged
// to the daemon's own cgroup: the template's RAM is the daemon's to hold,
// for as long as the template serves, whichever VMM wrote it. Left a hole,
// a page would be allocated in f by the first clone to write it (a private
// mapping's write fault reads the file's page before copying it), charged
// to that clone's cgroup on top of its copy, and kept in f until the
// template goes, charged to a group that may be long removed. Measured
// before this, 512 MiB guests: a clone writing 200 MiB the template never
// touched was charged 290 MiB of its own pages and 206 MiB of f's, and one
// filling 400 MiB passed its 768 MiB limit and was killed, where a booted
// guest runs in about 650 MiB.
func allocate(f *os.File) error {
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("qemu: allocate %s: %w", f.Name(), err)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, fi.Size()); err != nil {
		return fmt.Errorf("qemu: allocate %s: %w", f.Name(), os.NewSyscallError("fallocate", err))
	}
	return nil
}

// seal makes f immutable for every process that holds it, this one too.
func seal(f *os.File) error {
	const seals = unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		return fmt.Errorf("qemu: seal %s: %w", f.Name(), os.NewSyscallError("fcntl", err))
	}
	return nil
}
