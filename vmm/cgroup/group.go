package cgroup

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ephemeralhq/ephemeral/internal/flock"
)

// Group is one sandbox's group: the VMM process is added to it, and it is
// removed with whatever still runs in it. Its methods are safe for
// concurrent use.
type Group struct {
	h      *Hierarchy
	id     string
	limits Limits
	owner  *os.File

	removeOnce sync.Once
	removeErr  error
}

// Create makes the group of sandbox id with limits l and holds its owner
// lock until Remove. For an id whose group exists already (a dead owner's
// leftover) it takes the group over and sets its limits again.
func (h *Hierarchy) Create(id string, l Limits) (_ *Group, err error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	if err := l.validate(); err != nil {
		return nil, fmt.Errorf("cgroup: limits: %w", err)
	}
	owner, err := h.lockOwner(id)
	if err != nil {
		return nil, err
	}
	g := &Group{h: h, id: id, limits: l, owner: owner}
	defer func() {
		if err != nil {
			err = errors.Join(err, g.Remove())
		}
	}()
	for _, dir := range h.Dirs(id) {
		if err := h.fs.mkdir(dir); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("cgroup: create group %s: %w", id, err)
		}
	}
	if err := g.set(l); err != nil {
		return nil, fmt.Errorf("cgroup: set limits of %s: %w", id, err)
	}
	return g, nil
}

// control is one write of a limit.
type control struct {
	dir, file, value string
	// optional files are skipped where the kernel has none (no swap
	// accounting, say).
	optional bool
}

// set writes l into the group's control files.
func (g *Group) set(l Limits) error {
	h := g.h
	quota := strconv.Itoa(l.CPUs * cpuPeriodMicros)
	memory := strconv.FormatInt(l.MemoryBytes, 10)
	var writes []control
	if h.v2 {
		writes = []control{
			{h.cpu, "cpu.max", quota + " " + strconv.Itoa(cpuPeriodMicros), false},
			{h.memory, "memory.max", memory, false},
			{h.memory, "memory.swap.max", "0", true},
			{h.pids, "pids.max", strconv.Itoa(l.Tasks), false},
		}
	} else {
		writes = []control{
			{h.cpu, "cpu.cfs_period_us", strconv.Itoa(cpuPeriodMicros), false},
			{h.cpu, "cpu.cfs_quota_us", quota, false},
			// memory+swap must stay at least memory: lift it first, so
			// that setting the group again with more memory works too.
			{h.memory, "memory.memsw.limit_in_bytes", "-1", true},
			{h.memory, "memory.limit_in_bytes", memory, false},
			{h.memory, "memory.memsw.limit_in_bytes", memory, true},
			{h.pids, "pids.max", strconv.Itoa(l.Tasks), false},
		}
	}
	if l.IOWeight > 0 && h.ioWeight != nil {
		writes = append(writes, control{h.io, h.ioWeight.name, h.ioWeight.format(l.IOWeight), false})
	}
	for _, w := range writes {
		dir := filepath.Join(w.dir, g.id)
		if w.optional {
			if _, err := os.Stat(filepath.Join(dir, w.file)); errors.Is(err, fs.ErrNotExist) {
				continue
			}
		}
		if err := h.fs.write(dir, w.file, w.value); err != nil {
			return err
		}
	}
	return nil
}

// Limits are the limits the group was created with.
func (g *Group) Limits() Limits { return g.limits }

// AddProcess moves process pid, with all its threads, into the group.
// Threads and children it starts afterwards are born in it.
func (g *Group) AddProcess(pid int) error {
	for _, dir := range g.h.Dirs(g.id) {
		if err := g.h.fs.write(dir, "cgroup.procs", strconv.Itoa(pid)); err != nil {
			return fmt.Errorf("cgroup: add pid %d to %s: %w", pid, g.id, err)
		}
	}
	return nil
}

// CPUTime is the CPU time the group's processes have used, in all modes.
func (g *Group) CPUTime() (time.Duration, error) {
	if g.h.v2 {
		usec, err := readKeyed(filepath.Join(g.h.cpu, g.id, "cpu.stat"), "usage_usec")
		return time.Duration(usec) * time.Microsecond, err
	}
	if g.h.cpuacct == "" {
		return 0, errors.New("cgroup: cpu time: the cpuacct controller is not mounted")
	}
	ns, err := readInt(filepath.Join(g.h.cpuacct, g.id, "cpuacct.usage"))
	return time.Duration(ns), err
}

// MemoryPeak is the most memory the group has been charged at once.
func (g *Group) MemoryPeak() (int64, error) {
	name := "memory.max_usage_in_bytes"
	if g.h.v2 {
		name = "memory.peak"
	}
	return readInt(filepath.Join(g.h.memory, g.id, name))
}

// OOMKills is how many processes of the group the kernel killed for
// passing its memory limit.
func (g *Group) OOMKills() (int64, error) {
	name := "memory.oom_control"
	if g.h.v2 {
		name = "memory.events"
	}
	return readKeyed(filepath.Join(g.h.memory, g.id, name), "oom_kill")
}

// Remove kills whatever still runs in the group, removes it and releases
// its owner lock. It is idempotent.
func (g *Group) Remove() error {
	g.removeOnce.Do(func() {
		g.removeErr = errors.Join(g.h.remove(g.id), unlockOwner(g.owner))
	})
	return g.removeErr
}

// lockOwner takes the owner lock of id's group without waiting: while
// another Group holds it, in this or another process, the error wraps
// flock.ErrHeld. The kernel drops the lock when its holder dies, however
// it dies, which is what tells Reconcile a dead owner's group.
func (h *Hierarchy) lockOwner(id string) (*os.File, error) {
	if err := os.MkdirAll(h.lockDir, 0o700); err != nil {
		return nil, fmt.Errorf("cgroup: owner lock dir: %w", err)
	}
	f, err := flock.TryLock(filepath.Join(h.lockDir, id+".lock"), flock.Exclusive)
	if err != nil {
		return nil, fmt.Errorf("cgroup: owner of %s: %w", id, err)
	}
	return f, nil
}

// unlockOwner removes the lock file while still holding the lock, so that
// nobody can be holding a lock on a file that is about to vanish.
func unlockOwner(f *os.File) error {
	err := os.Remove(f.Name())
	if errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	return errors.Join(err, f.Close())
}

// writeControl writes value to a control file in one write(2), as
// cgroupfs wants. It never creates the file.
func writeControl(dir, file, value string) error {
	f, err := os.OpenFile(filepath.Join(dir, file), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(value); err != nil {
		f.Close()
		return fmt.Errorf("write %q to %s: %w", value, f.Name(), err)
	}
	return f.Close()
}

func readInt(path string) (int64, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("cgroup: %w", err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cgroup: %s: %w", path, err)
	}
	return n, nil
}

// readKeyed reads the value of key from a flat-keyed control file
// ("key value" per line, as cpu.stat or memory.events).
func readKeyed(path, key string) (int64, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("cgroup: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), " ")
		if k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("cgroup: %s: %s: %w", path, key, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("cgroup: %s: no %s", path, key)
}
