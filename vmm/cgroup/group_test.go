package cgroup

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ephemeralhq/ephemeral/internal/flock"
)

// Control files a fake group is made with, as the kernel would make them.
var (
	v2Files = []string{"cgroup.procs", "cgroup.controllers", "cgroup.subtree_control", "cpu.max", "cpu.stat",
		"memory.max", "memory.swap.max", "memory.events", "memory.peak", "pids.max", "io.weight"}
	v1Files = []string{"cgroup.procs", "cpu.cfs_period_us", "cpu.cfs_quota_us", "cpuacct.usage",
		"memory.limit_in_bytes", "memory.max_usage_in_bytes", "memory.oom_control", "pids.max", "blkio.bfq.weight"}
)

// fakeCgroupfs stands in for the kernel's cgroupfs in a temporary
// directory: making a group creates files, as the kernel creates a group's
// control files, and removing a group removes them. Writes land in the
// files, with two rules of v2 kept: a pid written to a group's
// cgroup.procs leaves every other group's, and a group (but the root,
// mount) that holds processes refuses to hand controllers down.
func fakeCgroupfs(files []string, mount string) dirOps {
	return dirOps{
		write: func(dir, file, value string) error {
			switch file {
			case "cgroup.procs":
				procs, _ := filepath.Glob(filepath.Join(mount, "*", "cgroup.procs"))
				for _, other := range procs {
					raw, _ := os.ReadFile(other)
					kept := strings.ReplaceAll(string(raw), value+"\n", "")
					os.WriteFile(other, []byte(kept), 0o644)
				}
				value += "\n"
			case "cgroup.subtree_control":
				if raw, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs")); dir != mount && len(raw) > 0 {
					return unix.EBUSY
				}
			}
			return writeControl(dir, file, value)
		},
		mkdir: func(path string) error {
			if err := os.Mkdir(path, 0o755); err != nil {
				return err
			}
			for _, f := range files {
				if err := os.WriteFile(filepath.Join(path, f), nil, 0o644); err != nil {
					return err
				}
			}
			return nil
		},
		rmdir: os.RemoveAll,
	}
}

// fakeHierarchy discovers and prepares a hierarchy on a fake host whose
// groups get files.
func fakeHierarchy(t *testing.T, procCgroup string, mountinfo []byte, files []string) *Hierarchy {
	t.Helper()
	h, err := discover([]byte(procCgroup), mountinfo, "ephemeral")
	if err != nil {
		t.Fatal(err)
	}
	h.lockDir = filepath.Join(t.TempDir(), "locks")
	h.fs = fakeCgroupfs(files, mountPoint(t, mountinfo))
	if err := h.prepare(); err != nil {
		t.Fatal(err)
	}
	return h
}

// mountPoint is the first mount point in mountinfo.
func mountPoint(t *testing.T, mountinfo []byte) string {
	t.Helper()
	mounts, err := parseMountinfo(mountinfo)
	if err != nil || len(mounts) == 0 {
		t.Fatalf("mountinfo: %v", err)
	}
	return mounts[0].point
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestV2WritesTheLimits(t *testing.T) {
	root, mountinfo := fakeHost(t, "1 0 0:1 / ROOT rw - cgroup2 cgroup2 rw,nsdelegate\n")
	own := filepath.Join(root, "system.slice", "ephemeral.service")
	if err := os.MkdirAll(own, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{"cgroup.controllers": "cpuset cpu io memory hugetlb pids rdma misc\n", "cgroup.subtree_control": ""} {
		if err := os.WriteFile(filepath.Join(own, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h := fakeHierarchy(t, "0::/system.slice/ephemeral.service\n", mountinfo, v2Files)
	if !h.v2 {
		t.Fatal("chose v1 on a v2 host")
	}
	sub := filepath.Join(own, "ephemeral")
	for _, dir := range []string{own, sub} {
		if got := readFile(t, filepath.Join(dir, "cgroup.subtree_control")); got != "+cpu +memory +pids +io" {
			t.Errorf("%s/cgroup.subtree_control = %q, want the controllers handed down", dir, got)
		}
	}

	const id = "0123456789ab"
	g, err := h.Create(id, Limits{CPUs: 2, MemoryBytes: 768 << 20, Tasks: 256, IOWeight: 100})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(sub, id)
	for file, want := range map[string]string{
		"cpu.max":         "200000 100000",
		"memory.max":      "805306368",
		"memory.swap.max": "0",
		"pids.max":        "256",
		"io.weight":       "default 100",
	} {
		if got := readFile(t, filepath.Join(dir, file)); got != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}
	if err := g.AddProcess(4242); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(dir, "cgroup.procs")); got != "4242\n" {
		t.Errorf("cgroup.procs = %q, want the pid", got)
	}
	if got := h.Dirs(id); !slices.Equal(got, []string{dir}) {
		t.Errorf("Dirs = %q, want the one v2 directory %s", got, dir)
	}
	if !strings.HasPrefix(h.String(), "cgroup v2: cpu quota, memory, tasks, I/O weight (io.weight)") {
		t.Errorf("String() = %q", h.String())
	}
	// The fake pid is no process in the group: nothing to kill.
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("group directory after Remove: %v", err)
	}
	if _, err := os.Stat(filepath.Join(h.lockDir, id+".lock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("owner lock file after Remove: %v", err)
	}
}

// A daemon in a v2 group of its own (a systemd service, say) moves itself
// into a leaf, so that its group may hand controllers down to the VMMs'.
func TestV2DaemonMovesIntoALeaf(t *testing.T) {
	root, mountinfo := fakeHost(t, "1 0 0:1 / ROOT rw - cgroup2 cgroup2 rw\n")
	own := filepath.Join(root, "ephemeral.service")
	if err := os.MkdirAll(own, 0o755); err != nil {
		t.Fatal(err)
	}
	pid := strconv.Itoa(os.Getpid())
	for name, content := range map[string]string{"cgroup.controllers": "cpu memory pids\n", "cgroup.subtree_control": "", "cgroup.procs": pid + "\n"} {
		if err := os.WriteFile(filepath.Join(own, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fakeHierarchy(t, "0::/ephemeral.service\n", mountinfo, v2Files)
	if got := readFile(t, filepath.Join(own, "ephemeral-daemon", "cgroup.procs")); got != pid+"\n" {
		t.Errorf("the leaf's cgroup.procs = %q, want this process %s", got, pid)
	}
	if got := readFile(t, filepath.Join(own, "cgroup.subtree_control")); got != "+cpu +memory +pids" {
		t.Errorf("the daemon's group hands down %q", got)
	}
}

func TestV2WithoutTheIOController(t *testing.T) {
	root, mountinfo := fakeHost(t, "1 0 0:1 / ROOT rw - cgroup2 cgroup2 rw\n")
	for name, content := range map[string]string{"cgroup.controllers": "cpu memory pids\n", "cgroup.subtree_control": ""} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h := fakeHierarchy(t, "0::/\n", mountinfo, v2Files)
	if got := readFile(t, filepath.Join(root, "cgroup.subtree_control")); got != "+cpu +memory +pids" {
		t.Errorf("cgroup.subtree_control = %q: want no +io where the io controller is not offered", got)
	}
	if !strings.Contains(h.String(), "no I/O weight: no io controller") {
		t.Errorf("String() = %q, want the missing I/O weight explained", h.String())
	}
}

func TestV1WritesTheLimits(t *testing.T) {
	root, mountinfo := fakeHost(t, hybridMountinfo)
	if err := os.MkdirAll(filepath.Join(root, "memory", "process_api", "e082a4"), 0o755); err != nil {
		t.Fatal(err)
	}
	// memory.memsw.* exist only with swap accounting; this host has none.
	h := fakeHierarchy(t, hybridProcCgroup, mountinfo, v1Files)
	const id = "0123456789ab"
	g, err := h.Create(id, Limits{CPUs: 1, MemoryBytes: 768 << 20, Tasks: 256, IOWeight: 100})
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		"cpu/ephemeral/" + id + "/cpu.cfs_period_us":                           "100000",
		"cpu/ephemeral/" + id + "/cpu.cfs_quota_us":                            "100000",
		"memory/process_api/e082a4/ephemeral/" + id + "/memory.limit_in_bytes": "805306368",
		"pids/ephemeral/" + id + "/pids.max":                                   "256",
		// BFQ's weight, on v2's scale, where blkio.weight is absent.
		"blkio/ephemeral/" + id + "/blkio.bfq.weight": "100",
	} {
		if got := readFile(t, filepath.Join(root, path)); got != want {
			t.Errorf("%s = %q, want %q", path, got, want)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "memory/process_api/e082a4/ephemeral", id, "memory.memsw.limit_in_bytes")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("memory.memsw.limit_in_bytes written on a host without it: %v", err)
	}
	if err := g.AddProcess(4242); err != nil {
		t.Fatal(err)
	}
	for _, dir := range h.Dirs(id) {
		if got := readFile(t, filepath.Join(dir, "cgroup.procs")); got != "4242\n" {
			t.Errorf("%s/cgroup.procs = %q, want the pid in every hierarchy", dir, got)
		}
	}
	if len(h.Dirs(id)) != 5 {
		t.Errorf("Dirs = %q, want one per mounted controller", h.Dirs(id))
	}
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	for _, dir := range h.Dirs(id) {
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after Remove: %v", dir, err)
		}
	}
}

func TestV1SwapAccountingAndBlkioWeight(t *testing.T) {
	_, mountinfo := fakeHost(t, hybridMountinfo)
	h, err := discover([]byte(hybridProcCgroup), mountinfo, "ephemeral")
	if err != nil {
		t.Fatal(err)
	}
	h.lockDir = t.TempDir()
	h.fs = fakeCgroupfs(append(slices.Clone(v1Files), "memory.memsw.limit_in_bytes", "blkio.weight"), mountPoint(t, mountinfo))
	if err := os.MkdirAll(filepath.Dir(h.memory), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := h.prepare(); err != nil {
		t.Fatal(err)
	}
	const id = "ba9876543210"
	g, err := h.Create(id, Limits{CPUs: 4, MemoryBytes: 1 << 30, Tasks: 64, IOWeight: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Remove()
	if got := readFile(t, filepath.Join(h.memory, id, "memory.memsw.limit_in_bytes")); got != "1073741824" {
		t.Errorf("memory.memsw.limit_in_bytes = %q: want memory+swap held to the memory limit", got)
	}
	// blkio.weight's scale is 10..1000 around 500: v2's default 100 is its 500.
	if got := readFile(t, filepath.Join(h.io, id, "blkio.weight")); got != "500" {
		t.Errorf("blkio.weight = %q, want 500", got)
	}
	if got := readFile(t, filepath.Join(h.cpu, id, "cpu.cfs_quota_us")); got != "400000" {
		t.Errorf("cpu.cfs_quota_us = %q, want four periods", got)
	}
}

func TestCreateRejects(t *testing.T) {
	_, mountinfo := fakeHost(t, "1 0 0:1 / ROOT rw - cgroup cgroup rw,cpu,memory,pids\n")
	h := fakeHierarchy(t, "1:cpu,memory,pids:/\n", mountinfo, v1Files)
	good := Limits{CPUs: 1, MemoryBytes: 512 << 20, Tasks: 64}
	for _, tc := range []struct {
		id     string
		limits Limits
		want   string
	}{
		{"../../etc", good, "sandbox id"},
		{"0123456789ab", Limits{MemoryBytes: 512 << 20, Tasks: 64}, "cpus 0"},
		{"0123456789ab", Limits{CPUs: 1, MemoryBytes: 1 << 20, Tasks: 64}, "memory 1048576 bytes"},
		{"0123456789ab", Limits{CPUs: 1, MemoryBytes: 512 << 20}, "tasks 0"},
		{"0123456789ab", Limits{CPUs: 1, MemoryBytes: 512 << 20, Tasks: 64, IOWeight: 20000}, "io weight 20000"},
	} {
		if g, err := h.Create(tc.id, tc.limits); err == nil || !strings.Contains(err.Error(), tc.want) {
			if g != nil {
				g.Remove()
			}
			t.Errorf("Create(%q, %+v) = %v, want an error containing %q", tc.id, tc.limits, err, tc.want)
		}
	}
	if groups, _ := filepath.Glob(filepath.Join(h.cpu, "*", "cgroup.procs")); len(groups) != 0 {
		t.Errorf("rejected groups left %q", groups)
	}
}

func TestReconcileRemovesOnlyDeadOwnersGroups(t *testing.T) {
	_, mountinfo := fakeHost(t, "1 0 0:1 / ROOT rw - cgroup cgroup rw,cpu,cpuacct,memory,pids\n")
	h := fakeHierarchy(t, "1:cpu,cpuacct,memory,pids:/\n", mountinfo, v1Files)
	limits := Limits{CPUs: 1, MemoryBytes: 512 << 20, Tasks: 64}
	const liveID, ownedID, deadID, orphanLockID = "00000000000a", "00000000000b", "00000000000c", "00000000000d"
	live, err := h.Create(liveID, limits)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Remove()
	owned, err := h.Create(ownedID, limits)
	if err != nil {
		t.Fatal(err)
	}
	defer owned.Remove()
	dead, err := h.Create(deadID, limits)
	if err != nil {
		t.Fatal(err)
	}
	// The owner dies: the kernel drops its lock, its files stay.
	dead.owner.Close()
	// A crash between the lock and the mkdir leaves a lock file alone.
	if f, err := flock.TryLock(filepath.Join(h.lockDir, orphanLockID+".lock"), flock.Exclusive); err != nil {
		t.Fatal(err)
	} else {
		f.Close()
	}
	// Not a sandbox id: not ours to touch.
	if err := os.Mkdir(filepath.Join(h.cpu, "someone-else"), 0o755); err != nil {
		t.Fatal(err)
	}

	removed, err := h.Reconcile(context.Background(), func(id string) bool { return id == liveID })
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{deadID}) {
		t.Errorf("Reconcile removed %q, want only the dead owner's %s", removed, deadID)
	}
	for id, wantExists := range map[string]bool{liveID: true, ownedID: true, deadID: false, "someone-else": true} {
		if _, err := os.Stat(filepath.Join(h.cpu, id)); (err == nil) != wantExists {
			t.Errorf("group %s: exists %v, want %v", id, err == nil, wantExists)
		}
	}
	if locks, _ := filepath.Glob(filepath.Join(h.lockDir, "*.lock")); len(locks) != 2 {
		t.Errorf("lock files after Reconcile: %q, want the two live owners'", locks)
	}
	again, err := h.Reconcile(context.Background(), func(string) bool { return false })
	if err != nil || len(again) != 0 {
		t.Errorf("second Reconcile: removed %q, %v; want nothing (the owners live)", again, err)
	}
}
