package vsockproto

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// maxGuestStreams bounds the streams open at once, so a runaway host cannot
// make the guest start unbounded goroutines.
const maxGuestStreams = 1024

// signalBacklog is how many signals wait for a handler that is not reading
// its Signals channel; more are dropped.
const signalBacklog = 16

// Serve runs the guest end of one connection: it sends hello, then serves
// every stream the host opens on its own goroutine calling h. It returns
// when the connection ends or ctx is cancelled, after every handler call has
// returned. A clean close by the host returns nil.
func Serve(parent context.Context, conn net.Conn, hello Hello, h Handler) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	release := onCancel(ctx, func() { conn.Close() })
	defer release()

	s := &server{
		fw:      newFrameWriter(conn),
		h:       h,
		streams: make(map[uint32]*guestStream),
	}
	err := s.run(ctx, conn, hello)
	cancel()
	conn.Close()
	s.endAll(err)
	s.handlers.Wait()

	switch {
	case parent.Err() != nil && !errors.Is(err, ErrProtocol):
		return parent.Err()
	case errors.Is(err, io.EOF):
		return nil
	}
	return err
}

type server struct {
	fw *frameWriter
	h  Handler

	mu      sync.Mutex
	streams map[uint32]*guestStream
	// lastID is the highest stream id the host opened. Ids only grow, so a
	// frame for a lower id with no stream is a late frame for a finished
	// stream, not an error.
	lastID uint32

	handlers sync.WaitGroup
}

// guestStream is the guest's state of one host operation.
type guestStream struct {
	id      uint32
	stdin   *recvBuffer // nil for operations without input
	out     *sendWindow
	signals chan int // nil except for exec
	cancel  context.CancelFunc
}

func (s *server) run(ctx context.Context, conn net.Conn, hello Hello) error {
	hello.ProtocolVersion = ProtocolVersion
	payload, err := encodePayload(hello)
	if err != nil {
		return fmt.Errorf("vsockproto: encode hello: %w", err)
	}
	if err := s.fw.writeFrame(Frame{Type: FrameHello, Payload: payload}); err != nil {
		return fmt.Errorf("vsockproto: send hello: %w", err)
	}
	r := bufio.NewReaderSize(conn, HeaderSize+MaxPayload)
	for {
		f, err := ReadFrame(r)
		if err != nil {
			return fmt.Errorf("vsockproto: read frame: %w", err)
		}
		if err := s.dispatch(ctx, f); err != nil {
			return fmt.Errorf("vsockproto: stream %d: %w", f.Stream, err)
		}
	}
}

func (s *server) dispatch(ctx context.Context, f Frame) error {
	switch f.Type {
	case FrameOpen:
		return s.open(ctx, f)
	case FrameHello, FrameStdout, FrameStderr, FrameClose:
		return protocolErrorf("unexpected %v frame from the host", f.Type)
	}
	st, err := s.lookup(f.Stream)
	if err != nil || st == nil {
		return err
	}
	switch f.Type {
	case FrameStdin, FrameCloseStdin:
		if st.stdin == nil {
			return protocolErrorf("%v on a stream without input", f.Type)
		}
		if f.Type == FrameCloseStdin {
			st.stdin.finish(io.EOF)
			return nil
		}
		return st.stdin.push(f.Type, f.Payload)
	case FrameSignal:
		sig := payloadUint32(f)
		if st.signals == nil || sig == 0 || sig > maxSignalNum {
			return protocolErrorf("signal %d on a stream that is not an exec or out of range", sig)
		}
		select {
		case st.signals <- int(sig):
		default: // the handler is not listening; see signalBacklog
		}
		return nil
	case FrameWindow:
		return st.out.add(payloadUint32(f))
	case FrameCancel:
		st.stop(context.Canceled)
	}
	return nil
}

// lookup finds a live stream. It returns nil, nil for a stream that has
// already finished.
func (s *server) lookup(id uint32) (*guestStream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.streams[id]; st != nil {
		return st, nil
	}
	if id > s.lastID {
		return nil, protocolErrorf("frame for stream %d, which was never opened", id)
	}
	return nil, nil
}

func (s *server) open(ctx context.Context, f Frame) error {
	// A request the guest cannot parse fails that stream only: the handler
	// goroutine reports it in the Close frame.
	var req openRequest
	reqErr := decodeStrict(f.Payload, &req)
	if reqErr == nil {
		reqErr = req.validate()
	}
	ctx, cancel := context.WithCancel(ctx)
	st := &guestStream{id: f.Stream, out: newSendWindow(), cancel: cancel}
	if reqErr == nil && req.hasStdin() {
		st.stdin = newRecvBuffer()
	}
	if reqErr == nil && req.Op == opExec {
		st.signals = make(chan int, signalBacklog)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case f.Stream <= s.lastID:
		cancel()
		return protocolErrorf("open reuses stream id %d (last was %d)", f.Stream, s.lastID)
	case len(s.streams) >= maxGuestStreams:
		cancel()
		return protocolErrorf("more than %d streams open", maxGuestStreams)
	}
	s.lastID = f.Stream
	s.streams[f.Stream] = st
	s.handlers.Add(1)
	go func() {
		defer s.handlers.Done()
		defer cancel()
		s.serveStream(ctx, st, req, reqErr)
	}()
	return nil
}

// serveStream runs one operation and sends its Close frame.
func (s *server) serveStream(ctx context.Context, st *guestStream, req openRequest, reqErr error) {
	var res closeResult
	if reqErr != nil {
		res.Error = "bad request: " + reqErr.Error()
	} else {
		res = s.call(ctx, st, req)
	}
	// Nothing the handler left behind may follow the Close frame.
	st.out.closeAndDrain(errStreamEnded)
	s.mu.Lock()
	delete(s.streams, st.id)
	s.mu.Unlock()
	st.stop(errStreamEnded)

	payload, err := encodePayload(res)
	if err != nil {
		payload, _ = encodePayload(closeResult{Error: "encode result: " + err.Error()})
	}
	if err := s.fw.writeFrame(Frame{Type: FrameClose, Stream: st.id, Payload: payload}); err != nil {
		return // the connection is gone; Serve is ending
	}
	if req.Op == opShutdown && reqErr == nil {
		s.h.Shutdown(ctx)
	}
}

func (s *server) call(ctx context.Context, st *guestStream, req openRequest) closeResult {
	stdout := &dataWriter{fw: s.fw, win: st.out, typ: FrameStdout, stream: st.id}
	var err error
	switch req.Op {
	case opExec:
		var status ExitStatus
		status, err = s.h.Exec(ctx, *req.Exec, ExecIO{
			Stdin:   &dataReader{fw: s.fw, buf: st.stdin, stream: st.id},
			Stdout:  stdout,
			Stderr:  &dataWriter{fw: s.fw, win: st.out, typ: FrameStderr, stream: st.id},
			Signals: st.signals,
		})
		if err == nil {
			return closeResult{Exit: &status}
		}
	case opWriteFile:
		err = s.h.WriteFile(ctx, *req.File, &dataReader{fw: s.fw, buf: st.stdin, stream: st.id})
	case opReadFile:
		err = s.h.ReadFile(ctx, *req.File, stdout)
	case opReadOutput:
		err = s.h.ReadOutput(ctx, *req.File, stdout)
	case opListOutputs:
		var l OutputListing
		if l, err = s.h.ListOutputs(ctx, *req.Outputs); err == nil {
			if len(l.Entries) > req.Outputs.MaxEntries {
				l.Entries, l.Truncated = l.Entries[:req.Outputs.MaxEntries], true
			}
			_, err = stdout.Write(encodeListing(l))
		}
	case opNetConfig:
		err = s.h.ConfigureNetwork(ctx, *req.Net)
	case opProvision:
		var done Provisioned
		done, err = s.h.Provision(ctx, *req.Provision)
		if err == nil {
			return closeResult{Provisioned: &done}
		}
	case opShutdown:
		// Acknowledged by the Close frame; serveStream then calls Shutdown.
	}
	if err != nil {
		return closeResult{Error: err.Error()}
	}
	return closeResult{}
}

// stop cancels the handler and unblocks its reads and writes.
func (st *guestStream) stop(err error) {
	st.cancel()
	if st.stdin != nil {
		st.stdin.finish(err)
	}
	st.out.close(err)
}

// endAll fails every live stream once the connection is gone.
func (s *server) endAll(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.streams {
		st.stop(fmt.Errorf("vsockproto: connection closed: %w", err))
	}
}
