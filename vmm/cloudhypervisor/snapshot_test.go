package cloudhypervisor

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/vmm"
)

// cloneConfig is a clone of template's shape with a directory, id and tap
// of its own.
func cloneConfig(t *testing.T, template vmm.Config) vmm.Config {
	own := testConfig(t)
	cfg := template
	cfg.ID, cfg.Dir, cfg.Tap = own.ID, own.Dir, own.Tap
	return cfg
}

// A template is the VMM's snapshot of a booted VM; each clone restores a
// copy of it that names its own vsock socket, gets its own tap, and serves
// its own guest connection.
func TestSnapshotRestore(t *testing.T) {
	driver := New(fakeVMM(t))
	ctx := context.Background()
	tcfg := testConfig(t)
	templateGroup := &recordingCgroup{}
	tcfg.Cgroup = templateGroup
	tmpl, err := driver.Snapshot(ctx, tcfg)
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	if len(templateGroup.pids) != 1 {
		t.Errorf("the template's cgroup got pids %v, want its VMM's once", templateGroup.pids)
	}
	snapDir := filepath.Join(tcfg.Dir, snapshotDirName)
	for _, name := range []string{"config.json", "state.json", "memory-ranges"} {
		if _, err := os.Stat(filepath.Join(snapDir, name)); err != nil {
			t.Errorf("snapshot lacks %s: %v", name, err)
		}
	}
	assertNoFilesLeft(t, tcfg.Dir)

	for i := range 2 {
		cfg := cloneConfig(t, tcfg)
		group := &recordingCgroup{}
		cfg.Cgroup = group
		m, err := driver.Restore(ctx, tmpl, cfg)
		if err != nil {
			t.Fatalf("Restore %d: %v", i, err)
		}
		if len(group.pids) != 1 || group.pids[0] != m.PID() {
			t.Errorf("clone %d: its cgroup got pids %v, want its VMM's %d once", i, group.pids, m.PID())
		}
		tapSeen, err := os.ReadFile(cfg.Tap.Name())
		if err != nil || string(tapSeen) != "fakech: tap queue restored\n" {
			t.Errorf("clone %d: tap file holds %q (%v): its tap did not reach vm.restore", i, tapSeen, err)
		}
		clonedConfig, err := os.ReadFile(filepath.Join(cfg.Dir, snapshotDirName, configFileName))
		if err != nil {
			t.Fatal(err)
		}
		var vc struct {
			Vsock struct {
				Socket string `json:"socket"`
			} `json:"vsock"`
		}
		if err := json.Unmarshal(clonedConfig, &vc); err != nil || vc.Vsock.Socket != filepath.Join(cfg.Dir, vsockSocketName) {
			t.Errorf("clone %d: config names vsock socket %q (%v), want its own", i, vc.Vsock.Socket, err)
		}

		conn, err := m.DialGuest(ctx)
		if err != nil {
			t.Fatalf("clone %d: DialGuest: %v", i, err)
		}
		if _, err := conn.Write([]byte("hi")); err != nil {
			t.Fatal(err)
		}
		echo := make([]byte, 2)
		if _, err := io.ReadFull(conn, echo); err != nil || string(echo) != "hi" {
			t.Errorf("clone %d: guest echoed %q, %v", i, echo, err)
		}
		conn.Close()
		if err := m.Close(); err != nil {
			t.Errorf("clone %d: Close: %v", i, err)
		}
		assertNoFilesLeft(t, cfg.Dir)
		if _, err := os.Stat(filepath.Join(cfg.Dir, snapshotDirName)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("clone %d: its snapshot copy outlived Close (%v)", i, err)
		}
	}

	mismatched := cloneConfig(t, tcfg)
	mismatched.VCPUs = 2
	if m, err := driver.Restore(ctx, tmpl, mismatched); err == nil || !strings.Contains(err.Error(), "2 vcpus") {
		if m != nil {
			m.Close()
		}
		t.Errorf("Restore with another vCPU count = %v, want refused", err)
	}

	if err := tmpl.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(snapDir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the snapshot outlived Close (%v)", err)
	}
}

// A VMM that cannot restore the snapshot ends, and nothing of the clone is
// left.
func TestRestoreFailureLeavesNothing(t *testing.T) {
	driver := New(fakeVMM(t))
	ctx := context.Background()
	tcfg := testConfig(t)
	tmpl, err := driver.Snapshot(ctx, tcfg)
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	defer tmpl.Close()
	t.Setenv("FAKECH_FAIL", "vm.restore=Failed to restore the VM state")
	cfg := cloneConfig(t, tcfg)
	m, err := driver.Restore(ctx, tmpl, cfg)
	if err == nil {
		m.Close()
		t.Fatal("Restore succeeded against a failing VMM")
	}
	if !strings.Contains(err.Error(), "Failed to restore the VM state") {
		t.Errorf("Restore error = %v, want the VMM's reason", err)
	}
	assertNoFilesLeft(t, cfg.Dir)
	if _, err := os.Stat(filepath.Join(cfg.Dir, snapshotDirName)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the failed clone's snapshot copy is left (%v)", err)
	}
}
