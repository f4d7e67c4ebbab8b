package vsockproto

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Operation names carried in an Open frame.
const (
	opExec        = "exec"
	opWriteFile   = "write_file"
	opReadFile    = "read_file"
	opListOutputs = "list_outputs"
	opReadOutput  = "read_output"
	opNetConfig   = "net_config"
	opProvision   = "provision"
	opShutdown    = "shutdown"
	maxSignalNum  = 64 // highest Linux real-time signal
)

// openRequest is the payload of an Open frame: the operation and its
// request, with exactly the matching field set.
type openRequest struct {
	Op        string          `json:"op"`
	Exec      *ExecRequest    `json:"exec,omitempty"`
	File      *FileRequest    `json:"file,omitempty"`
	Net       *NetConfig      `json:"net,omitempty"`
	Outputs   *OutputsRequest `json:"outputs,omitempty"`
	Provision *Provision      `json:"provision,omitempty"`
}

func (r *openRequest) validate() error {
	want := map[string]bool{"exec": r.Exec != nil, "file": r.File != nil, "net": r.Net != nil, "outputs": r.Outputs != nil, "provision": r.Provision != nil}
	var needs string
	switch r.Op {
	case opExec:
		needs = "exec"
	case opWriteFile, opReadFile, opReadOutput:
		needs = "file"
	case opListOutputs:
		needs = "outputs"
	case opNetConfig:
		needs = "net"
	case opProvision:
		needs = "provision"
	case opShutdown:
	default:
		return fmt.Errorf("unknown operation %q", r.Op)
	}
	for field, set := range want {
		if set && field != needs {
			return fmt.Errorf("%s request carries a %q field", r.Op, field)
		}
		if !set && field == needs {
			return fmt.Errorf("%s request lacks its %q field", r.Op, field)
		}
	}
	switch {
	case r.Exec != nil:
		return r.Exec.Validate()
	case r.Outputs != nil:
		return r.Outputs.Validate()
	case r.Op == opReadOutput && (r.File.Path == "" || r.File.Path[0] == '/'):
		return errors.New("read output: the path must be relative to the scratch directory")
	case r.Net != nil:
		return r.Net.Validate()
	case r.Provision != nil:
		return r.Provision.Validate()
	case r.File != nil && r.File.Path == "":
		return errors.New("file request: empty path")
	case r.File != nil && r.File.MaxBytes < 0:
		return fmt.Errorf("file request: negative max_bytes %d", r.File.MaxBytes)
	}
	return nil
}

// hasStdin reports whether the host sends data to the guest on this
// operation's stream.
func (r *openRequest) hasStdin() bool { return r.Op == opExec || r.Op == opWriteFile }

// hasStdout reports whether the guest sends data to the host on this
// operation's stream (stdout only, except for an exec).
func hasStdout(op string) bool {
	return op == opExec || op == opReadFile || op == opReadOutput || op == opListOutputs
}

// closeResult is the payload of a Close frame.
type closeResult struct {
	// Exit is set when an exec ran; it is absent for other operations and
	// for execs that failed to start.
	Exit *ExitStatus `json:"exit,omitempty"`
	// Provisioned is set when a provision succeeded, and only then.
	Provisioned *Provisioned `json:"provisioned,omitempty"`
	// Error is the guest's reason for failing the operation.
	Error string `json:"error,omitempty"`
}

// GuestError is an operation the guest reported as failed: a process that
// could not be started, a file that could not be read, and so on. A
// non-zero exit is not a GuestError.
type GuestError struct {
	Op      string
	Message string
}

func (e *GuestError) Error() string { return "guest " + e.Op + ": " + e.Message }

// decodeStrict unmarshals one JSON value, refusing unknown fields and
// trailing data: both sides speak the same protocol version, so anything
// extra is a bug or an attack.
func decodeStrict(payload []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("trailing data after JSON value")
	}
	return nil
}

// encodePayload marshals v for a frame, refusing what does not fit in one.
func encodePayload(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if len(b) > MaxPayload {
		return nil, fmt.Errorf("encoded request is %d bytes, more than the %d a frame holds", len(b), MaxPayload)
	}
	return b, nil
}

// decodeCloseResult parses a guest's Close payload for an operation.
func decodeCloseResult(op string, payload []byte) (closeResult, error) {
	var res closeResult
	if err := decodeStrict(payload, &res); err != nil {
		return res, protocolErrorf("close payload: %v", err)
	}
	switch {
	case res.Exit != nil && res.Error != "":
		return res, protocolErrorf("close carries both exit and error")
	case op == opExec && res.Exit == nil && res.Error == "":
		return res, protocolErrorf("exec closed without exit status or error")
	case op != opExec && res.Exit != nil:
		return res, protocolErrorf("%s closed with an exit status", op)
	case res.Provisioned != nil && (op != opProvision || res.Error != ""):
		return res, protocolErrorf("%s closed with a provisioning result", op)
	case op == opProvision && res.Provisioned == nil && res.Error == "":
		return res, protocolErrorf("provision closed without its result or an error")
	case res.Exit != nil && (res.Exit.Signal < 0 || res.Exit.Signal > maxSignalNum || res.Exit.Duration < 0):
		return res, protocolErrorf("implausible exit status %+v", *res.Exit)
	}
	return res, nil
}
