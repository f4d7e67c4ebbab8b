// Package limits is the contract on a guest's resource limits between the
// host, which chooses them, and the guest init, which applies them: the
// host puts them on the guest kernel's command line (Params), the init
// reads them back from /proc/cmdline (Parse) before it mounts anything.
//
// Every filesystem a guest can write is a tmpfs, held in the guest's RAM:
// the scratch directory, /tmp, the root filesystem's overlay (home, /var
// and the rest), /dev/shm and /run. Each has a size, and together they
// must leave the guest room to run its commands (Validate), so that a
// command that fills one gets ENOSPC rather than the guest running out of
// memory. The number of processes each command may have is bounded too,
// and that of the unprivileged users (the worker running the commands), so
// that a fork bomb ends instead of taking the guest down.
package limits

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Limits are the sizes of what a guest may write and the number of
// processes its commands may have.
type Limits struct {
	// ScratchMiB is the size of the scratch directory, where commands run.
	ScratchMiB int
	// TmpMiB is the size of /tmp (the scratch directory is a filesystem
	// of its own inside it).
	TmpMiB int
	// OverlayMiB is the size of the root filesystem's writable layer:
	// whatever commands write outside /tmp, /dev/shm and /run, their home
	// directory included.
	OverlayMiB int
	// CommandProcesses bounds the processes and threads one command may
	// have at once, with everything it started (its cgroup's pids.max):
	// a command that tries to pass it is killed, with all of them.
	CommandProcesses int
}

// UserProcesses bounds the processes and threads an unprivileged user may
// have at once across all of its commands (RLIMIT_NPROC): room for four
// commands at their limit. Root, and so the init, is exempt.
func (l Limits) UserProcesses() int { return 4 * l.CommandProcesses }

// Sizes of the guest's other writable filesystems, fixed: /dev/shm for
// POSIX shared memory (Python's multiprocessing), /run for the init's own
// files (commands cannot write there).
const (
	ShmMiB = 32
	RunMiB = 8
)

// ReservedMiB is the guest memory Validate keeps free of filesystems: the
// kernel, the init and the commands' own processes. An idle guest uses
// about 50 MiB of it.
const ReservedMiB = 128

// Defaults are the limits of a 512 MiB guest, the sandboxes' default size.
func Defaults() Limits {
	return Limits{ScratchMiB: 128, TmpMiB: 64, OverlayMiB: 96, CommandProcesses: 256}
}

// Kernel command line parameter names.
const (
	scratchParam   = "ephemeral.scratch_mib"
	tmpParam       = "ephemeral.tmp_mib"
	overlayParam   = "ephemeral.overlay_mib"
	processesParam = "ephemeral.command_nproc"
)

// fields pairs each parameter with its field.
func (l *Limits) fields() []struct {
	param string
	value *int
} {
	return []struct {
		param string
		value *int
	}{
		{scratchParam, &l.ScratchMiB},
		{tmpParam, &l.TmpMiB},
		{overlayParam, &l.OverlayMiB},
		{processesParam, &l.CommandProcesses},
	}
}

// FilesystemsMiB is the RAM the guest's filesystems may hold together.
func (l Limits) FilesystemsMiB() int {
	return l.ScratchMiB + l.TmpMiB + l.OverlayMiB + ShmMiB + RunMiB
}

// Validate reports every limit that is not positive, and filesystems that
// together would not leave ReservedMiB of a guest of memoryMiB.
func (l Limits) Validate(memoryMiB int) error {
	var errs []error
	for _, f := range l.fields() {
		if *f.value <= 0 {
			errs = append(errs, fmt.Errorf("%s %d: want a positive value", f.param, *f.value))
		}
	}
	if room := memoryMiB - ReservedMiB; l.FilesystemsMiB() > room {
		errs = append(errs, fmt.Errorf("scratch %d + /tmp %d + overlay %d + /dev/shm %d + /run %d MiB of filesystems leave less than %d MiB of a %d MiB guest for its processes: lower the sizes or give the guest more memory",
			l.ScratchMiB, l.TmpMiB, l.OverlayMiB, ShmMiB, RunMiB, ReservedMiB, memoryMiB))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("guest limits: %w", err)
	}
	return nil
}

// Params is l as kernel command line parameters.
func (l Limits) Params() string {
	var params []string
	for _, f := range l.fields() {
		params = append(params, f.param+"="+strconv.Itoa(*f.value))
	}
	return strings.Join(params, " ")
}

// Parse reads the limits from a kernel command line. A limit the command
// line does not name keeps its default; one that is not a positive number
// is an error. Other parameters are not its business.
func Parse(cmdline string) (Limits, error) {
	l := Defaults()
	for _, param := range strings.Fields(cmdline) {
		name, value, _ := strings.Cut(param, "=")
		for _, f := range l.fields() {
			if name != f.param {
				continue
			}
			n, err := strconv.Atoi(value)
			if err != nil || n <= 0 {
				return Limits{}, fmt.Errorf("guest limits: %s=%.40q: want a positive number", name, value)
			}
			*f.value = n
		}
	}
	return l, nil
}
