package worker

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

	"golang.org/x/sys/unix"
)

// CommandGroups puts each command in a cgroup (v2) of its own, so that
//   - the processes and threads one command may have at once are bounded
//     (pids.max), and a command that tries to pass the bound is killed
//     with everything it started: a fork bomb ends instead of holding the
//     guest;
//   - a command's processes can be killed at once (cgroup.kill), also
//     those that left its process group;
//   - commands share the CPU: whatever one command left running in the
//     background gets that command's share, not the whole guest.
//
// Processes a command leaves behind when it ends keep running in its group
// (a server started for later commands, say). A sweeper watches such
// groups: it kills one whose processes try to pass the bound (a fork bomb
// that went to the background) and removes one once it is empty.
type CommandGroups struct {
	root         string
	maxProcesses int
	logf         func(format string, args ...any)

	mu        sync.Mutex
	next      int
	leftovers map[string]bool // dirs of ended commands' groups, guarded by mu

	stop chan struct{}
	done chan struct{}
}

// sweepInterval is how often the sweeper looks at ended commands' groups,
// and how often a running command's group is checked against its bound.
const sweepInterval = 250 * time.Millisecond

// NewCommandGroups hands the pids and cpu controllers down from root (the
// guest's cgroup v2 mount) and starts the sweeper; Close stops it. Each
// command may have maxProcesses processes and threads at once.
func NewCommandGroups(root string, maxProcesses int, logf func(format string, args ...any)) (*CommandGroups, error) {
	if err := writeControl(filepath.Join(root, "cgroup.subtree_control"), "+pids +cpu"); err != nil {
		return nil, fmt.Errorf("worker: command cgroups: %w", err)
	}
	c := &CommandGroups{
		root: root, maxProcesses: maxProcesses, logf: logf,
		leftovers: map[string]bool{},
		stop:      make(chan struct{}), done: make(chan struct{}),
	}
	go c.sweep()
	return c, nil
}

// Close stops the sweeper and waits for it.
func (c *CommandGroups) Close() {
	close(c.stop)
	<-c.done
}

// commandGroup is one command's group.
type commandGroup struct {
	dir string
	// fd is the group's directory, for clone3's CLONE_INTO_CGROUP: the
	// command is born in its group.
	fd int
}

// create makes the group of a new command.
func (c *CommandGroups) create() (*commandGroup, error) {
	c.mu.Lock()
	c.next++
	dir := filepath.Join(c.root, "command-"+strconv.Itoa(c.next))
	c.mu.Unlock()
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("worker: command cgroup: %w", err)
	}
	if err := writeControl(filepath.Join(dir, "pids.max"), strconv.Itoa(c.maxProcesses)); err != nil {
		os.Remove(dir)
		return nil, fmt.Errorf("worker: command cgroup: %w", err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		os.Remove(dir)
		return nil, fmt.Errorf("worker: command cgroup: %w", os.NewSyscallError("open", err))
	}
	return &commandGroup{dir: dir, fd: fd}, nil
}

// discard removes the group of a command that did not start.
func (c *CommandGroups) discard(g *commandGroup) {
	unix.Close(g.fd)
	os.Remove(g.dir)
}

// release is called when the command has ended: its group goes now if it
// is empty, or once the processes left in it have ended.
func (c *CommandGroups) release(g *commandGroup) {
	unix.Close(g.fd)
	if err := os.Remove(g.dir); err == nil || errors.Is(err, fs.ErrNotExist) {
		return
	}
	c.mu.Lock()
	c.leftovers[g.dir] = true
	c.mu.Unlock()
}

// sweep watches the groups of ended commands until Close.
func (c *CommandGroups) sweep() {
	defer close(c.done)
	t := time.NewTicker(sweepInterval)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		c.mu.Lock()
		dirs := make([]string, 0, len(c.leftovers))
		for dir := range c.leftovers {
			dirs = append(dirs, dir)
		}
		c.mu.Unlock()
		for _, dir := range dirs {
			if overLimit(dir) {
				c.logf("%s: processes a command left behind tried to pass its limit of %d; killed them", filepath.Base(dir), c.maxProcesses)
				killAll(dir)
			}
			if os.Remove(dir) == nil {
				c.mu.Lock()
				delete(c.leftovers, dir)
				c.mu.Unlock()
			}
		}
	}
}

// overLimit reports whether a fork or clone in dir's group has failed for
// its pids.max.
func overLimit(dir string) bool {
	raw, err := os.ReadFile(filepath.Join(dir, "pids.events"))
	if err != nil {
		return false
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "max "); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			return err == nil && n > 0
		}
	}
	return false
}

// killAll sends SIGKILL to every process in dir's group at once, including
// any forked meanwhile.
func killAll(dir string) error {
	return writeControl(filepath.Join(dir, "cgroup.kill"), "1")
}

// writeControl writes value to a cgroup control file in one write(2).
func writeControl(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(value); err != nil {
		f.Close()
		return fmt.Errorf("write %q to %s: %w", value, path, err)
	}
	return f.Close()
}
