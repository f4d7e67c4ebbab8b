// Package cgroup confines VMM processes with Linux control groups. Each
// sandbox's VMM runs in a group of its own, <daemon's group>/<subtree>/<id>,
// with a CPU quota, a memory limit, a limit on its processes and threads and
// an I/O weight, so that a guest that spins every vCPU or touches all of its
// RAM takes no more of the host than its share. Both hierarchies are
// supported: cgroup v2 where the host has it with the controllers
// available, otherwise cgroup v1's cpu, memory and pids controllers (and
// cpuacct and blkio where mounted).
//
// The groups are made below the group the daemon runs in (read from
// /proc/self/cgroup), not at the root of each hierarchy, so that they nest
// in whatever confines the daemon itself: a container, a CI job, a systemd
// service. Each group's owner holds a lock file for the group's life, so
// that Reconcile, in any process, can remove the groups of owners that died
// without touching live ones.
package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ephemeralhq/ephemeral/internal/sandboxid"
)

// DefaultSubtree names the group, below the daemon's own, that holds the
// VMMs' groups.
const DefaultSubtree = "ephemeral"

// ownerLockRoot holds a directory of owner lock files per subtree (see
// Hierarchy.lockOwner).
const ownerLockRoot = "/run/ephemeral/cgroup"

// cpuPeriodMicros is the CFS period the CPU quota is measured in: 100 ms,
// the kernel's default.
const cpuPeriodMicros = 100_000

// Limits are what one group may take of the host.
type Limits struct {
	// CPUs is the CPU time the group may use per period, in CPUs: a
	// group of 2 gets at most two CPUs' worth, however many threads it
	// runs.
	CPUs int
	// MemoryBytes bounds the memory charged to the group (anonymous
	// memory and the page cache it fills); past it the kernel reclaims,
	// then kills the VMM. Swap is not allowed where the host has any.
	MemoryBytes int64
	// Tasks bounds the group's processes and threads (pids.max).
	Tasks int
	// IOWeight is the group's share of block I/O against its siblings,
	// on cgroup v2's scale: 1..10000, 100 the default. 0 leaves it
	// alone. Where the host's I/O scheduler has no weights it is skipped
	// (Hierarchy.String says so).
	IOWeight int
}

// MinMemoryBytes is the smallest memory limit Create accepts: less could
// not even hold a VMM's own code.
const MinMemoryBytes = 32 << 20

func (l Limits) validate() error {
	var errs []error
	if l.CPUs < 1 {
		errs = append(errs, fmt.Errorf("cpus %d: want at least 1", l.CPUs))
	}
	if l.MemoryBytes < MinMemoryBytes {
		errs = append(errs, fmt.Errorf("memory %d bytes: want at least %d", l.MemoryBytes, MinMemoryBytes))
	}
	if l.Tasks < 1 {
		errs = append(errs, fmt.Errorf("tasks %d: want at least 1", l.Tasks))
	}
	if l.IOWeight < 0 || l.IOWeight > 10000 {
		errs = append(errs, fmt.Errorf("io weight %d: want 0 (unset) or 1..10000", l.IOWeight))
	}
	return errors.Join(errs...)
}

// Hierarchy is where this process makes its VMMs' groups: the subtree
// directory below its own group, in every controller it uses. It is safe
// for concurrent use.
type Hierarchy struct {
	v2      bool
	subtree string
	// The subtree's directory in each controller's hierarchy. Under v2
	// they are all the same directory; under v1 controllers mounted
	// together share one. cpuacct and io may be "" (not available).
	cpu, cpuacct, memory, pids, io string
	// ioWeight sets the I/O weight; nil where there is none (ioSkip
	// says why).
	ioWeight *weightFile
	ioSkip   string
	// lockDir holds the owner lock files, <id>.lock.
	lockDir string
	// fs makes and removes group directories: the kernel's cgroupfs,
	// or a test's stand-in.
	fs dirOps
}

// weightFile is a control file that sets a proportional I/O weight, and
// how a weight on v2's scale is written to it.
type weightFile struct {
	name   string
	format func(weight int) string
}

// dirOps are the operations whose effect differs between cgroupfs and an
// ordinary directory: making a group creates its control files, removing
// it needs only rmdir, and the kernel may refuse a write.
type dirOps struct {
	mkdir func(path string) error
	rmdir func(path string) error
	// write writes value to the control file dir/file.
	write func(dir, file, value string) error
}

var kernelDirOps = dirOps{
	mkdir: func(path string) error { return os.Mkdir(path, 0o755) },
	rmdir: os.Remove,
	write: writeControl,
}

// Detect finds this process's groups, makes the subtree below them and
// returns it. It fails, saying why, where the host has neither a usable
// cgroup v2 nor cgroup v1's cpu, memory and pids controllers, or where
// this process may not create groups (it is not root, or cgroupfs is
// read-only, as in many containers).
func Detect(subtree string) (*Hierarchy, error) {
	procCgroup, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	h, err := discover(procCgroup, mountinfo, subtree)
	if err != nil {
		return nil, err
	}
	h.lockDir = filepath.Join(ownerLockRoot, subtree)
	h.fs = kernelDirOps
	if err := h.prepare(); err != nil {
		return nil, err
	}
	return h, nil
}

// requiredControllers are those the limits need; cpuacct and the I/O
// controller are used where available.
var requiredControllers = []string{"cpu", "memory", "pids"}

// discover reads which hierarchy to use and where the subtree goes from
// the texts of /proc/self/cgroup and /proc/self/mountinfo. It touches no
// group; prepare does.
func discover(procCgroup, mountinfo []byte, subtree string) (*Hierarchy, error) {
	if subtree == "" || subtree != filepath.Base(subtree) || strings.HasPrefix(subtree, ".") {
		return nil, fmt.Errorf("cgroup: subtree %q: want a plain directory name", subtree)
	}
	mounts, err := parseMountinfo(mountinfo)
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	own, err := ownGroups(procCgroup)
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	h, v2err := discoverV2(mounts, own, subtree)
	if v2err == nil {
		return h, nil
	}
	h, v1err := discoverV1(mounts, own, subtree)
	if v1err == nil {
		return h, nil
	}
	return nil, fmt.Errorf("cgroup: no usable hierarchy: v2: %w; v1: %w", v2err, v1err)
}

// discoverV2 uses the unified hierarchy where this process's group there
// offers the cpu, memory and pids controllers. On hybrid hosts the
// unified hierarchy is mounted too, but without them.
func discoverV2(mounts []mount, own map[string]string, subtree string) (*Hierarchy, error) {
	group, ok := own[""]
	if !ok {
		return nil, errors.New("this process is in no v2 group")
	}
	for _, m := range mounts {
		if !m.v2 {
			continue
		}
		dir, err := groupDir(m, group)
		if err != nil {
			return nil, err
		}
		raw, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
		if err != nil {
			return nil, err
		}
		available := strings.Fields(string(raw))
		for _, c := range requiredControllers {
			if !slices.Contains(available, c) {
				return nil, fmt.Errorf("%s offers no %s controller (controllers: %q)", dir, c, available)
			}
		}
		sub := filepath.Join(dir, subtree)
		h := &Hierarchy{v2: true, subtree: subtree, cpu: sub, cpuacct: sub, memory: sub, pids: sub}
		if slices.Contains(available, "io") {
			h.io = sub
		} else {
			h.ioSkip = "no io controller in " + dir
		}
		return h, nil
	}
	return nil, errors.New("no cgroup2 mount")
}

// discoverV1 finds the mount of each v1 controller.
func discoverV1(mounts []mount, own map[string]string, subtree string) (*Hierarchy, error) {
	h := &Hierarchy{subtree: subtree}
	dirOf := func(controller string) (string, error) {
		group, ok := own[controller]
		if !ok {
			return "", fmt.Errorf("this process is in no %s group", controller)
		}
		for _, m := range mounts {
			if !m.v2 && m.has(controller) {
				dir, err := groupDir(m, group)
				if err != nil {
					return "", err
				}
				return filepath.Join(dir, subtree), nil
			}
		}
		return "", fmt.Errorf("controller %s is not mounted", controller)
	}
	var errs []error
	for _, c := range []struct {
		name string
		dir  *string
	}{{"cpu", &h.cpu}, {"memory", &h.memory}, {"pids", &h.pids}} {
		dir, err := dirOf(c.name)
		errs = append(errs, err)
		*c.dir = dir
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	// Optional: CPU accounting for CPUTime, and I/O weights.
	h.cpuacct, _ = dirOf("cpuacct")
	var err error
	if h.io, err = dirOf("blkio"); err != nil {
		h.ioSkip = err.Error()
	}
	return h, nil
}

// prepare makes the subtree directories and, under v2, hands the
// controllers down to the groups below it.
func (h *Hierarchy) prepare() error {
	for _, dir := range h.subtrees() {
		if err := h.fs.mkdir(dir); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("cgroup: create subtree: %w", err)
		}
	}
	if h.v2 {
		if err := h.enableControllers(); err != nil {
			return err
		}
	}
	h.ioWeight = nil
	if h.io == "" {
		return nil
	}
	// Proportional weights exist only with a scheduler that has them;
	// the file shows in groups below the subtree as it shows in it.
	for _, w := range weightFiles[h.v2] {
		if _, err := os.Stat(filepath.Join(h.io, w.name)); err == nil {
			h.ioWeight = &w
			return nil
		}
	}
	h.ioSkip = fmt.Sprintf("no %s in %s (the block I/O scheduler has no proportional weights)", weightNames(h.v2), h.io)
	return nil
}

// weightFiles are the I/O weight files in the order they are preferred,
// by hierarchy (v2 is true). blkio.weight is on a scale of 10..1000 with
// 500 the default; the BFQ files and io.weight are on v2's.
var weightFiles = map[bool][]weightFile{
	true: {
		{"io.weight", func(w int) string { return fmt.Sprintf("default %d", w) }},
		{"io.bfq.weight", func(w int) string { return fmt.Sprintf("default %d", min(w, 1000)) }},
	},
	false: {
		{"blkio.weight", func(w int) string { return fmt.Sprint(min(max(w*5, 10), 1000)) }},
		{"blkio.bfq.weight", func(w int) string { return fmt.Sprint(min(w, 1000)) }},
	},
}

func weightNames(v2 bool) string {
	var names []string
	for _, w := range weightFiles[v2] {
		names = append(names, w.name)
	}
	return strings.Join(names, " or ")
}

// enableControllers writes "+cpu +memory +pids [+io]" to the
// subtree_control of this process's group and of the subtree.
//
// A v2 group that holds processes cannot hand controllers down, the root
// excepted (the "no internal processes" rule), and this process is in its
// group: then it moves itself into a leaf beside the subtree, as systemd
// expects of a service with Delegate=yes that makes groups of its own.
// Other processes in the group (a shell that started the daemon) still
// keep the controllers from being handed down.
func (h *Hierarchy) enableControllers() error {
	enable := "+cpu +memory +pids"
	if h.io != "" {
		enable += " +io"
	}
	own := filepath.Dir(h.cpu)
	err := h.fs.write(own, "cgroup.subtree_control", enable)
	if errors.Is(err, unix.EBUSY) {
		leaf := filepath.Join(own, h.subtree+"-daemon")
		if err := h.fs.mkdir(leaf); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("cgroup: create a leaf for this process: %w", err)
		}
		if err := h.fs.write(leaf, "cgroup.procs", strconv.Itoa(os.Getpid())); err != nil {
			return fmt.Errorf("cgroup: move this process into %s: %w", leaf, err)
		}
		err = h.fs.write(own, "cgroup.subtree_control", enable)
	}
	if err != nil {
		return fmt.Errorf("cgroup: enable controllers below %s: %w (a v2 group holding processes cannot hand controllers down: run the daemon in a group of its own, e.g. a systemd unit with Delegate=yes)", own, err)
	}
	if err := h.fs.write(h.cpu, "cgroup.subtree_control", enable); err != nil {
		return fmt.Errorf("cgroup: enable controllers below %s: %w", h.cpu, err)
	}
	return nil
}

// subtrees are the distinct subtree directories, one per hierarchy.
func (h *Hierarchy) subtrees() []string {
	var dirs []string
	for _, d := range []string{h.cpu, h.cpuacct, h.memory, h.pids, h.io} {
		if d != "" && !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// String describes what the groups limit, for logs and benchmarks, e.g.
// "cgroup v1: cpu quota, memory, tasks, I/O weight (blkio.bfq.weight)".
func (h *Hierarchy) String() string {
	version := "v1"
	if h.v2 {
		version = "v2"
	}
	s := "cgroup " + version + ": cpu quota, memory, tasks"
	if h.ioWeight != nil {
		return s + ", I/O weight (" + h.ioWeight.name + ")"
	}
	return s + "; no I/O weight: " + h.ioSkip
}

// Dirs are the directories of id's group, one per hierarchy in use: the
// group exists while any of them does.
func (h *Hierarchy) Dirs(id string) []string {
	var dirs []string
	for _, d := range h.subtrees() {
		dirs = append(dirs, filepath.Join(d, id))
	}
	return dirs
}

func validID(id string) error {
	if err := sandboxid.Validate(id); err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	return nil
}
