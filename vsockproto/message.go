// Package vsockproto is the wire protocol between the host and the guest init
// of an Ephemeral microVM, and the transports that carry it.
//
// One byte stream connects host and guest (AF_VSOCK, Cloud Hypervisor hybrid
// vsock, or a virtio-serial port). It carries frames with a fixed header
// (type, stream id, length). Streams are opened by the host, one per
// operation (an exec, a file transfer, a network change, a shutdown), and any
// number of them may be open at once. Data on a stream is flow-controlled by
// credit: a side may only send as many data bytes as the peer has granted, so
// a guest that floods stdout blocks in write(2) instead of growing host memory.
//
// Stream ids are chosen by the host and only grow, so the guest can tell a
// late frame for a finished stream from a frame for a stream never opened.
// A stream ends with the guest's Close frame, which carries the result and
// follows all of the stream's output. A host that gives up on an operation
// sends Cancel (and, for an exec, SIGKILL first).
//
// Everything received from the guest is hostile input: the decoder checks
// lengths against MaxPayload before allocating and rejects unknown frame
// types; a protocol violation closes the connection.
package vsockproto

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// ProtocolVersion is sent in Hello; the host refuses guests that speak
// another version. Version 2 added Provision and took the scratch
// directory out of Hello.
const ProtocolVersion = 2

// Port is the AF_VSOCK port the guest init listens on.
const Port = 1024

// SerialPortName is the virtio-serial port name the guest init looks for
// when the VM has no vsock device.
const SerialPortName = "org.ephemeral.guest.0"

// WaitingForHost is the line the guest init prints on its console once it
// has booted and waits for its host's first connection. A snapshot taken
// after it (and before the host connected) restores into a guest that
// greets whoever connects first.
const WaitingForHost = "ephemeral-init: waiting for the host"

// Hello is the first message the guest sends on a new connection. It is
// composed before the guest waits for its host, so a guest restored from a
// snapshot sends the snapshot's Hello: nothing in it may tell clones apart.
type Hello struct {
	ProtocolVersion int `json:"protocol_version"`
	// KernelUptime is /proc/uptime when the init was ready to serve: the
	// time from kernel start to a usable guest.
	KernelUptime time.Duration `json:"kernel_uptime_ns"`
	// InitDuration is how long the init took from its first instruction to
	// ready (mounts, modules, overlay).
	InitDuration time.Duration `json:"init_duration_ns"`
	// Transport names what carries this connection ("vsock" or "serial").
	Transport string `json:"transport"`
	// KernelRelease is uname -r of the guest.
	KernelRelease string `json:"kernel_release"`
}

// Provision makes a guest unique and current. The host sends it as the
// first operation on a connection, to a cold-booted guest and to a clone
// restored from a snapshot alike (a clone's memory is the snapshot's, down
// to the kernel's random state and its clock), and runs nothing in the
// guest before the guest has acknowledged it. The guest applies all of it
// before acknowledging.
type Provision struct {
	// Entropy is mixed into the kernel's input pool and credited; the
	// guest then reseeds the kernel's CRNG, so that nothing drawn from it
	// afterwards repeats what another clone draws.
	Entropy []byte `json:"entropy"`
	// Time is the host's clock as it sent the request; the guest sets its
	// wall clock to it.
	Time time.Time `json:"time"`
	// Hostname and MachineID (/etc/machine-id: 32 lowercase hex digits)
	// name this VM and no other.
	Hostname  string `json:"hostname"`
	MachineID string `json:"machine_id"`
	// ScratchName makes the worker's scratch directory
	// /tmp/ephemeral-run-<ScratchName>/scratch.
	ScratchName string `json:"scratch_name"`
}

// Bounds of a Provision.
const (
	// MinProvisionEntropy is a full seed of the kernel's CRNG (256 bits).
	MinProvisionEntropy = 32
	maxProvisionEntropy = 512
	maxHostnameLen      = 63
	machineIDLen        = 32
	minScratchNameLen   = 6
	maxScratchNameLen   = 32
)

// Validate reports whether p is complete and safe to apply: names the
// guest turns into paths or kernel settings are checked character by
// character.
func (p *Provision) Validate() error {
	var errs []error
	if n := len(p.Entropy); n < MinProvisionEntropy || n > maxProvisionEntropy {
		errs = append(errs, fmt.Errorf("entropy of %d bytes, want %d..%d", n, MinProvisionEntropy, maxProvisionEntropy))
	}
	if p.Time.IsZero() {
		errs = append(errs, errors.New("no time"))
	}
	if !isHostname(p.Hostname) {
		errs = append(errs, fmt.Errorf("hostname %.80q: want 1..%d lowercase letters, digits and inner hyphens", p.Hostname, maxHostnameLen))
	}
	if len(p.MachineID) != machineIDLen || !allOf(p.MachineID, "0123456789abcdef") || p.MachineID == zeroMachineID {
		errs = append(errs, fmt.Errorf("machine id %.80q: want %d lowercase hex digits, not all zero", p.MachineID, machineIDLen))
	}
	if n := len(p.ScratchName); n < minScratchNameLen || n > maxScratchNameLen || !allOf(p.ScratchName, alphanumerics) {
		errs = append(errs, fmt.Errorf("scratch name %.80q: want %d..%d letters and digits", p.ScratchName, minScratchNameLen, maxScratchNameLen))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("provision: %w", err)
	}
	return nil
}

const (
	alphanumerics = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	zeroMachineID = "00000000000000000000000000000000"
)

func isHostname(s string) bool {
	return len(s) >= 1 && len(s) <= maxHostnameLen && allOf(s, "abcdefghijklmnopqrstuvwxyz0123456789-") &&
		s[0] != '-' && s[len(s)-1] != '-'
}

// allOf reports whether every byte of s is one of chars.
func allOf(s, chars string) bool {
	return strings.Trim(s, chars) == ""
}

// Provisioned is the guest's acknowledgement of a Provision.
type Provisioned struct {
	// ScratchDir is the worker's working directory for this VM, made from
	// the Provision's ScratchName.
	ScratchDir string `json:"scratch_dir"`
}

// ExecRequest starts a process in the guest. Exactly one of Argv and Shell
// is set.
type ExecRequest struct {
	// Argv is executed directly (PATH lookup of Argv[0]).
	Argv []string `json:"argv,omitempty"`
	// Shell is run as `/bin/bash -c Shell`.
	Shell string `json:"shell,omitempty"`
	// Env is added to the default environment (PATH, HOME, LANG, USER) as
	// KEY=VALUE entries; later entries win.
	Env []string `json:"env,omitempty"`
	// Dir is the working directory; empty means the scratch dir.
	Dir string `json:"dir,omitempty"`
	// User is the account to run as; empty means "worker".
	User string `json:"user,omitempty"`
	// Timeout kills the process group when it elapses; 0 means none.
	Timeout time.Duration `json:"timeout_ns,omitempty"`
}

// Validate reports whether the request is well formed.
func (r *ExecRequest) Validate() error {
	switch {
	case len(r.Argv) == 0 && r.Shell == "":
		return fmt.Errorf("exec request: neither argv nor shell set")
	case len(r.Argv) > 0 && r.Shell != "":
		return fmt.Errorf("exec request: both argv and shell set")
	case len(r.Argv) > 0 && r.Argv[0] == "":
		return fmt.Errorf("exec request: empty program name")
	case r.Timeout < 0:
		return fmt.Errorf("exec request: negative timeout %v", r.Timeout)
	}
	return nil
}

// ExitStatus is how a guest process ended.
type ExitStatus struct {
	// Code is the exit code, or -1 when the process was killed by a signal.
	Code int `json:"code"`
	// Signal is the number of the signal that killed the process, or 0.
	Signal int `json:"signal,omitempty"`
	// TimedOut is set when the request's timeout killed the process group.
	TimedOut bool `json:"timed_out,omitempty"`
	// ProcessLimit, when not 0, is the number of processes and threads
	// the command tried to pass: the guest killed it, and everything it
	// had started, for that.
	ProcessLimit int `json:"process_limit,omitempty"`
	// Duration is the wall time from start to exit, measured in the guest.
	Duration time.Duration `json:"duration_ns"`
}

// FileRequest names a file for WriteFile or ReadFile.
type FileRequest struct {
	Path string `json:"path"`
	// Mode is the permission bits of a written file (default 0644).
	Mode uint32 `json:"mode,omitempty"`
	// User owns a written file; empty means "worker".
	User string `json:"user,omitempty"`
	// MaxBytes bounds a read; the guest fails the read of a larger file.
	MaxBytes int64 `json:"max_bytes,omitempty"`
}

// NetConfig configures the guest's network interface. The guest never gets
// a resolver.
type NetConfig struct {
	// Interface is the guest device name, normally "eth0".
	Interface string `json:"interface"`
	// Address is the guest address in CIDR form, e.g. "10.200.0.2/30".
	Address string `json:"address"`
	// Gateway is the default route's next hop; empty means no default route.
	Gateway string `json:"gateway,omitempty"`
	MTU     int    `json:"mtu,omitempty"`
	// MAC, when set, replaces the interface's hardware address before it
	// comes up. A clone restored from a snapshot would otherwise keep the
	// snapshot's.
	MAC string `json:"mac,omitempty"`
}

// Validate reports whether the MAC, if set, is a unicast Ethernet address;
// the guest checks the rest against its interfaces.
func (c *NetConfig) Validate() error {
	if c.MAC == "" {
		return nil
	}
	mac, err := net.ParseMAC(c.MAC)
	if err != nil || len(mac) != 6 || mac[0]&1 != 0 {
		return fmt.Errorf("net config: mac %.40q: want a unicast Ethernet address", c.MAC)
	}
	return nil
}

// OutputsRequest asks the guest which entries under the scratch directory
// match a run's output patterns (path.Match syntax, one pattern element per
// path element). The guest walks only the directories the patterns lead
// into, never through a symbolic link, with the worker's permissions.
type OutputsRequest struct {
	Patterns []string `json:"patterns"`
	// MaxEntries bounds the listing; the guest stops there and marks it
	// truncated.
	MaxEntries int `json:"max_entries"`
}

// Limits of an OutputsRequest.
const (
	MaxOutputPatterns    = 64
	MaxOutputEntries     = 10_000
	maxOutputPatternSize = 4096
)

// Validate reports whether the request is well formed.
func (r *OutputsRequest) Validate() error {
	switch {
	case len(r.Patterns) == 0 || len(r.Patterns) > MaxOutputPatterns:
		return fmt.Errorf("outputs request: %d patterns, want 1 to %d", len(r.Patterns), MaxOutputPatterns)
	case r.MaxEntries < 1 || r.MaxEntries > MaxOutputEntries:
		return fmt.Errorf("outputs request: max_entries %d, want 1 to %d", r.MaxEntries, MaxOutputEntries)
	}
	for i, p := range r.Patterns {
		if p == "" || len(p) > maxOutputPatternSize || p[0] == '/' {
			return fmt.Errorf("outputs request: pattern %d must be a relative path of 1 to %d bytes", i, maxOutputPatternSize)
		}
		for _, e := range strings.Split(p, "/") {
			if e == "" || e == "." || e == ".." {
				return fmt.Errorf("outputs request: pattern %d must be clean and stay in the scratch directory", i)
			}
		}
	}
	return nil
}

// Kinds of an OutputEntry.
const (
	OutputFile    = "file"
	OutputDir     = "dir"
	OutputSymlink = "symlink"
	OutputOther   = "other" // a device, FIFO or socket
	OutputError   = "error" // could not be examined; Error says why
)

// OutputEntry is one match of an output pattern. The guest names what it
// found; the host decides what to copy, and checks everything again.
type OutputEntry struct {
	// Pattern is the index of the pattern that matched.
	Pattern int `json:"pattern"`
	// Path is relative to the scratch directory, slash-separated. An
	// entry with fewer elements than its pattern is a directory on the
	// way that could not be entered (a symlink or an error).
	Path string `json:"path"`
	Kind string `json:"kind"`
	// Size is a file's size when it was listed; it may change before it
	// is read, and the host never relies on it.
	Size  int64  `json:"size,omitempty"`
	Error string `json:"error,omitempty"`
}

// OutputListing is the guest's answer to an OutputsRequest: entries in
// pattern order, each pattern's sorted by path.
type OutputListing struct {
	Entries []OutputEntry
	// Truncated is set when more entries matched than MaxEntries.
	Truncated bool
}
