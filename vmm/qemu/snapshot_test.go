package qemu

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeralhq/ephemeral/internal/testenv"
	"github.com/ephemeralhq/ephemeral/vmm"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// connectAndProvision dials m's guest, waits for its Hello and makes it
// unique, as the sandbox manager does before anything else.
func connectAndProvision(t *testing.T, ctx context.Context, m vmm.Machine) (*vsockproto.Client, vsockproto.Provisioned) {
	t.Helper()
	conn, err := m.DialGuest(ctx)
	if err != nil {
		t.Fatalf("DialGuest: %v", err)
	}
	client := vsockproto.NewClient(conn)
	t.Cleanup(func() { client.Close() })
	if _, err := client.Hello(ctx); err != nil {
		t.Fatalf("Hello: %v\nconsole:\n%s", err, m.Console())
	}
	var id [16]byte
	rand.Read(id[:])
	p := vsockproto.Provision{
		Entropy:     make([]byte, vsockproto.MinProvisionEntropy),
		Hostname:    "qemu-test-" + hex.EncodeToString(id[:3]),
		MachineID:   hex.EncodeToString(id[:]),
		ScratchName: "Q" + hex.EncodeToString(id[:3]),
		Time:        time.Now(),
	}
	rand.Read(p.Entropy)
	done, err := client.Provision(ctx, p)
	if err != nil {
		t.Fatalf("Provision: %v\nconsole:\n%s", err, m.Console())
	}
	return client, done
}

func shell(t *testing.T, ctx context.Context, client *vsockproto.Client, script string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	st, err := client.Exec(ctx, vsockproto.ExecRequest{Shell: script}, nil, &stdout, &stderr)
	if err != nil || st.Code != 0 {
		t.Fatalf("%s: %+v, %v; stderr %q", script, st, err, stderr.String())
	}
	return stdout.String()
}

// A template restores into clones that each greet their own host, run
// commands, share no kernel random state, and cannot change the template.
func TestSnapshotRestore(t *testing.T) {
	img := testenv.RequireVM(t)
	requireVMMUser(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	d := New("")
	tcfg := testConfig(t, img)
	tcfg.Tap = tapInThrowawayNamespace(t)
	tcfg.MAC = net.HardwareAddr{0x02, 0xe9, 0, 0, 0, 1}
	templateGroup := &recordingCgroup{}
	tcfg.Cgroup = templateGroup
	tmpl, err := d.Snapshot(ctx, tcfg)
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	defer tmpl.Close()
	if len(templateGroup.pids) != 1 {
		t.Errorf("the template's cgroup got pids %v, want its VMM's once", templateGroup.pids)
	}
	assertEmptyDir(t, tcfg.Dir)

	qt := tmpl.(*template)
	for _, f := range []*os.File{qt.ram, qt.state} {
		seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
		const want = unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
		if err != nil || seals&want != want {
			t.Errorf("%s seals = %#x, %v; want %#x", f.Name(), seals, err, want)
		}
		if _, err := f.WriteAt([]byte{1}, 0); err == nil {
			t.Errorf("%s: a write to the saved template succeeded", f.Name())
		}
	}

	type clone struct {
		m      vmm.Machine
		random string
	}
	var clones []clone
	for i := range 2 {
		cfg := testConfig(t, img)
		cfg.Tap = tapInThrowawayNamespace(t)
		cfg.MAC = net.HardwareAddr{0x02, 0xe9, 0, 0, 1, byte(i)}
		group := &recordingCgroup{}
		cfg.Cgroup = group
		m, err := d.Restore(ctx, tmpl, cfg)
		if err != nil {
			t.Fatalf("Restore %d: %v", i, err)
		}
		defer m.Close()
		if len(group.pids) != 1 || group.pids[0] != m.PID() {
			t.Errorf("clone %d: its cgroup got pids %v, want its VMM's %d once", i, group.pids, m.PID())
		}
		client, done := connectAndProvision(t, ctx, m)
		out := shell(t, ctx, client, "pwd; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'")
		lines := strings.Split(out, "\n")
		if len(lines) != 2 || lines[0] != done.ScratchDir {
			t.Fatalf("clone %d: pwd, random = %q; want the scratch dir %s first", i, out, done.ScratchDir)
		}
		clones = append(clones, clone{m, lines[1]})
		assertPrivateTemplateMapping(t, m.PID())
	}
	if clones[0].random == clones[1].random {
		t.Errorf("both clones read %s first from /dev/urandom", clones[0].random)
	}
	for _, c := range clones {
		dir := c.m.(*machine).dir
		pid := c.m.PID()
		if err := c.m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		assertGone(t, pid, dir)
	}

	mismatched := testConfig(t, img)
	mismatched.MemoryMiB = 256
	if m, err := d.Restore(ctx, tmpl, mismatched); err == nil || !strings.Contains(err.Error(), "256 MiB") {
		if m != nil {
			m.Close()
		}
		t.Errorf("Restore with another memory size = %v, want refused", err)
	}
}

// assertPrivateTemplateMapping checks that QEMU pid maps the template's
// RAM, and only privately: whatever the clone writes stays its own.
func assertPrivateTemplateMapping(t *testing.T, pid int) {
	t.Helper()
	maps, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, line := range strings.Split(string(maps), "\n") {
		if !strings.Contains(line, "ephemeral-template-ram") {
			continue
		}
		found = true
		if perms := strings.Fields(line)[1]; !strings.HasSuffix(perms, "p") {
			t.Errorf("template RAM mapped %s (not private): %s", perms, line)
		}
	}
	if !found {
		t.Errorf("QEMU %d does not map the template's RAM:\n%s", pid, maps)
	}
}

// Restoring fails cleanly when the template's state cannot be loaded.
func TestRestoreOfForeignTemplateFails(t *testing.T) {
	d := New("")
	if _, err := d.Restore(context.Background(), fakeTemplate{}, vmm.Config{}); err == nil || !strings.Contains(err.Error(), "not QEMU's") {
		t.Errorf("Restore of a foreign template = %v", err)
	}
}

// recordingCgroup records the pids it is given.
type recordingCgroup struct{ pids []int }

func (g *recordingCgroup) AddProcess(pid int) error {
	g.pids = append(g.pids, pid)
	return nil
}

type fakeTemplate struct{}

func (fakeTemplate) Config() vmm.Config { return vmm.Config{} }
func (fakeTemplate) Close() error       { return fmt.Errorf("not closable") }
