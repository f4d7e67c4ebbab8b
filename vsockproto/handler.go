package vsockproto

import (
	"context"
	"io"
)

// Handler is what the guest init plugs into Serve. Each call runs on its own
// goroutine, one per stream; ctx is cancelled when the connection closes or
// the host abandons the operation (its caller's context ended). Readers and
// writers handed to a call fail once it has returned.
type Handler interface {
	// Exec runs req to completion. Stdin delivers what the host writes
	// (io.EOF when the host closes it), Stdout and Stderr block while the
	// host has granted no credit, and Signals delivers signal numbers the
	// host sends. An error means the process could not be started at all
	// (the host sees it as a failed stream), not a non-zero exit.
	Exec(ctx context.Context, req ExecRequest, stdio ExecIO) (ExitStatus, error)
	// WriteFile creates or truncates req.Path with the bytes read from r.
	WriteFile(ctx context.Context, req FileRequest, r io.Reader) error
	// ReadFile copies req.Path to w.
	ReadFile(ctx context.Context, req FileRequest, w io.Writer) error
	// ListOutputs lists what matches the run's output patterns under the
	// scratch directory, as the worker sees it, following no symlink.
	ListOutputs(ctx context.Context, req OutputsRequest) (OutputListing, error)
	// ReadOutput copies the regular file req.Path, relative to the
	// scratch directory, to w: opened as the worker, following no
	// symlink, at most req.MaxBytes.
	ReadOutput(ctx context.Context, req FileRequest, w io.Writer) error
	// ConfigureNetwork sets up the guest interface.
	ConfigureNetwork(ctx context.Context, cfg NetConfig) error
	// Provision applies p (see Provision) and returns once all of it is in
	// effect.
	Provision(ctx context.Context, p Provision) (Provisioned, error)
	// Shutdown powers the VM off. It is called after the reply to the host
	// has been sent, so it need not return.
	Shutdown(ctx context.Context)
}

// ExecIO is the stdio of one guest process. Signals is never closed; it
// holds a small backlog, and signals beyond it are dropped while the handler
// does not receive.
type ExecIO struct {
	Stdin   io.Reader
	Stdout  io.Writer
	Stderr  io.Writer
	Signals <-chan int
}
