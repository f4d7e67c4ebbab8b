package cloudhypervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/ephemeralhq/ephemeral/internal/cleanup"
	"github.com/ephemeralhq/ephemeral/vmm"
	"github.com/ephemeralhq/ephemeral/vmm/cloudhypervisor/chapi"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// How a template is saved and a clone restored with Cloud Hypervisor:
//
//   - The template boots like any VM. Once the guest init prints that it
//     waits for its host (vsockproto.WaitingForHost) — nobody connects to a
//     template — the driver pauses the VM and has vm.snapshot write it into
//     <dir>/snapshot (config.json, state.json, memory-ranges), then ends the
//     VMM.
//   - A clone gets its own copy of that directory: config.json rewritten to
//     name the clone's own hybrid vsock socket, the other files hard links.
//     vm.restore loads it with the clone's tap passed as a descriptor for
//     the saved net device (net_fds), and vm.resume lets it run.
const (
	// configFileName is the snapshot's VM configuration, the one file a
	// clone's copy changes.
	configFileName = "config.json"
	// snapshotCallTimeout bounds vm.snapshot and vm.restore, which write
	// or read all of the guest's memory.
	snapshotCallTimeout = time.Minute
	// waitForHostPoll paces the look for the guest init's line.
	waitForHostPoll = 10 * time.Millisecond
)

// template is a snapshot directory.
type template struct {
	cfg vmm.Config
	dir string

	closeOnce sync.Once
	closeErr  error
}

var _ vmm.Template = (*template)(nil)

// Config implements vmm.Template. Its Tap and Cgroup, if any, were the
// template's at boot and may be gone since; only whether there was a Tap
// matters.
func (t *template) Config() vmm.Config { return t.cfg }

// Close implements vmm.Template: it removes the snapshot. Clones have
// loaded their memory at restore and do not need it.
func (t *template) Close() error {
	t.closeOnce.Do(func() {
		if err := os.RemoveAll(t.dir); err != nil {
			t.closeErr = fmt.Errorf("cloud-hypervisor: remove template: %w", err)
		}
	})
	return t.closeErr
}

var _ vmm.Snapshotter = (*Driver)(nil)

// Snapshot implements vmm.Snapshotter.
func (d *Driver) Snapshot(ctx context.Context, cfg vmm.Config) (vmm.Template, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("cloud-hypervisor: snapshot: %w", err)
	}
	dir := filepath.Join(cfg.Dir, snapshotDirName)
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("cloud-hypervisor: snapshot: %w", err)
	}
	m, err := launch(d.binary, cfg.Dir, cfg.Cgroup)
	if err != nil {
		return nil, fmt.Errorf("cloud-hypervisor: snapshot %s: %w", cfg.ID, err)
	}
	defer m.Close()
	if err := m.boot(ctx, cfg); err != nil {
		m.kill()
		return nil, fmt.Errorf("cloud-hypervisor: snapshot %s: %w", cfg.ID, m.explain(err))
	}
	if err := m.save(ctx, dir); err != nil {
		os.RemoveAll(dir)
		m.kill()
		return nil, fmt.Errorf("cloud-hypervisor: snapshot %s: %w", cfg.ID, m.explain(err))
	}
	if err := m.Close(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &template{cfg: cfg, dir: dir}, nil
}

// save waits for the guest init to wait for its host, pauses the VM and
// writes its snapshot into dir.
func (m *machine) save(ctx context.Context, dir string) error {
	if err := m.waitForHost(ctx); err != nil {
		return err
	}
	if err := m.api.Pause(ctx); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	api := chapi.NewClient(m.apiSock)
	api.CallTimeout = snapshotCallTimeout
	return api.Snapshot(ctx, "file://"+dir)
}

// waitForHost returns once the guest's console shows the init waiting for
// its host. The console is the guest's to write; only the template's
// guest, which runs nothing of anyone's, is read this way.
func (m *machine) waitForHost(ctx context.Context) error {
	for !strings.Contains(m.console.String(), vsockproto.WaitingForHost) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the guest init: %w", ctx.Err())
		case <-m.proc.Done():
			return errors.New("wait for the guest init: the VMM exited")
		case <-time.After(waitForHostPoll):
		}
	}
	return nil
}

// Restore implements vmm.Snapshotter.
func (d *Driver) Restore(ctx context.Context, tv vmm.Template, cfg vmm.Config) (vmm.Machine, error) {
	t, ok := tv.(*template)
	if !ok {
		return nil, fmt.Errorf("cloud-hypervisor: restore: template %T is not Cloud Hypervisor's", tv)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("cloud-hypervisor: restore: %w", err)
	}
	if err := t.cfg.CheckClone(cfg); err != nil {
		return nil, fmt.Errorf("cloud-hypervisor: restore: %w", err)
	}
	var undo cleanup.Stack
	defer undo.Run()
	m, err := launch(d.binary, cfg.Dir, cfg.Cgroup)
	if err != nil {
		return nil, fmt.Errorf("cloud-hypervisor: restore %s: %w", cfg.ID, err)
	}
	undo.AddErr(m.kill)
	m.snapshotDir = filepath.Join(cfg.Dir, snapshotDirName)
	if err := copySnapshot(t.dir, m.snapshotDir, m.vsockSock); err != nil {
		return nil, fmt.Errorf("cloud-hypervisor: restore %s: %w", cfg.ID, err)
	}
	if err := m.restore(ctx, cfg); err != nil {
		undo.Run() // the VMM's log is complete only once it is gone
		return nil, fmt.Errorf("cloud-hypervisor: restore %s: %w", cfg.ID, m.explain(err))
	}
	undo.Release()
	return m, nil
}

// restore loads the clone's snapshot copy with cfg's tap and lets it run.
func (m *machine) restore(ctx context.Context, cfg vmm.Config) error {
	if err := m.waitForAPI(ctx); err != nil {
		return err
	}
	rc := chapi.RestoreConfig{SourceURL: "file://" + m.snapshotDir}
	var taps []*os.File
	if cfg.Tap != nil {
		rc.NetFDs = []chapi.RestoredNet{{ID: netDeviceID, NumFDs: netQueuePairs}}
		taps = append(taps, cfg.Tap)
	}
	api := chapi.NewClient(m.apiSock)
	api.CallTimeout = snapshotCallTimeout
	if err := api.Restore(ctx, rc, taps...); err != nil {
		return err
	}
	if err := m.expectState(ctx, chapi.StatePaused); err != nil {
		return err
	}
	if err := m.api.Resume(ctx); err != nil {
		return err
	}
	if err := m.expectState(ctx, chapi.StateRunning); err != nil {
		return err
	}
	m.timings.Running = time.Now()
	return nil
}

// copySnapshot makes dst a clone's copy of the snapshot in src: the
// configuration names the clone's vsock socket, the rest are hard links
// (the VMM only reads them).
func copySnapshot(src, dst, vsockSocket string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return fmt.Errorf("copy snapshot: %w", err)
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return fmt.Errorf("copy snapshot: %w", err)
	}
	for _, e := range entries {
		from, to := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		if e.Name() == configFileName {
			err = rewriteConfig(from, to, vsockSocket)
		} else {
			err = os.Link(from, to)
		}
		if err != nil {
			return fmt.Errorf("copy snapshot: %w", err)
		}
	}
	return nil
}

// rewriteConfig copies the snapshot's VM configuration from to to with the
// vsock socket replaced, keeping every other field as the VMM wrote it.
func rewriteConfig(from, to, vsockSocket string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("%s: %w", from, err)
	}
	if raw, ok := cfg["vsock"]; ok && string(raw) != "null" {
		var vsock map[string]json.RawMessage
		if err := json.Unmarshal(raw, &vsock); err != nil {
			return fmt.Errorf("%s: vsock: %w", from, err)
		}
		vsock["socket"], _ = json.Marshal(vsockSocket)
		cfg["vsock"], _ = json.Marshal(vsock)
	}
	out, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	return os.WriteFile(to, out, 0o600)
}
