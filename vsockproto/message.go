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
	"fmt"
	"time"
)

// ProtocolVersion is sent in Hello; the host refuses guests that speak
// another version.
const ProtocolVersion = 1

// Port is the AF_VSOCK port the guest init listens on.
const Port = 1024

// SerialPortName is the virtio-serial port name the guest init looks for
// when the VM has no vsock device.
const SerialPortName = "org.ephemeral.guest.0"

// Hello is the first message the guest sends on a new connection.
type Hello struct {
	ProtocolVersion int `json:"protocol_version"`
	// KernelUptime is /proc/uptime when the init was ready to serve: the
	// time from kernel start to a usable guest.
	KernelUptime time.Duration `json:"kernel_uptime_ns"`
	// InitDuration is how long the init took from its first instruction to
	// ready (mounts, modules, overlay).
	InitDuration time.Duration `json:"init_duration_ns"`
	// ScratchDir is the worker's working directory for this VM,
	// /tmp/ephemeral-run-<random>/scratch.
	ScratchDir string `json:"scratch_dir"`
	// Transport names what carries this connection ("vsock" or "serial").
	Transport string `json:"transport"`
	// KernelRelease is uname -r of the guest.
	KernelRelease string `json:"kernel_release"`
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
}
