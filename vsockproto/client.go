package vsockproto

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
)

// ErrClientClosed is returned by calls on a Client after Close.
var ErrClientClosed = errors.New("vsockproto: client closed")

// Client is the host end of a connection to a guest init. It is safe for
// concurrent use; every call opens its own stream.
type Client struct {
	conn net.Conn
	fw   *frameWriter

	helloReady chan struct{} // closed once hello is set
	hello      Hello

	opening sync.Mutex // held from id allocation until the Open frame is sent

	mu      sync.Mutex
	streams map[uint32]*hostStream
	lastID  uint32
	err     error         // why the connection ended; set once
	dead    chan struct{} // closed when err is set
	closing bool          // no new goroutines once set

	// goroutines holds the reader, one deliverer per stream and the
	// helpers that copy stdin or send a cancellation; Close waits for all.
	goroutines sync.WaitGroup
}

// NewClient starts reading from conn. The Client owns conn and closes it on
// Close or on the first protocol violation by the guest.
func NewClient(conn net.Conn) *Client {
	c := &Client{
		conn:       conn,
		fw:         newFrameWriter(conn),
		helloReady: make(chan struct{}),
		streams:    make(map[uint32]*hostStream),
		dead:       make(chan struct{}),
	}
	c.goroutines.Add(1)
	go func() {
		defer c.goroutines.Done()
		c.fail(c.readLoop())
	}()
	return c
}

// Hello waits for the guest's Hello and checks its protocol version. A
// guest speaking another version is refused and the connection closed.
func (c *Client) Hello(ctx context.Context) (Hello, error) {
	select {
	case <-c.helloReady:
	case <-c.dead:
		// A hello that arrived before the connection died still counts.
		select {
		case <-c.helloReady:
		default:
			return Hello{}, c.deadErr()
		}
	case <-ctx.Done():
		return Hello{}, ctx.Err()
	}
	if c.hello.ProtocolVersion != ProtocolVersion {
		err := fmt.Errorf("vsockproto: guest speaks protocol version %d, want %d", c.hello.ProtocolVersion, ProtocolVersion)
		c.fail(err)
		return Hello{}, err
	}
	return c.hello, nil
}

// Close closes the connection, fails every pending call and waits for the
// Client's goroutines, including a write to a caller's stdout or stderr
// that is in progress.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	c.fail(ErrClientClosed)
	c.goroutines.Wait()
	return nil
}

// Process is a guest process started by Start.
type Process struct {
	c  *Client
	st *hostStream
}

// Start starts req in the guest. Its stdout and stderr are copied to the
// given writers (nil discards) by a goroutine of the Client; a writer that
// blocks holds back the guest process, not the connection. The process's
// stdin stays open until Stdin().Close.
func (c *Client) Start(ctx context.Context, req ExecRequest, stdout, stderr io.Writer) (*Process, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	st, err := c.open(ctx, openRequest{Op: opExec, Exec: &req}, stdout, stderr)
	if err != nil {
		return nil, err
	}
	return &Process{c: c, st: st}, nil
}

// Stdin is the process's standard input. Writes block while the guest has
// granted no credit and fail once the process has exited; Close sends EOF.
func (p *Process) Stdin() io.WriteCloser { return &stdinWriter{p.c, p.st} }

// Signal sends sig to the process.
func (p *Process) Signal(sig syscall.Signal) error {
	if sig <= 0 || sig > maxSignalNum {
		return fmt.Errorf("vsockproto: signal %d out of range", sig)
	}
	select {
	case <-p.st.done:
		return fmt.Errorf("vsockproto: signal %v: process already finished", sig)
	default:
	}
	if err := p.c.fw.writeFrame(uint32Frame(FrameSignal, p.st.id, uint32(sig))); err != nil {
		return fmt.Errorf("vsockproto: signal %v: %w", sig, err)
	}
	return nil
}

// Wait waits for the process to exit and for its stdout and stderr to be
// fully written. A process that could not be started is a *GuestError; a
// failed stdout or stderr writer is reported with the exit status.
func (p *Process) Wait() (ExitStatus, error) {
	<-p.st.done
	return p.st.status, p.st.err
}

// Exec runs req to completion. stdin may be nil (the process reads EOF).
// When ctx ends first, the process is sent SIGKILL, its output is dropped
// and Exec returns ctx.Err() without waiting for the guest; stdout and
// stderr are not written after Exec returns, but a Read from stdin in
// progress may still complete.
func (c *Client) Exec(ctx context.Context, req ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (ExitStatus, error) {
	p, err := c.Start(ctx, req, stdout, stderr)
	if err != nil {
		return ExitStatus{}, err
	}
	w := p.Stdin()
	if stdin == nil {
		if err := w.Close(); err != nil {
			c.abandon(p.st, false)
			return ExitStatus{}, err
		}
	} else if !c.spawn(func() {
		// Errors show up in the process's result: a copy cut short by
		// the process's exit is normal, a dead connection fails the stream.
		_, _ = io.Copy(w, stdin)
		_ = w.Close()
	}) {
		c.abandon(p.st, false)
		return ExitStatus{}, ErrClientClosed
	}
	if err := c.await(ctx, p.st, true); err != nil {
		return ExitStatus{}, err
	}
	return p.Wait()
}

// WriteFile creates or truncates req.Path in the guest with the bytes of r.
// When ctx ends first the guest is told to abandon the write.
func (c *Client) WriteFile(ctx context.Context, req FileRequest, r io.Reader) error {
	st, err := c.open(ctx, openRequest{Op: opWriteFile, File: &req}, nil, nil)
	if err != nil {
		return err
	}
	release := onCancel(ctx, func() { st.in.close(ctx.Err()) })
	w := &stdinWriter{c, st}
	_, copyErr := io.Copy(w, r)
	if copyErr == nil {
		copyErr = w.Close()
	}
	release()
	switch {
	case ctx.Err() != nil:
		c.abandon(st, false)
		return ctx.Err()
	case copyErr != nil && !errors.Is(copyErr, errStreamEnded):
		// The source failed: make the guest drop the partial file.
		c.abandon(st, false)
		return fmt.Errorf("vsockproto: write file %s: %w", req.Path, copyErr)
	}
	// errStreamEnded means the guest answered early; its answer says why.
	return c.result(ctx, st)
}

// ReadFile copies req.Path from the guest to w. w is not written after
// ReadFile returns.
func (c *Client) ReadFile(ctx context.Context, req FileRequest, w io.Writer) error {
	st, err := c.open(ctx, openRequest{Op: opReadFile, File: &req}, w, nil)
	if err != nil {
		return err
	}
	return c.result(ctx, st)
}

// ConfigureNetwork sets up the guest's network interface.
func (c *Client) ConfigureNetwork(ctx context.Context, cfg NetConfig) error {
	st, err := c.open(ctx, openRequest{Op: opNetConfig, Net: &cfg}, nil, nil)
	if err != nil {
		return err
	}
	return c.result(ctx, st)
}

// Provision makes the guest unique and current (see Provision) and returns
// its acknowledgement. Send it first on a connection and nothing else
// before it has returned.
func (c *Client) Provision(ctx context.Context, p Provision) (Provisioned, error) {
	st, err := c.open(ctx, openRequest{Op: opProvision, Provision: &p}, nil, nil)
	if err != nil {
		return Provisioned{}, err
	}
	if err := c.result(ctx, st); err != nil {
		return Provisioned{}, err
	}
	return *st.result.Provisioned, nil
}

// Shutdown asks the guest to power off. It returns once the guest has
// acknowledged; the connection drops when the VM is gone.
func (c *Client) Shutdown(ctx context.Context) error {
	st, err := c.open(ctx, openRequest{Op: opShutdown}, nil, nil)
	if err != nil {
		return err
	}
	return c.result(ctx, st)
}

// hostStream is the host's state of one operation.
type hostStream struct {
	id  uint32
	op  string
	out *recvBuffer // stdout and stderr, in the guest's order
	in  *sendWindow // stdin; closed from the start for operations without input

	// writeMu is held around every write to stdout or stderr, so that
	// abandon can wait out a write in progress and then stop all writes.
	writeMu   sync.Mutex
	stdout    io.Writer
	stderr    io.Writer
	abandoned bool

	result closeResult // set by the reader before out ends with errClosedByGuest

	done   chan struct{} // closed after status and err are final
	status ExitStatus
	err    error
}

func (c *Client) open(ctx context.Context, req openRequest, stdout, stderr io.Writer) (*hostStream, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := req.validate(); err != nil {
		return nil, fmt.Errorf("vsockproto: %s: %w", req.Op, err)
	}
	payload, err := encodePayload(req)
	if err != nil {
		return nil, fmt.Errorf("vsockproto: %s: %w", req.Op, err)
	}
	st := &hostStream{
		op:     req.Op,
		out:    newRecvBuffer(),
		in:     newSendWindow(),
		stdout: orDiscard(stdout),
		stderr: orDiscard(stderr),
		done:   make(chan struct{}),
	}
	if !req.hasStdin() {
		st.in.close(errStreamEnded)
	}

	// The guest requires ids to grow on the wire, so allocating an id and
	// sending its Open frame happen together.
	c.opening.Lock()
	defer c.opening.Unlock()
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, c.deadErr()
	}
	c.lastID++
	st.id = c.lastID
	c.streams[st.id] = st
	c.goroutines.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.goroutines.Done()
		c.deliver(st)
	}()

	if err := c.fw.writeFrame(Frame{Type: FrameOpen, Stream: st.id, Payload: payload}); err != nil {
		err = fmt.Errorf("vsockproto: %s: %w", req.Op, err)
		c.fail(err)
		return nil, err
	}
	return st, nil
}

// deliver copies a stream's data to the caller's writers and returns
// credit to the guest after each write, which is the backpressure: the
// guest can run at most InitialWindow ahead of the slowest writer.
func (c *Client) deliver(st *hostStream) {
	var writeErr error
	for {
		ch, err := st.out.next()
		if err != nil {
			st.finish(err, writeErr)
			return
		}
		if err := st.write(ch); err != nil && writeErr == nil {
			writeErr = err
		}
		if grant := st.out.release(len(ch.data)); grant > 0 {
			// A failed write means the connection is gone; the reader
			// notices and ends this stream.
			_ = c.fw.writeFrame(uint32Frame(FrameWindow, st.id, grant))
		}
	}
}

// write hands one chunk to the caller's writer unless the caller has gone
// or the writer already failed (then the data is dropped, so the guest is
// never blocked by a writer nobody reads).
func (st *hostStream) write(ch chunk) error {
	st.writeMu.Lock()
	defer st.writeMu.Unlock()
	if st.abandoned {
		return nil
	}
	w, name := st.stdout, "stdout"
	if ch.typ == FrameStderr {
		w, name = st.stderr, "stderr"
	}
	if _, err := w.Write(ch.data); err != nil {
		st.stdout, st.stderr = io.Discard, io.Discard
		return fmt.Errorf("vsockproto: %s: write %s: %w", st.op, name, err)
	}
	return nil
}

// errClosedByGuest ends a stream's output when the guest's Close frame
// arrived; any other end is a failed connection.
var errClosedByGuest = errors.New("vsockproto: stream closed by the guest")

// finish settles the stream's outcome from why its output ended.
func (st *hostStream) finish(end, writeErr error) {
	switch {
	case end != errClosedByGuest:
		st.err = end
	case st.result.Error != "":
		st.err = &GuestError{Op: st.op, Message: st.result.Error}
	default:
		if st.result.Exit != nil {
			st.status = *st.result.Exit
		}
		st.err = writeErr
	}
	close(st.done)
}

// await waits for the guest to close st and returns nil, or ctx.Err() when
// ctx ends first; then the stream is abandoned (and, for an exec, the
// process killed).
func (c *Client) await(ctx context.Context, st *hostStream, kill bool) error {
	select {
	case <-st.done:
		return nil
	default:
	}
	select {
	case <-st.done:
		return nil
	case <-ctx.Done():
		c.abandon(st, kill)
		return ctx.Err()
	}
}

// result waits for an operation without output of its own and returns its
// outcome.
func (c *Client) result(ctx context.Context, st *hostStream) error {
	if err := c.await(ctx, st, false); err != nil {
		return err
	}
	return st.err
}

// abandon stops all delivery to the caller's writers, fails stdin writes,
// and tells the guest to give up on the stream. The frames go out on a
// goroutine of the Client, so an unresponsive guest cannot delay the
// caller.
func (c *Client) abandon(st *hostStream, kill bool) {
	st.writeMu.Lock()
	st.abandoned = true
	st.writeMu.Unlock()
	st.in.close(context.Canceled)
	select {
	case <-st.done:
		return
	default:
	}
	c.spawn(func() {
		// A stdin frame already on its way must not follow the Cancel.
		st.in.closeAndDrain(context.Canceled)
		if kill {
			if err := c.fw.writeFrame(uint32Frame(FrameSignal, st.id, uint32(syscall.SIGKILL))); err != nil {
				return
			}
		}
		_ = c.fw.writeFrame(Frame{Type: FrameCancel, Stream: st.id})
	})
}

// spawn runs f on a goroutine that Close waits for; it refuses once Close
// has begun.
func (c *Client) spawn(f func()) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return false
	}
	c.goroutines.Add(1)
	go func() {
		defer c.goroutines.Done()
		f()
	}()
	return true
}

func (c *Client) readLoop() error {
	r := bufio.NewReaderSize(c.conn, HeaderSize+MaxPayload)
	helloSeen := false
	for {
		f, err := ReadFrame(r)
		if err != nil {
			return fmt.Errorf("vsockproto: read frame: %w", err)
		}
		if f.Type == FrameHello || !helloSeen {
			if err := c.receiveHello(f, helloSeen); err != nil {
				return err
			}
			helloSeen = true
			continue
		}
		if err := c.dispatch(f); err != nil {
			return fmt.Errorf("vsockproto: stream %d: %w", f.Stream, err)
		}
	}
}

func (c *Client) receiveHello(f Frame, seen bool) error {
	switch {
	case seen:
		return fmt.Errorf("vsockproto: %w", protocolErrorf("second hello"))
	case f.Type != FrameHello:
		return fmt.Errorf("vsockproto: %w", protocolErrorf("%v frame before hello", f.Type))
	}
	var h Hello
	if err := decodeStrict(f.Payload, &h); err != nil {
		return fmt.Errorf("vsockproto: %w", protocolErrorf("hello payload: %v", err))
	}
	c.hello = h
	close(c.helloReady)
	return nil
}

func (c *Client) dispatch(f Frame) error {
	c.mu.Lock()
	st := c.streams[f.Stream]
	c.mu.Unlock()
	if st == nil {
		// The host forgets a stream only after the guest's Close, which is
		// the guest's last frame on it.
		return protocolErrorf("%v frame for unknown stream", f.Type)
	}
	switch f.Type {
	case FrameStdout, FrameStderr:
		if !hasStdout(st.op) || (st.op != opExec && f.Type != FrameStdout) {
			return protocolErrorf("%v frame on a %s stream", f.Type, st.op)
		}
		return st.out.push(f.Type, f.Payload)
	case FrameWindow:
		return st.in.add(payloadUint32(f))
	case FrameClose:
		res, err := decodeCloseResult(st.op, f.Payload)
		if err != nil {
			return err
		}
		c.mu.Lock()
		delete(c.streams, f.Stream)
		c.mu.Unlock()
		st.in.close(errStreamEnded)
		st.result = res
		st.out.finish(errClosedByGuest)
		return nil
	}
	return protocolErrorf("unexpected %v frame from the guest", f.Type)
}

// fail records the first reason the connection ended, closes it and ends
// every stream.
func (c *Client) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	close(c.dead)
	streams := c.streams
	c.streams = nil
	c.mu.Unlock()

	c.conn.Close()
	streamErr := c.deadErr()
	for _, st := range streams {
		st.in.close(streamErr)
		st.out.finish(streamErr)
	}
}

func (c *Client) deadErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if errors.Is(c.err, ErrClientClosed) {
		return c.err
	}
	return fmt.Errorf("vsockproto: connection lost: %w", c.err)
}

// stdinWriter feeds a stream's input direction.
type stdinWriter struct {
	c  *Client
	st *hostStream
}

func (w *stdinWriter) Write(p []byte) (int, error) {
	return w.st.in.write(w.c.fw, FrameStdin, w.st.id, p)
}

// Close sends EOF after everything written so far.
func (w *stdinWriter) Close() error {
	return w.st.in.closeWithFrame(w.c.fw, Frame{Type: FrameCloseStdin, Stream: w.st.id}, errStreamEnded)
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}
