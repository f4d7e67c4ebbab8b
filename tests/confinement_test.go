package tests

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeralhq/ephemeral/guest/limits"
	"github.com/ephemeralhq/ephemeral/hostd/config"
	"github.com/ephemeralhq/ephemeral/hostd/sandbox"
	"github.com/ephemeralhq/ephemeral/hostd/seal"
	"github.com/ephemeralhq/ephemeral/hostd/system"
	"github.com/ephemeralhq/ephemeral/internal/testenv"
	"github.com/ephemeralhq/ephemeral/vmm"
	"github.com/ephemeralhq/ephemeral/vmm/cgroup"
	"github.com/ephemeralhq/ephemeral/vmm/qemu"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// vmmCgroups is the hierarchy the sandbox managers of this test process
// (and the daemons it starts) put their VMMs in.
func vmmCgroups(t *testing.T) *cgroup.Hierarchy {
	t.Helper()
	h, err := cgroup.Detect(cgroup.DefaultSubtree)
	if err != nil {
		testenv.Skip(t, "no cgroups for VMMs on this host: %v", err)
	}
	return h
}

// groupExists reports whether any directory of sandbox id's VMM cgroup is
// left.
func groupExists(h *cgroup.Hierarchy, id string) bool {
	for _, dir := range h.Dirs(id) {
		if _, err := os.Stat(dir); err == nil {
			return true
		}
	}
	return false
}

// vmmPid is the pid of the one VMM running for sandboxes in runDir.
func vmmPid(t *testing.T, runDir string) int {
	t.Helper()
	procs := vmmProcesses(runDir)
	if len(procs) != 1 {
		t.Fatalf("VMM processes for %s: %q, want one", runDir, procs)
	}
	pid, err := strconv.Atoi(strings.Fields(procs[0])[0])
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// A guest that spins every vCPU gets no more host CPU than its cgroup's
// quota, one CPU per vCPU, and the group exists exactly as long as the
// sandbox.
func TestSpinningGuestStaysWithinItsCPUQuota(t *testing.T) {
	m, runDir := newManager(t)
	h := vmmCgroups(t)
	sb := newSandbox(t, m)
	group := sb.Cgroup()
	if group == nil {
		t.Fatalf("the sandbox has no cgroup although the host has them (%s)", m.Describe())
	}
	pid := vmmPid(t, runDir)
	membership, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(membership), "/"+cgroup.DefaultSubtree+"/"+sb.ID()+"\n") {
		t.Fatalf("the VMM %d is not in its sandbox's group:\n%s", pid, membership)
	}
	quota := group.Limits().CPUs
	if quota != 1 {
		t.Fatalf("CPU quota %d for a 1-vCPU guest", quota)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	spin, err := sb.Start(ctx, vsockproto.ExecRequest{Shell: `for i in $(seq "$(nproc)"); do yes > /dev/null & done; echo spinning; wait`, Timeout: time.Minute}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the spinners are up
	const window = 3 * time.Second
	before, err := group.CPUTime()
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	time.Sleep(window)
	after, err := group.CPUTime()
	elapsed := time.Since(began)
	if err != nil {
		t.Fatal(err)
	}
	spin.Signal(syscall.SIGKILL)
	spin.Wait()
	used := after - before
	// One 100 ms CFS period of slack for a window that starts or ends
	// mid-period.
	if limit := time.Duration(quota)*elapsed + 100*time.Millisecond; used > limit {
		t.Errorf("the VMM used %v of CPU in %v, more than its quota of %d CPU allows (%v)", used, elapsed, quota, limit)
	}
	if used < window/10 {
		t.Errorf("the VMM's group accounted only %v of CPU in %v while its guest spun", used, elapsed)
	}
	peak, _ := group.MemoryPeak()
	t.Logf("spinning guest: %v of CPU in %v (quota %d CPU); VMM memory peak %d MiB of %d MiB", used, elapsed, quota, peak>>20, group.Limits().MemoryBytes>>20)

	if !groupExists(h, sb.ID()) {
		t.Fatal("the group is gone while the sandbox lives")
	}
	if err := sb.Destroy(); err != nil {
		t.Fatal(err)
	}
	if groupExists(h, sb.ID()) {
		t.Errorf("Destroy left the VMM's group: %q", h.Dirs(sb.ID()))
	}
}

// A guest may use all of its memory, booted or restored: its VMM's limit
// leaves room for the VMM's own. A VMM given too little room is killed by
// the kernel, and the sandbox says why its VM is gone.
func TestVMMMemoryLimit(t *testing.T) {
	const fill = `python3 -c 'b = b"x" * (400 << 20); print(len(b))'`
	m, _ := newManager(t)
	vmmCgroups(t)
	create := func(m *sandbox.Manager, start sandbox.Start) *sandbox.Sandbox {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		sb, err := m.Create(ctx, sandbox.Options{Start: start})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sb.Destroy() })
		return sb
	}
	for _, start := range []struct {
		name  string
		start sandbox.Start
	}{{"booted", sandbox.StartBoot}, {"restored", sandbox.StartRestore}} {
		sb := create(m, start.start)
		if r := run(t, sb, fill); r.Code != 0 || r.stdout != "419430400\n" {
			t.Fatalf("%s: a guest filling 400 of its 512 MiB: %+v, stdout %q, stderr %q", start.name, r.ExitStatus, r.stdout, r.stderr)
		}
		peak, err := sb.Cgroup().MemoryPeak()
		if err != nil {
			t.Fatal(err)
		}
		if kills, err := sb.Cgroup().OOMKills(); err != nil || kills != 0 {
			t.Errorf("%s: OOM kills in the VMM's group: %d, %v", start.name, kills, err)
		}
		t.Logf("%s: VMM memory peak with 400 MiB of the guest's RAM in use: %d MiB of its %d MiB limit", start.name, peak>>20, sb.Cgroup().Limits().MemoryBytes>>20)
		sb.Destroy()
	}

	// Booted: a clone's group is charged only for the pages its guest
	// writes (its template's are the daemon's), so it may fit where a
	// booted VMM, charged for its guest's every page, does not.
	tight, _ := newManagerWithLimits(t, sandbox.Limits{VMMOverheadMiB: 8})
	starved := create(tight, sandbox.StartBoot)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := starved.Exec(ctx, vsockproto.ExecRequest{Shell: fill, Timeout: time.Minute}, nil, nil, nil)
	if !errors.Is(err, sandbox.ErrVMMOutOfMemory) || !strings.Contains(err.Error(), "520 MiB") {
		t.Errorf("a guest filling its RAM behind a VMM limited to its RAM + 8 MiB: %v, want the VMM's memory limit named", err)
	}
	if !errors.Is(starved.StopCause(), sandbox.ErrVMMOutOfMemory) {
		t.Errorf("StopCause() = %v", starved.StopCause())
	}
	t.Logf("the starved sandbox's exec: %v", err)
}

// The VMM, as the user it switches to and in its chroot, can reach none of
// the daemon's own files: it holds no descriptor of them, and opening them
// fails. It runs with no_new_privs, under seccomp, and holds only the
// descriptors it is meant to.
func TestVMMCannotReachTheDaemonsFiles(t *testing.T) {
	state := cliState(t)
	vmmUser, err := user.Lookup(qemu.VMMUser)
	if err != nil {
		testenv.Skip(t, "no user %s (tools/install-deps.sh creates it): %v", qemu.VMMUser, err)
	}
	uid, _ := strconv.Atoi(vmmUser.Uid)
	gid, _ := strconv.Atoi(vmmUser.Gid)

	// A descriptor without close-on-exec, as a daemon inherits from the
	// shell or supervisor that started it.
	canary, err := unix.MemfdCreate("inherited-canary", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(canary)

	// A state directory is private to root, as the daemon keeps it; the
	// test's starts out 0755.
	if err := os.Chmod(state, 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := config.Defaults()
	cfg.StateDir = state
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sys, err := system.New(ctx, cfg, system.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Close()
	sb, err := sys.Sandboxes.Create(ctx, sandbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy()

	secrets := []string{system.DatabasePath(state), filepath.Join(state, seal.KeyFile)}
	for _, p := range secrets {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("the daemon's file %s: %v", p, err)
		}
	}

	pid := vmmPid(t, filepath.Join(state, "sandboxes"))
	proc := "/proc/" + strconv.Itoa(pid)
	vmDir := filepath.Join(state, "sandboxes", sb.ID(), "vm")
	status, err := os.ReadFile(proc + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for field, want := range map[string]string{
		"Uid":        strings.Repeat(vmmUser.Uid+"\t", 3) + vmmUser.Uid,
		"NoNewPrivs": "1",
		"Seccomp":    "2",
		"CapEff":     "0000000000000000",
	} {
		if got := statusField(string(status), field); got != want {
			t.Errorf("VMM %s: %q, want %q", field, got, want)
		}
	}
	if root, err := os.Readlink(proc + "/root"); err != nil || root != vmDir {
		t.Errorf("VMM root directory %q (%v), want its VM directory %s", root, err, vmDir)
	}

	// Its descriptors: stdio, what the driver passed, what QEMU opened
	// itself before it switched user. Nothing of the daemon's. (The
	// sandbox is a clone: the daemon restores where it can.)
	images, err := filepath.EvalSymlinks(filepath.Join(state, "images"))
	if err != nil {
		t.Fatal(err)
	}
	ours := socketInodes(t, "/proc/self/fd")
	fdDir := proc + "/fd"
	entries, err := os.ReadDir(fdDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err != nil {
			continue
		}
		fd := e.Name()
		switch {
		case fd == "0" && target == os.DevNull:
		case (fd == "1" || fd == "2") && strings.HasPrefix(target, "pipe:"): // the console, read by the driver
		case strings.HasPrefix(target, "anon_inode:"): // eventfds, signalfd
		case target == "/dev/net/tun", target == "/dev/vhost-vsock", target == "/dev/kvm":
		case strings.HasPrefix(target, images+"/"): // the root disk
		case target == filepath.Join(vmDir, "pid"): // its pid file, locked
		case strings.HasPrefix(target, "socket:") && !ours[target]: // QMP, the guest channel
		case target == "/memfd:ephemeral-template-ram (deleted)": // a clone's RAM: its template's, sealed
		default:
			t.Errorf("the VMM holds descriptor %s -> %s, which is not its own", fd, target)
		}
	}

	// Opening them as the VMM would: its user, no capabilities, its root.
	attempts := append([]string{"../../../../" + filepath.Base(secrets[0]), "/" + seal.KeyFile}, secrets...)
	for path, err := range openAs(uid, gid, vmDir, attempts) {
		if err == nil || !(errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission)) {
			t.Errorf("the VMM's user in its chroot opening %s: %v, want no such file or permission denied", path, err)
		}
	}
	// And without the chroot, should QEMU's -chroot ever fail: the state
	// directory keeps the user out.
	for path, err := range openAs(uid, gid, "", secrets) {
		if !errors.Is(err, fs.ErrPermission) {
			t.Errorf("the VMM's user opening %s: %v, want permission denied", path, err)
		}
	}
	// The same helper opens what the user may: its refusals are the
	// kernel's, not the helper's.
	for path, err := range openAs(uid, gid, "", []string{"/etc/passwd"}) {
		if err != nil {
			t.Errorf("the VMM's user opening %s: %v, want it opened", path, err)
		}
	}
}

// openAs tries to open each path as uid and gid, with no capabilities and
// root (unless "") as the root directory, and returns each attempt's
// error. The attempts run on a thread of their own, which ends with them:
// its ids and root cannot be taken back.
func openAs(uid, gid int, root string, paths []string) map[string]error {
	result := make(chan map[string]error, 1)
	go func() {
		// Never unlocked: the thread ends with this goroutine.
		runtime.LockOSThread()
		errs := map[string]error{}
		fail := func(err error) {
			for _, p := range paths {
				errs[p] = err
			}
			result <- errs
		}
		// Threads share their root directory unless unshared.
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			fail(err)
			return
		}
		if root != "" {
			if err := unix.Chroot(root); err != nil {
				fail(err)
				return
			}
			if err := unix.Chdir("/"); err != nil {
				fail(err)
				return
			}
		}
		// The raw calls change this thread's credentials only; Go's
		// syscall.Setuid would change every thread of the process.
		for _, call := range [][4]uintptr{
			{unix.SYS_SETGROUPS, 0, 0, 0},
			{unix.SYS_SETRESGID, uintptr(gid), uintptr(gid), uintptr(gid)},
			{unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)},
		} {
			if _, _, errno := unix.RawSyscall(call[0], call[1], call[2], call[3]); errno != 0 {
				fail(errno)
				return
			}
		}
		for _, p := range paths {
			f, err := os.Open(p)
			if err == nil {
				f.Close()
			}
			errs[p] = err
		}
		result <- errs
	}()
	return <-result
}

// socketInodes are the sockets a process holds, as "socket:[inode]".
func socketInodes(t *testing.T, fdDir string) map[string]bool {
	t.Helper()
	entries, err := os.ReadDir(fdDir)
	if err != nil {
		t.Fatal(err)
	}
	inodes := map[string]bool{}
	for _, e := range entries {
		if target, err := os.Readlink(filepath.Join(fdDir, e.Name())); err == nil && strings.HasPrefix(target, "socket:") {
			inodes[target] = true
		}
	}
	return inodes
}

// statusField is the value of a "Name:\tvalue" line of /proc/<pid>/status.
func statusField(status, name string) string {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// Restored clones and pooled sandboxes are confined as booted ones are:
// each VMM in a cgroup of its own with the sandbox's limits, charged for
// the memory its guest writes; in the guest, the scratch directory is a
// tmpfs of its own size under the name provisioned for this guest, and a
// command may have only so many processes.
func TestClonesAndPooledSandboxesAreConfined(t *testing.T) {
	const scratchMiB, commandProcesses = 40, 20
	m, _ := newManagerWithLimits(t, sandbox.Limits{Guest: limits.Limits{ScratchMiB: scratchMiB, CommandProcesses: commandProcesses}})
	h := vmmCgroups(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	restored, err := m.Create(ctx, sandbox.Options{Start: sandbox.StartRestore})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { restored.Destroy() })
	pool := newPool(t, m, sandbox.PoolConfig{Size: 1, Capacity: 2}, 1)
	pooled := take(t, pool, sandbox.Options{})
	if !restored.Timings().Restored || !pooled.Timings().Pooled || !pooled.Timings().Restored {
		t.Fatalf("timings %+v and %+v: want a restored sandbox and a pooled clone", restored.Timings(), pooled.Timings())
	}

	wantLimits := cgroup.Limits{CPUs: 1, MemoryBytes: (512 + vmm.DefaultMemoryOverheadMiB) << 20, Tasks: 256, IOWeight: 100}
	for _, sb := range []*sandbox.Sandbox{restored, pooled} {
		name := "restored"
		if sb == pooled {
			name = "pooled"
		}
		group := sb.Cgroup()
		if group == nil {
			t.Fatalf("%s: no cgroup although the host has them (%s)", name, m.Describe())
		}
		if group.Limits() != wantLimits {
			t.Errorf("%s: cgroup limits %+v, want %+v", name, group.Limits(), wantLimits)
		}
		for _, dir := range h.Dirs(sb.ID()) {
			procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			if err != nil || !slices.Contains(strings.Fields(string(procs)), strconv.Itoa(sb.PID())) {
				t.Errorf("%s: the VMM %d is not in its group %s: %q, %v", name, sb.PID(), dir, procs, err)
			}
		}

		// The pages the guest writes are the clone's own, charged to it.
		if r := run(t, sb, `python3 -c 'b = b"x" * (200 << 20); print(len(b))'`); r.Code != 0 {
			t.Fatalf("%s: a guest writing 200 MiB: %+v, %q", name, r.ExitStatus, r.stderr)
		}
		if peak, err := group.MemoryPeak(); err != nil || peak < 200<<20 {
			t.Errorf("%s: the VMM's group was charged at most %d MiB (%v) while its guest wrote 200 MiB", name, peak>>20, err)
		}

		r := run(t, sb, `pwd; awk -v d="$PWD" '$2 == d { print $3 }' /proc/mounts; head -c 60M /dev/zero > big; stat -c %s big`)
		out := strings.Split(r.stdout, "\n")
		if len(out) < 3 || out[0] != sb.ScratchDir() || out[1] != "tmpfs" {
			t.Errorf("%s: pwd and the filesystem mounted there: %q, want %s on a tmpfs of its own", name, r.stdout, sb.ScratchDir())
		}
		if size, _ := strconv.Atoi(strings.TrimSpace(out[len(out)-2])); size > scratchMiB<<20 || !strings.Contains(r.stderr, "No space left on device") {
			t.Errorf("%s: writing 60 MiB into a %d MiB scratch directory: %+v, %d bytes written, stderr %q", name, scratchMiB, r.ExitStatus, size, r.stderr)
		}

		st := run(t, sb, `for i in $(seq 40); do sleep 60 & done; wait`).ExitStatus
		if st.ProcessLimit != commandProcesses || st.Signal != 9 {
			t.Errorf("%s: a command starting 40 processes: %+v, want it killed for passing %d", name, st, commandProcesses)
		}
	}
	if restored.ScratchDir() == pooled.ScratchDir() {
		t.Errorf("two clones of one template share the scratch directory %s", restored.ScratchDir())
	}
}
