package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeralhq/ephemeral/internal/flock"
	"github.com/ephemeralhq/ephemeral/internal/sandboxid"
)

// removeTimeout bounds the wait for a group's killed processes to leave
// it: a SIGKILLed process is gone within milliseconds unless it is stuck
// in the kernel.
const removeTimeout = 10 * time.Second

// Reconcile removes the groups whose owner died, killing whatever still
// runs in them, and returns their ids. Groups that live reports (this
// process's own sandboxes) and groups whose owner lock is held, by this or
// another process, are untouched; so is anything in the subtree not named
// by a sandbox id. Running it twice is harmless.
func (h *Hierarchy) Reconcile(ctx context.Context, live func(id string) bool) ([]string, error) {
	ids, err := h.knownIDs()
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		if live(id) {
			continue
		}
		owner, err := h.lockOwner(id)
		if errors.Is(err, flock.ErrHeld) {
			continue // a live process owns it
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		existed := h.exists(id)
		err = h.remove(id)
		errs = append(errs, err, unlockOwner(owner))
		if err == nil && existed {
			removed = append(removed, id)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("cgroup: reconcile: %w", err)
	}
	return removed, nil
}

// knownIDs are the sandbox ids with a group directory or an owner lock
// file (a crash between the two leaves one without the other).
func (h *Hierarchy) knownIDs() ([]string, error) {
	var ids []string
	add := func(dir string, name func(fs.DirEntry) (string, bool)) error {
		entries, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("cgroup: reconcile: %w", err)
		}
		for _, e := range entries {
			if id, ok := name(e); ok && sandboxid.Validate(id) == nil && !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
		return nil
	}
	for _, sub := range h.subtrees() {
		if err := add(sub, func(e fs.DirEntry) (string, bool) { return e.Name(), e.IsDir() }); err != nil {
			return nil, err
		}
	}
	err := add(h.lockDir, func(e fs.DirEntry) (string, bool) { return strings.CutSuffix(e.Name(), ".lock") })
	return ids, err
}

func (h *Hierarchy) exists(id string) bool {
	for _, dir := range h.Dirs(id) {
		if _, err := os.Stat(dir); err == nil {
			return true
		}
	}
	return false
}

// remove kills what runs in id's group, waits for it to leave and removes
// the group's directories. A group that does not exist is removed already.
func (h *Hierarchy) remove(id string) error {
	deadline := time.Now().Add(removeTimeout)
	for {
		if err := h.killMembers(id); err != nil {
			return fmt.Errorf("cgroup: remove %s: %w", id, err)
		}
		busy, err := h.rmdirAll(id)
		if err != nil {
			return fmt.Errorf("cgroup: remove %s: %w", id, err)
		}
		if !busy {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup: remove %s: processes still in it %v after SIGKILL", id, removeTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// rmdirAll removes the group's directories, reporting whether one of them
// is still busy (a killed process not yet gone).
func (h *Hierarchy) rmdirAll(id string) (busy bool, err error) {
	for _, dir := range h.Dirs(id) {
		err := h.fs.rmdir(dir)
		switch {
		case err == nil, errors.Is(err, fs.ErrNotExist):
		case errors.Is(err, unix.EBUSY):
			busy = true
		default:
			return false, err
		}
	}
	return busy, nil
}

// killMembers sends SIGKILL to every process in id's group.
func (h *Hierarchy) killMembers(id string) error {
	dirs := h.Dirs(id)
	if h.v2 {
		// cgroup.kill (Linux 5.14) kills the whole group at once, also
		// what is forked meanwhile. Without it, or without the group, the
		// listing below kills one by one, or finds nobody.
		if h.fs.write(dirs[0], "cgroup.kill", "1") == nil {
			return nil
		}
	}
	var pids []int
	for _, dir := range dirs {
		raw, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		for _, f := range strings.Fields(string(raw)) {
			pid, err := strconv.Atoi(f)
			if err != nil || pid <= 1 {
				return fmt.Errorf("%s/cgroup.procs lists %q, not a pid", dir, f)
			}
			if !slices.Contains(pids, pid) {
				pids = append(pids, pid)
			}
		}
	}
	var errs []error
	for _, pid := range pids {
		errs = append(errs, h.killIfMember(pid, id))
	}
	return errors.Join(errs...)
}

// killIfMember kills pid if it is still in id's group. A pidfd pins the
// process between the check and the kill, so a process that took over the
// pid of one that left is never signalled.
func (h *Hierarchy) killIfMember(pid int, id string) error {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return os.NewSyscallError("pidfd_open", err)
	}
	defer unix.Close(pidfd)
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	suffix := "/" + h.subtree + "/" + id
	member := false
	for _, line := range strings.Split(string(raw), "\n") {
		member = member || strings.HasSuffix(line, suffix)
	}
	if !member {
		return nil
	}
	if err := unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return os.NewSyscallError("pidfd_send_signal", err)
	}
	return nil
}
