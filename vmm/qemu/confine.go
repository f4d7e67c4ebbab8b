package qemu

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
)

// VMMUser is the unprivileged system user QEMU switches to once it has
// opened its devices and files; tools/install-deps.sh creates it. A guest
// that escapes into QEMU's device emulation then holds this user, not root.
const VMMUser = "ephemeral-vmm"

// confinement is what limits a QEMU process on this host beyond the VM
// boundary itself.
//
// Always: QEMU's seccomp filter (-sandbox), which also stops it from
// executing programs or forking. Where VMMUser exists: -runas VMMUser and
// -chroot into the VM's private directory, both applied by QEMU after it has
// opened the kernel, initrd, root disk and /dev/kvm and written its pid file,
// and before the guest runs: the driver starts QEMU paused (-S) and lets the
// guest CPUs go over QMP only once /proc shows QEMU switched.
type confinement struct {
	// runAs is VMMUser, or "" where it does not exist and QEMU stays root.
	runAs string
	// uid is runAs's user id, as /proc/<pid>/status shows it.
	uid string
}

// probeConfinement looks VMMUser up; its absence is not an error, only a
// weaker confinement that Driver.Confinement reports.
func probeConfinement() (confinement, error) {
	u, err := user.Lookup(VMMUser)
	var unknown user.UnknownUserError
	if errors.As(err, &unknown) {
		return confinement{}, nil
	}
	if err != nil {
		return confinement{}, fmt.Errorf("qemu: look up user %s: %w", VMMUser, err)
	}
	return confinement{runAs: VMMUser, uid: u.Uid}, nil
}

// String describes c for people choosing whether to trust this host with
// guests, e.g. in the boot benchmark's header.
func (c confinement) String() string {
	if c.runAs == "" {
		return fmt.Sprintf("seccomp, runs as root: no user %s (run tools/install-deps.sh as root)", VMMUser)
	}
	return "seccomp, runs as " + c.runAs + " in a chroot"
}

// sandboxOption is the value of QEMU's -sandbox option: its seccomp filter
// with every optional group of system calls denied that QEMU can do
// without.
func (c confinement) sandboxOption() string {
	opt := "on,obsolete=deny,spawn=deny,resourcecontrol=deny"
	if c.runAs == "" {
		// QEMU installs the filter before it applies -runas, and both
		// elevateprivileges=deny and =children filter the very setgid and
		// setuid calls -runas makes: QEMU would die of SIGSYS. Once it has
		// switched, every uid and gid is the user's and no capability is
		// left, so the set*id calls cannot regain anything anyway.
		opt += ",elevateprivileges=deny"
	}
	return opt
}

// switched reports whether process pid runs as c's user: real, effective,
// saved and filesystem uid all the user's, as -runas leaves them. Where c
// keeps QEMU root there is nothing to wait for.
func (c confinement) switched(pid int) (bool, error) {
	if c.runAs == "" {
		return true, nil
	}
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false, fmt.Errorf("qemu: check user switch: %w", err)
	}
	uids, err := statusField(status, "Uid")
	if err != nil {
		return false, fmt.Errorf("qemu: check user switch of pid %d: %w", pid, err)
	}
	ids := strings.Fields(uids)
	if len(ids) != 4 {
		return false, fmt.Errorf("qemu: check user switch of pid %d: Uid %q: want 4 ids", pid, uids)
	}
	for _, id := range ids {
		if id != c.uid {
			return false, nil
		}
	}
	return true, nil
}

// statusField returns the value of the line "name:\tvalue" in the text of
// a /proc/<pid>/status file.
func statusField(status []byte, name string) (string, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		if value, ok := strings.CutPrefix(sc.Text(), name+":"); ok {
			return strings.TrimSpace(value), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("no %s line", name)
}
