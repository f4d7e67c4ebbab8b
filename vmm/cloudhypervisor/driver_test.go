package cloudhypervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeralhq/ephemeral/internal/sandboxid"
	"github.com/ephemeralhq/ephemeral/internal/testenv"
	"github.com/ephemeralhq/ephemeral/vmm"
	"github.com/ephemeralhq/ephemeral/vmm/cloudhypervisor/internal/chspec"
)

// fakeBinaryDir holds the fake cloud-hypervisor, built once per test run.
var (
	fakeBuildOnce sync.Once
	fakeBinaryDir string
	fakeBuildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if fakeBinaryDir != "" {
		os.RemoveAll(fakeBinaryDir)
	}
	os.Exit(code)
}

// fakeVMM builds internal/fakech as a binary named cloud-hypervisor and
// points it at the API description; it skips the test when the description
// is missing.
func fakeVMM(t testing.TB) string {
	t.Helper()
	t.Setenv("FAKECH_SPEC", testenv.SharedReference(t, chspec.FileName))
	fakeBuildOnce.Do(func() {
		fakeBinaryDir, fakeBuildErr = os.MkdirTemp("", "fakech")
		if fakeBuildErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", filepath.Join(fakeBinaryDir, DefaultBinary), "./internal/fakech").CombinedOutput()
		if err != nil {
			fakeBuildErr = fmt.Errorf("go build ./internal/fakech: %w\n%s", err, out)
		}
	})
	if fakeBuildErr != nil {
		t.Fatal(fakeBuildErr)
	}
	return filepath.Join(fakeBinaryDir, DefaultBinary)
}

// testConfig is a VM config whose files exist, with a regular file standing
// in for the tap.
func testConfig(t testing.TB) vmm.Config {
	t.Helper()
	images := t.TempDir()
	for _, name := range []string{"vmlinuz", "initrd", "root.ext4"} {
		if err := os.WriteFile(filepath.Join(images, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tap, err := os.OpenFile(filepath.Join(images, "tap"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tap.Close() })
	return vmm.Config{
		ID:        sandboxid.New(),
		Kernel:    filepath.Join(images, "vmlinuz"),
		Initrd:    filepath.Join(images, "initrd"),
		RootDisk:  filepath.Join(images, "root.ext4"),
		Cmdline:   "init=/init quiet",
		VCPUs:     1,
		MemoryMiB: 256,
		Dir:       t.TempDir(),
		Tap:       tap,
		MAC:       net.HardwareAddr{0x52, 0x54, 0, 0x12, 0x34, 0x56},
	}
}

// exited reports whether pid is gone or a zombie (an orphan whose init
// does not reap is still dead).
func exited(t *testing.T, pid int) bool {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if errors.Is(err, fs.ErrNotExist) {
		return true
	}
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && (stat[i+2] == 'Z' || stat[i+2] == 'X')
}

// watchChild returns a function that blocks until the fake's child process
// has exited. It pins the process with a pidfd first, so the wait cannot
// confuse it with a later process of the same pid.
func watchChild(t *testing.T, pidFile string) (pid int, waitExit func()) {
	t.Helper()
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("the fake VMM wrote no child pid: %v", err)
	}
	pid, err = strconv.Atoi(string(b))
	if err != nil {
		t.Fatal(err)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("pidfd_open %d: %v", pid, err)
	}
	t.Cleanup(func() { unix.Close(pidfd) })
	return pid, func() {
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		for {
			_, err := unix.Poll(fds, -1)
			if !errors.Is(err, unix.EINTR) {
				return
			}
		}
	}
}

func assertNoFilesLeft(t *testing.T, dir string) {
	t.Helper()
	for _, name := range []string{apiSocketName, vsockSocketName, pidFileName} {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s still exists after the machine ended (stat: %v)", name, err)
		}
	}
}

func TestStartDialGuestClose(t *testing.T) {
	driver := New(fakeVMM(t))
	childPidFile := filepath.Join(t.TempDir(), "child.pid")
	t.Setenv("FAKECH_CHILD_PIDFILE", childPidFile)
	cfg := testConfig(t)
	ctx := context.Background()

	m, err := driver.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer m.Close()
	childPid, waitChildExit := watchChild(t, childPidFile)

	timings := m.Timings()
	if timings.Launched.IsZero() || timings.Running.Before(timings.Launched) {
		t.Errorf("Timings = %+v, want Launched set and Running not before it", timings)
	}
	if want := "Command line: console=ttyS0 init=/init quiet"; !strings.Contains(m.Console(), want) {
		t.Errorf("Console() = %q, want it to contain %q", m.Console(), want)
	}
	tapSeen, err := os.ReadFile(cfg.Tap.Name())
	if err != nil {
		t.Fatal(err)
	}
	if string(tapSeen) != "fakech: tap queue received\n" {
		t.Errorf("tap file holds %q: the tap descriptor did not reach the VMM", tapSeen)
	}

	conn, err := m.DialGuest(ctx)
	if err != nil {
		t.Fatalf("DialGuest: %v", err)
	}
	if _, err := conn.Write([]byte("hello guest")); err != nil {
		t.Fatal(err)
	}
	echo := make([]byte, len("hello guest"))
	if _, err := io.ReadFull(conn, echo); err != nil || string(echo) != "hello guest" {
		t.Errorf("guest echoed %q, %v; want %q", echo, err, "hello guest")
	}
	conn.Close()

	pid := m.PID()
	if exited(t, pid) {
		t.Fatalf("VMM pid %d is not running before Close", pid)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if !exited(t, pid) {
		t.Errorf("VMM pid %d still runs after Close", pid)
	}
	select {
	case <-m.Done():
	default:
		t.Error("Done() is not closed after Close")
	}
	waitChildExit()
	if !exited(t, childPid) {
		t.Errorf("the VMM's child %d outlived Close", childPid)
	}
	assertNoFilesLeft(t, cfg.Dir)
	if err := m.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestStartWithoutTap(t *testing.T) {
	driver := New(fakeVMM(t))
	cfg := testConfig(t)
	cfg.Tap, cfg.MAC = nil, nil

	m, err := driver.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// recordingCgroup records the pids it is given.
type recordingCgroup struct{ pids []int }

func (g *recordingCgroup) AddProcess(pid int) error {
	g.pids = append(g.pids, pid)
	return nil
}

func TestStartPutsTheVMMInItsCgroup(t *testing.T) {
	driver := New(fakeVMM(t))
	cfg := testConfig(t)
	group := &recordingCgroup{}
	cfg.Cgroup = group
	m, err := driver.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer m.Close()
	if len(group.pids) != 1 || group.pids[0] != m.PID() {
		t.Errorf("cgroup got pids %v, want the VMM's %d once", group.pids, m.PID())
	}
}

func TestCancelDuringStartLeavesNothing(t *testing.T) {
	driver := New(fakeVMM(t))
	marker := filepath.Join(t.TempDir(), "boot-called")
	childPidFile := filepath.Join(t.TempDir(), "child.pid")
	t.Setenv("FAKECH_BLOCK", "vm.boot="+marker)
	t.Setenv("FAKECH_CHILD_PIDFILE", childPidFile)
	cfg := testConfig(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	type result struct {
		m   vmm.Machine
		err error
	}
	started := make(chan result, 1)
	go func() {
		m, err := driver.Start(ctx, cfg)
		started <- result{m, err}
	}()
	// Cancel only once Start is inside vm.boot, which the fake never answers.
	for {
		if _, err := os.Stat(marker); err == nil {
			break
		}
		select {
		case r := <-started:
			if r.m != nil {
				r.m.Close()
			}
			t.Fatalf("Start returned before reaching vm.boot: %v", r.err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	childPid, waitChildExit := watchChild(t, childPidFile)
	cancel()
	r := <-started

	if r.err == nil {
		r.m.Close()
		t.Fatal("Start succeeded although its context was cancelled during vm.boot")
	}
	if !errors.Is(r.err, context.Canceled) {
		t.Errorf("Start error %v does not wrap context.Canceled", r.err)
	}
	waitChildExit()
	if !exited(t, childPid) {
		t.Errorf("the VMM's child %d survived the cancelled Start", childPid)
	}
	assertNoFilesLeft(t, cfg.Dir)
}

func TestStartSurfacesVMMErrorChain(t *testing.T) {
	driver := New(fakeVMM(t))
	t.Setenv("FAKECH_FAIL", "vm.boot=Invalid ELF magic number")
	cfg := testConfig(t)

	m, err := driver.Start(context.Background(), cfg)

	if err == nil {
		m.Close()
		t.Fatal("Start succeeded although the VMM failed vm.boot")
	}
	for _, want := range []string{"vm.boot", `"Error in vm.boot"`, `"Invalid ELF magic number"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Start error %q does not contain %s", err, want)
		}
	}
	assertNoFilesLeft(t, cfg.Dir)
}

func TestStartReportsVMMThatExitsEarly(t *testing.T) {
	driver := New(fakeVMM(t))
	t.Setenv("FAKECH_EXIT_EARLY", "Error creating the hypervisor: /dev/kvm: Permission denied")

	_, err := driver.Start(context.Background(), testConfig(t))

	if err == nil {
		t.Fatal("Start succeeded with a VMM that exits at once")
	}
	for _, want := range []string{"exited", "exit status 1", "/dev/kvm: Permission denied"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Start error %q does not contain %q", err, want)
		}
	}
}

func TestDialGuestRetriesUntilGuestListens(t *testing.T) {
	driver := New(fakeVMM(t))
	t.Setenv("FAKECH_REFUSE_CONNECTS", "3")
	m, err := driver.Start(context.Background(), testConfig(t))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer m.Close()

	conn, err := m.DialGuest(context.Background())
	if err != nil {
		t.Fatalf("DialGuest: %v", err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(conn, b); err != nil || b[0] != 'x' {
		t.Errorf("echo after retries = %q, %v", b, err)
	}
}

func TestMachineNoticesVMMDeath(t *testing.T) {
	driver := New(fakeVMM(t))
	cfg := testConfig(t)
	m, err := driver.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer m.Close()

	if err := syscall.Kill(m.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-m.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err = m.DialGuest(ctx)
	if err == nil || !strings.Contains(err.Error(), "VMM exited") {
		t.Errorf("DialGuest on a dead VMM: err = %v, want it to say the VMM exited", err)
	}
	if err := m.Close(); err != nil {
		t.Errorf("Close after the VMM died: %v", err)
	}
	assertNoFilesLeft(t, cfg.Dir)
}

func TestStartRejectsBadConfig(t *testing.T) {
	good := vmm.Config{ID: sandboxid.New(), Kernel: "/k", Initrd: "/i", RootDisk: "/r", Dir: "/run/vm", VCPUs: 1, MemoryMiB: 128}
	tests := []struct {
		name   string
		mutate func(*vmm.Config)
		want   string
	}{
		{"relative kernel", func(c *vmm.Config) { c.Kernel = "vmlinuz" }, "kernel"},
		{"no dir", func(c *vmm.Config) { c.Dir = "" }, "dir"},
		{"no vcpus", func(c *vmm.Config) { c.VCPUs = 0 }, "vcpus"},
		{"tiny memory", func(c *vmm.Config) { c.MemoryMiB = 16 }, "memory"},
		{"mac without tap", func(c *vmm.Config) { c.MAC = net.HardwareAddr{2, 0, 0, 0, 0, 1} }, "mac"},
		{"socket path too long", func(c *vmm.Config) { c.Dir = "/" + strings.Repeat("d", 100) }, "longer than"},
	}
	driver := New("/nonexistent/cloud-hypervisor")
	if err := good.Validate(); err != nil {
		t.Fatalf("valid config rejected: %v", err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := good
			tt.mutate(&cfg)
			_, err := driver.Start(context.Background(), cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Start error = %v, want one naming %q", err, tt.want)
			}
		})
	}
}

// The sockets the driver creates in Config.Dir fit a Unix socket address
// whenever the Dir is valid.
func TestSocketNamesFitTheDirBound(t *testing.T) {
	for _, name := range []string{apiSocketName, vsockSocketName} {
		if len(name) > vmm.MaxSocketNameLen {
			t.Errorf("socket name %q is longer than vmm.MaxSocketNameLen (%d)", name, vmm.MaxSocketNameLen)
		}
	}
}

func TestAvailable(t *testing.T) {
	binary := fakeVMM(t)
	t.Setenv("PATH", filepath.Dir(binary))
	if err := Available(); err != nil {
		t.Errorf("Available with cloud-hypervisor in PATH: %v", err)
	}
	t.Setenv("PATH", t.TempDir())
	if err := Available(); err == nil || !strings.Contains(err.Error(), "not found in PATH") {
		t.Errorf("Available without the binary: err = %v, want it to say not found in PATH", err)
	}
}

func TestVMConfigSetsConsoleModesExplicitly(t *testing.T) {
	cfg := vmConfig(vmm.Config{Kernel: "/k", Initrd: "/i", RootDisk: "/r", Cmdline: "quiet", VCPUs: 2, MemoryMiB: 512}, "/d/vsock.sock")
	if cfg.Console == nil || cfg.Console.Mode != "Off" {
		t.Errorf("console = %+v, want mode Off (the VMM's default is Tty)", cfg.Console)
	}
	if cfg.Serial == nil || cfg.Serial.Mode != "Tty" {
		t.Errorf("serial = %+v, want mode Tty (stdout, our bounded pipe)", cfg.Serial)
	}
	if len(cfg.Disks) != 1 || !cfg.Disks[0].Readonly {
		t.Errorf("disks = %+v, want the root disk read-only", cfg.Disks)
	}
	if cfg.Vsock == nil || cfg.Vsock.CID != 3 || cfg.Vsock.Socket != "/d/vsock.sock" {
		t.Errorf("vsock = %+v, want cid 3 on /d/vsock.sock", cfg.Vsock)
	}
}

// BenchmarkStartClose measures the driver's own cost around a VMM that
// answers at once: process launch, API readiness polling, the four start
// calls, the tap hand-over and the teardown.
func BenchmarkStartClose(b *testing.B) {
	driver := New(fakeVMM(b))
	cfg := testConfig(b)
	ctx := context.Background()
	for b.Loop() {
		m, err := driver.Start(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		if err := m.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

func TestKillLeftover(t *testing.T) {
	binary := fakeVMM(t)
	dir := t.TempDir()
	// A VMM whose daemon crashed: launched the driver's way, owned by no
	// machine.
	leftover := exec.Command(binary, "--api-socket", "path="+filepath.Join(dir, apiSocketName))
	if err := leftover.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- leftover.Wait() }()
	pidFile := filepath.Join(dir, pidFileName)
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(leftover.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	// An unrelated process whose pid a stale pid file could name.
	stranger := exec.Command(binary, "--fake-child")
	if err := stranger.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stranger.Process.Kill(); stranger.Wait() }()
	strangerDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(strangerDir, pidFileName), []byte(strconv.Itoa(stranger.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}

	if err := KillLeftover(dir); err != nil {
		t.Fatalf("KillLeftover: %v", err)
	}
	if err := KillLeftover(strangerDir); err != nil {
		t.Fatalf("KillLeftover with a reused pid: %v", err)
	}

	if err := <-waited; err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("leftover VMM ended with %v, want it killed", err)
	}
	if exited(t, stranger.Process.Pid) {
		t.Error("KillLeftover killed a process that was not the VMM of its directory")
	}
	assertNoFilesLeft(t, dir)
	if err := KillLeftover(dir); err != nil {
		t.Errorf("KillLeftover with nothing left: %v", err)
	}
}
