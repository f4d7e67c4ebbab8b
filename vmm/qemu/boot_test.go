package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/guest/image"
	"github.com/ephemeralhq/ephemeral/internal/sandboxid"
	"github.com/ephemeralhq/ephemeral/internal/testenv"
	"github.com/ephemeralhq/ephemeral/vmm"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// bootTimeout bounds one boot under TCG on a loaded two-core machine;
// a boot takes about 2.5 s there.
const bootTimeout = 2 * time.Minute

// requireVMMUser looks VMMUser up. Without the user it skips, or
// fails under EPHEMERAL_REQUIRE_VM=1 (`make test`), whose install-deps
// step creates it: there QEMU running as root is a regression.
func requireVMMUser(t testing.TB) *user.User {
	t.Helper()
	u, err := user.Lookup(VMMUser)
	if err != nil {
		testenv.Skip(t, "QEMU would run as root: user %s: %v: run tools/install-deps.sh as root to create it", VMMUser, err)
	}
	return u
}

// requireQEMU skips unless QEMU is installed, for tests that need the
// binary but no guest image.
func requireQEMU(t testing.TB) {
	t.Helper()
	if err := Available(); err != nil {
		testenv.Skip(t, "%v", err)
	}
}

func testConfig(t testing.TB, img *image.Image) vmm.Config {
	return vmm.Config{
		ID:        sandboxid.New(),
		Kernel:    img.Kernel,
		Initrd:    img.Initrd,
		RootDisk:  img.RootDisk,
		VCPUs:     1,
		MemoryMiB: 512,
		Dir:       t.TempDir(),
	}
}

// assertGone checks what a user checks after Close: no process, and no
// socket or pid file left in the VM directory.
func assertGone(t *testing.T, pid int, dir string) {
	t.Helper()
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("process %d still exists after Close (stat /proc: %v)", pid, err)
	}
	assertEmptyDir(t, dir)
}

func assertEmptyDir(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("read vm dir: %v", err)
	}
	for _, e := range entries {
		t.Errorf("left in vm dir after Close: %s", e.Name())
	}
}

func TestBootHello(t *testing.T) {
	img := testenv.RequireVM(t)
	cfg := testConfig(t, img)
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()

	m, err := New("").Start(ctx, cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer m.Close()
	pid := m.PID()
	timings := m.Timings()
	if timings.Launched.IsZero() || timings.Running.Before(timings.Launched) {
		t.Errorf("Timings = %+v, want Launched set and Running not before it", timings)
	}
	pidFile, err := os.ReadFile(filepath.Join(cfg.Dir, pidFileName))
	if err != nil || strings.TrimSpace(string(pidFile)) != strconv.Itoa(pid) {
		t.Errorf("pid file = %q, %v; want %d", pidFile, err, pid)
	}

	conn, err := m.DialGuest(ctx)
	if err != nil {
		t.Fatalf("DialGuest: %v\nconsole:\n%s", err, m.Console())
	}
	client := vsockproto.NewClient(conn)
	defer client.Close()
	hello, err := client.Hello(ctx)
	if err != nil {
		t.Fatalf("Hello: %v\nconsole:\n%s", err, m.Console())
	}
	t.Logf("hello %+v; launch→running %v, launch→hello %v", hello, timings.Running.Sub(timings.Launched), time.Since(timings.Launched))
	if hello.ProtocolVersion != vsockproto.ProtocolVersion {
		t.Errorf("guest protocol version %d, want %d", hello.ProtocolVersion, vsockproto.ProtocolVersion)
	}
	if hello.KernelRelease != img.KernelRelease {
		t.Errorf("guest kernel %q, want the image's %q", hello.KernelRelease, img.KernelRelease)
	}
	if hello.Transport != "serial" && hello.Transport != "vsock" {
		t.Errorf("guest transport %q, want serial or vsock", hello.Transport)
	}
	if !strings.Contains(m.Console(), "Linux version") {
		t.Errorf("console lacks the kernel banner:\n%s", m.Console())
	}

	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case <-m.Done():
	default:
		t.Error("Done not closed after Close")
	}
	assertGone(t, pid, cfg.Dir)
	if err := m.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// What a guest that escapes into QEMU would hold: QEMU's seccomp filter,
// VMMUser's uid without capabilities, and the VM directory as its root.
func TestQEMUIsConfined(t *testing.T) {
	img := testenv.RequireVM(t)
	u := requireVMMUser(t)
	uid, gid := u.Uid, u.Gid
	cfg := testConfig(t, img)
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	driver := New("")
	m, err := driver.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer m.Close()
	if got, err := driver.Confinement(); err != nil || !strings.Contains(got, "runs as "+VMMUser) {
		t.Errorf("Confinement() = %q, %v; want it to say QEMU runs as %s", got, err, VMMUser)
	}

	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", m.PID()))
	if err != nil {
		t.Fatalf("read QEMU's status: %v", err)
	}
	want := map[string]string{
		// 2: a seccomp filter is installed.
		"Seccomp": "2",
		// Real, effective, saved and filesystem uid.
		"Uid": strings.Join([]string{uid, uid, uid, uid}, "\t"),
		"Gid": strings.Join([]string{gid, gid, gid, gid}, "\t"),
		// Not root's supplementary groups: only the user's own.
		"Groups": gid,
		"CapEff": "0000000000000000",
		"CapPrm": "0000000000000000",
		// No exec could regain privileges through a set-uid program.
		"NoNewPrivs": "1",
	}
	for name, value := range want {
		got, err := statusField(status, name)
		if err != nil || got != value {
			t.Errorf("QEMU's /proc status %s = %q, %v; want %q", name, got, err, value)
		}
	}
	root, err := os.Readlink(fmt.Sprintf("/proc/%d/root", m.PID()))
	if err != nil || root != cfg.Dir {
		t.Errorf("QEMU's root directory = %q, %v; want the VM directory %s", root, err, cfg.Dir)
	}

	// Confined from its first guest instruction, the guest still boots.
	conn, err := m.DialGuest(ctx)
	if err != nil {
		t.Fatalf("DialGuest: %v\nconsole:\n%s", err, m.Console())
	}
	client := vsockproto.NewClient(conn)
	defer client.Close()
	if _, err := client.Hello(ctx); err != nil {
		t.Fatalf("Hello from a confined QEMU: %v\nconsole:\n%s", err, m.Console())
	}
}

// Keep the main goroutine on the main thread: Go never retires the main
// thread, so a test goroutine that ran there could not show a retired
// thread's effect.
func init() { runtime.LockOSThread() }

// QEMU gets SIGKILL when the thread that forked it ends (Pdeathsig), not
// only when the daemon does. A VM started by a goroutine that exits while
// locked to its thread, which retires the thread (network namespace code
// does this), must keep running.
func TestMachineOutlivesStartingThread(t *testing.T) {
	img := testenv.RequireVM(t)
	cfg := testConfig(t, img)
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	type started struct {
		m   vmm.Machine
		err error
	}
	result := make(chan started, 1)
	go func() {
		// Never unlocked: the thread ends with this goroutine.
		runtime.LockOSThread()
		m, err := New("").Start(ctx, cfg)
		result <- started{m, err}
	}()
	r := <-result
	if r.err != nil {
		t.Fatalf("Start: %v", r.err)
	}
	defer r.m.Close()
	conn, err := r.m.DialGuest(ctx)
	if err != nil {
		t.Fatalf("DialGuest: %v", err)
	}
	client := vsockproto.NewClient(conn)
	defer client.Close()
	if _, err := client.Hello(ctx); err != nil {
		t.Fatalf("Hello after the starting thread ended: %v\nconsole:\n%s", err, r.m.Console())
	}
}

// A guest that panics ends QEMU (panic=-1 and -no-reboot): Done closes by
// itself and the console shows why.
func TestGuestPanicEndsMachine(t *testing.T) {
	img := testenv.RequireVM(t)
	cfg := testConfig(t, img)
	cfg.Cmdline = "rdinit=/does/not/exist init=/does/not/exist"
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()

	m, err := New("").Start(ctx, cfg)
	if err != nil {
		// The guest may already be gone when QMP is asked; then Start
		// must say so with the panic in the console tail.
		if !strings.Contains(err.Error(), "Kernel panic") {
			t.Fatalf("Start: %v", err)
		}
		return
	}
	select {
	case <-m.Done():
	case <-ctx.Done():
		t.Fatalf("guest did not panic and exit: %v\nconsole:\n%s", ctx.Err(), m.Console())
	}
	if !strings.Contains(m.Console(), "Kernel panic") {
		t.Errorf("console lacks the kernel panic:\n%s", m.Console())
	}
	if _, err := m.DialGuest(ctx); err == nil || !strings.Contains(err.Error(), "qemu exited") {
		t.Errorf("DialGuest on an exited machine: %v, want a qemu exited error", err)
	}
	// Close races nothing here but must still clean up after a process
	// that ended by itself, from any number of callers.
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			if err := m.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
	wg.Wait()
	assertGone(t, m.PID(), cfg.Dir)
}

// QEMU refusing to start must surface its own error message.
func TestStartFailureQuotesQEMU(t *testing.T) {
	requireQEMU(t)
	dir := t.TempDir()
	notAKernel := filepath.Join(dir, "not-a-kernel")
	if err := os.WriteFile(notAKernel, []byte("this is not a bzImage"), 0o644); err != nil {
		t.Fatal(err)
	}
	vmDir := filepath.Join(dir, "vm")
	if err := os.Mkdir(vmDir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := vmm.Config{
		ID: sandboxid.New(), Kernel: notAKernel, Initrd: notAKernel, RootDisk: notAKernel,
		VCPUs: 1, MemoryMiB: 128, Dir: vmDir,
	}
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	m, err := New("").Start(ctx, cfg)
	if err == nil {
		m.Close()
		t.Fatal("Start with a garbage kernel succeeded")
	}
	t.Logf("Start: %v", err)
	// QEMU says why on stderr ("qemu: linux kernel too old to load a
	// ram disk"); whatever the wording, its lines start with its name.
	if !strings.Contains(err.Error(), "qemu exited") || !strings.Contains(err.Error(), "console:\nqemu") {
		t.Errorf("Start error %q does not carry QEMU's message", err)
	}
	assertEmptyDir(t, vmDir)
}

// writeFakeQEMU writes a stand-in for QEMU that records its pid (also where a
// test can read it after the driver has cleaned up), then hangs without
// ever answering QMP.
func writeFakeQEMU(t *testing.T) (binary, pidRecord string) {
	t.Helper()
	dir := t.TempDir()
	binary = filepath.Join(dir, "qemu-system-x86_64")
	pidRecord = filepath.Join(dir, "started")
	script := `#!/bin/sh
while [ $# -gt 0 ]; do
	if [ "$1" = -pidfile ]; then echo $$ > "$2"; fi
	shift
done
echo $$ > "` + pidRecord + `.tmp" && mv "` + pidRecord + `.tmp" "` + pidRecord + `"
exec sleep 1000
`
	if err := os.WriteFile(binary, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return binary, pidRecord
}

func TestCancelDuringStartLeavesNothing(t *testing.T) {
	binary, pidRecord := writeFakeQEMU(t)
	cfg := vmm.Config{
		ID: sandboxid.New(), Kernel: "/nonexistent/vmlinuz", Initrd: "/nonexistent/initrd", RootDisk: "/nonexistent/root",
		VCPUs: 1, MemoryMiB: 128, Dir: t.TempDir(),
	}
	// Cancel once the stand-in runs, while Start waits for QMP. The
	// deferred cancel runs first: a Start that failed before the stand-in
	// ran must not leave the watcher waiting.
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wg.Go(func() {
		for {
			if _, err := os.Stat(pidRecord); err == nil {
				cancel()
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	})

	m, err := New(binary).Start(ctx, cfg)
	if err == nil {
		m.Close()
		t.Fatal("Start succeeded against a QEMU that never answers QMP")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Start error = %v, want context.Canceled", err)
	}
	b, err := os.ReadFile(pidRecord)
	if err != nil {
		t.Fatalf("stand-in never ran: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("stand-in pid %q: %v", b, err)
	}
	assertGone(t, pid, cfg.Dir)
}

// child is a process started by a test, waited for in the background.
type child struct {
	cmd    *exec.Cmd
	exited chan error // receives cmd.Wait's result, once
}

func startChild(t *testing.T, name string, args ...string) *child {
	t.Helper()
	c := &child{cmd: exec.Command(name, args...), exited: make(chan error, 1)}
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { c.exited <- c.cmd.Wait() }()
	t.Cleanup(func() {
		c.cmd.Process.Kill()
		<-c.exited
		c.exited <- nil // let a test's own wait still return
	})
	return c
}

func TestKillLeftover(t *testing.T) {
	requireQEMU(t)
	t.Run("root", func(t *testing.T) { testKillLeftover(t, confinement{}) })
	// The usual leftover: its daemon's crash did not kill it because
	// switching user cleared its parent-death signal.
	t.Run(VMMUser, func(t *testing.T) {
		testenv.RequireRoot(t) // to switch to another user
		testKillLeftover(t, confinement{runAs: VMMUser, uid: requireVMMUser(t).Uid})
	})
}

func testKillLeftover(t *testing.T, confine confinement) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, pidFileName)
	// A QEMU as a crashed daemon would leave it: paused, no kernel needed,
	// confined as the driver confines it.
	args := []string{"-M", "microvm", "-accel", "tcg", "-nodefaults", "-no-user-config",
		"-display", "none", "-S", "-pidfile", pidFile, "-sandbox", confine.sandboxOption()}
	if confine.runAs != "" {
		args = append(args, "-runas", confine.runAs, "-chroot", dir)
	}
	leftover := startChild(t, DefaultBinary, args...)
	// QEMU writes the pid file during startup, then switches user.
	for {
		b, err := os.ReadFile(pidFile)
		if err == nil && strings.HasSuffix(string(b), "\n") {
			switched, err := confine.switched(leftover.cmd.Process.Pid)
			if err != nil {
				t.Fatal(err)
			}
			if switched {
				break
			}
		}
		select {
		case err := <-leftover.exited:
			t.Fatalf("qemu exited early: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
	}

	if err := KillLeftover(dir); err != nil {
		t.Fatalf("KillLeftover: %v", err)
	}
	// KillLeftover returns once the process has exited: at most a zombie
	// waiting for this test to reap it.
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(leftover.cmd.Process.Pid) + "/stat")
	if err == nil && !strings.Contains(string(stat), ") Z ") {
		t.Errorf("KillLeftover returned while the leftover still runs: %s", stat)
	}
	if err := <-leftover.exited; err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("leftover ended with %v, want killed", err)
	}
	leftover.exited <- nil
	if _, err := os.Stat(pidFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pid file left behind: %v", err)
	}
	if err := KillLeftover(dir); err != nil {
		t.Errorf("KillLeftover with nothing left: %v", err)
	}
}

// A stale pid file whose pid now belongs to another program must not get
// that program killed.
func TestKillLeftoverSparesStrangers(t *testing.T) {
	stranger := startChild(t, "sleep", "1000")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, pidFileName), []byte(strconv.Itoa(stranger.cmd.Process.Pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := KillLeftover(dir); err != nil {
		t.Fatalf("KillLeftover: %v", err)
	}
	select {
	case err := <-stranger.exited:
		t.Fatalf("KillLeftover killed an unrelated process: %v", err)
	default:
	}
	if _, err := os.Stat(filepath.Join(dir, pidFileName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale pid file left behind: %v", err)
	}
}

// BenchmarkBoot measures a whole disposable VM: Start, the guest's Hello,
// Close. Besides ns/op it reports the driver's own share (launch to
// running) and launch to Hello, the time a user waits for a usable guest.
func BenchmarkBoot(b *testing.B) {
	img := testenv.RequireVM(b)
	driver := New("")
	var toRunning, toHello time.Duration
	for b.Loop() {
		cfg := testConfig(b, img)
		ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
		m, err := driver.Start(ctx, cfg)
		if err != nil {
			cancel()
			b.Fatalf("Start: %v", err)
		}
		conn, err := m.DialGuest(ctx)
		if err != nil {
			b.Fatalf("DialGuest: %v", err)
		}
		client := vsockproto.NewClient(conn)
		if _, err := client.Hello(ctx); err != nil {
			b.Fatalf("Hello: %v\nconsole:\n%s", err, m.Console())
		}
		launched := m.Timings().Launched
		toHello += time.Since(launched)
		toRunning += m.Timings().Running.Sub(launched)
		client.Close()
		if err := m.Close(); err != nil {
			b.Fatalf("Close: %v", err)
		}
		cancel()
	}
	b.ReportMetric(float64(toRunning.Milliseconds())/float64(b.N), "ms-to-running/op")
	b.ReportMetric(float64(toHello.Milliseconds())/float64(b.N), "ms-to-hello/op")
}
