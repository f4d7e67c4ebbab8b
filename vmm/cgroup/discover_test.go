package cgroup

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// hybridMountinfo is this project's development machines: cgroup v1
// controllers each on their own mount, and an empty unified hierarchy.
const hybridMountinfo = `31 23 0:28 / ROOT rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / ROOT/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / ROOT/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / ROOT/memory rw,relatime - cgroup cgroup rw,memory
38 31 0:35 / ROOT/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / ROOT/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / ROOT/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / ROOT/unified rw,relatime - cgroup2 cgroup2 rw
`

// hybridProcCgroup puts the process in a memory group of its own, as the
// development machines' sessions are.
const hybridProcCgroup = `9:name=systemd:/
8:pids:/
7:blkio:/
4:memory:/process_api/e082a4
2:cpuacct:/
1:cpu:/
0::/
`

// fakeHost writes mountinfo with ROOT replaced by a temporary directory
// and creates the mount points; it returns the directory and the text.
func fakeHost(t *testing.T, mountinfo string) (string, []byte) {
	t.Helper()
	root := t.TempDir()
	text := strings.ReplaceAll(mountinfo, "ROOT", root)
	mounts, err := parseMountinfo([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		if err := os.MkdirAll(m.point, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root, []byte(text)
}

func TestDiscoverV1NestsBelowTheProcessGroups(t *testing.T) {
	root, mountinfo := fakeHost(t, hybridMountinfo)
	// The unified hierarchy of a hybrid host offers no controllers.
	if err := os.WriteFile(filepath.Join(root, "unified", "cgroup.controllers"), []byte("\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h, err := discover([]byte(hybridProcCgroup), mountinfo, "ephemeral")
	if err != nil {
		t.Fatal(err)
	}
	if h.v2 {
		t.Fatal("chose v2 on a hybrid host whose unified hierarchy has no controllers")
	}
	want := map[string]string{
		"cpu":     filepath.Join(root, "cpu", "ephemeral"),
		"cpuacct": filepath.Join(root, "cpuacct", "ephemeral"),
		"memory":  filepath.Join(root, "memory", "process_api", "e082a4", "ephemeral"),
		"pids":    filepath.Join(root, "pids", "ephemeral"),
		"io":      filepath.Join(root, "blkio", "ephemeral"),
	}
	got := map[string]string{"cpu": h.cpu, "cpuacct": h.cpuacct, "memory": h.memory, "pids": h.pids, "io": h.io}
	for c, dir := range want {
		if got[c] != dir {
			t.Errorf("%s subtree %s, want %s", c, got[c], dir)
		}
	}
}

func TestDiscoverV1CoMountedControllersShareADirectory(t *testing.T) {
	root, mountinfo := fakeHost(t, `1 0 0:1 / ROOT/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
2 0 0:2 / ROOT/memory rw - cgroup cgroup rw,memory
3 0 0:3 / ROOT/pids rw - cgroup cgroup rw,pids
`)
	h, err := discover([]byte("3:pids:/job\n2:memory:/job\n1:cpu,cpuacct:/job\n"), mountinfo, "vmms")
	if err != nil {
		t.Fatal(err)
	}
	cpu := filepath.Join(root, "cpu,cpuacct", "job", "vmms")
	if h.cpu != cpu || h.cpuacct != cpu {
		t.Errorf("cpu %s, cpuacct %s: want both %s", h.cpu, h.cpuacct, cpu)
	}
	if len(h.subtrees()) != 3 {
		t.Errorf("subtrees %q: want one per mount", h.subtrees())
	}
	if h.io != "" || !strings.Contains(h.ioSkip, "blkio") {
		t.Errorf("io %q, skip reason %q: want none, said", h.io, h.ioSkip)
	}
}

// In a container the mount shows only the container's own subtree, and
// /proc/self/cgroup may still name the full path.
func TestDiscoverMountOfASubtree(t *testing.T) {
	root, mountinfo := fakeHost(t, `1 0 0:1 /docker/abc ROOT rw - cgroup2 cgroup2 rw
`)
	if err := os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("cpuset cpu io memory pids\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h, err := discover([]byte("0::/docker/abc\n"), mountinfo, "ephemeral")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(root, "ephemeral"); !h.v2 || h.cpu != want || h.io != want {
		t.Errorf("v2 %v, subtree %s, io %s: want v2 at %s", h.v2, h.cpu, h.io, want)
	}
	if _, err := discover([]byte("0::/elsewhere\n"), mountinfo, "ephemeral"); err == nil || !strings.Contains(err.Error(), "outside") {
		t.Errorf("a group outside the mounted subtree: %v, want an error saying so", err)
	}
}

func TestDiscoverSaysWhatIsMissing(t *testing.T) {
	_, mountinfo := fakeHost(t, `1 0 0:1 / ROOT/cpu rw - cgroup cgroup rw,cpu
2 0 0:2 / ROOT/memory rw - cgroup cgroup rw,memory
`)
	_, err := discover([]byte("3:pids:/\n2:memory:/\n1:cpu:/\n0::/\n"), mountinfo, "ephemeral")
	if err == nil || !strings.Contains(err.Error(), "controller pids is not mounted") || !strings.Contains(err.Error(), "no cgroup2 mount") {
		t.Errorf("discover without pids: %v, want an error naming pids and v2's absence", err)
	}
	for _, bad := range []string{"", "a/b", "..", ".hidden"} {
		if _, err := discover(nil, nil, bad); err == nil {
			t.Errorf("subtree %q accepted", bad)
		}
	}
}

func TestUnescapeMountPath(t *testing.T) {
	for in, want := range map[string]string{
		`/sys/fs/cgroup/cpu`:    "/sys/fs/cgroup/cpu",
		`/mnt/with\040space`:    "/mnt/with space",
		`/tab\011and\134slash`:  "/tab\tand\\slash",
		`/not\9an\escape\04`:    `/not\9an\escape\04`,
		`/trailing\`:            `/trailing\`,
		`/cpu\054cpuacct/inner`: "/cpu,cpuacct/inner",
	} {
		if got := unescapeMountPath(in); got != want {
			t.Errorf("unescapeMountPath(%q) = %q, want %q", in, got, want)
		}
	}
}
