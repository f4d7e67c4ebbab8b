package vsockproto

import (
	"context"
	"errors"
	"io"
	"sync"
)

// InitialWindow is the data credit each side holds per stream and direction
// when the stream opens. Both sides use this constant, so it is part of the
// protocol: changing it needs a new ProtocolVersion.
const InitialWindow = 256 << 10

// windowUpdateThreshold batches credit returns: the receiver sends a Window
// frame once this many consumed bytes have piled up. Any value up to
// InitialWindow is deadlock free (a sender is only stalled when everything
// is buffered or consumed-but-unreturned, and an empty buffer then means at
// least the threshold is unreturned).
const windowUpdateThreshold = InitialWindow / 4

// errStreamEnded is what writes and reads see once a stream is over.
var errStreamEnded = errors.New("vsockproto: stream ended")

type chunk struct {
	typ  FrameType
	data []byte
}

// recvBuffer queues the data a peer sent on one stream until the consumer
// takes it. It never holds more than the credit it granted, which is what
// bounds receiver memory; the connection's reader only ever appends, so a
// slow consumer never stalls the connection.
type recvBuffer struct {
	mu     sync.Mutex
	ready  sync.Cond
	chunks []chunk
	// buffered is data received and not yet released by the consumer.
	buffered int
	// peerCredit is how much more the peer may send before more is granted.
	peerCredit int
	// unreturned is data released by the consumer but not yet granted back.
	unreturned int
	// end is why no more data will arrive: io.EOF for an orderly end.
	end error
	// highWater is the most ever buffered, kept so tests can check the bound.
	highWater int
}

func newRecvBuffer() *recvBuffer {
	b := &recvBuffer{peerCredit: InitialWindow}
	b.ready.L = &b.mu
	return b
}

// push queues data from the peer. Data beyond the granted credit or after
// the end is a protocol violation.
func (b *recvBuffer) push(typ FrameType, data []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.end == io.EOF:
		return protocolErrorf("%v data after the peer ended the stream", typ)
	case b.end != nil:
		return nil // this side stopped listening; late data is dropped
	}
	if len(data) > b.peerCredit {
		return protocolErrorf("%v frame of %d bytes with only %d bytes of credit", typ, len(data), b.peerCredit)
	}
	if len(data) == 0 {
		return nil
	}
	b.peerCredit -= len(data)
	b.buffered += len(data)
	b.highWater = max(b.highWater, b.buffered)
	b.chunks = append(b.chunks, chunk{typ, data})
	b.ready.Signal()
	return nil
}

// finish records that no more data will come; queued data is still
// delivered first. Only the first call counts.
func (b *recvBuffer) finish(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.end == nil {
		b.end = err
		b.ready.Broadcast()
	}
}

// next blocks until a chunk or the end is available. The chunk's bytes
// stay counted as buffered until release.
func (b *recvBuffer) next() (chunk, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for len(b.chunks) == 0 && b.end == nil {
		b.ready.Wait()
	}
	if len(b.chunks) == 0 {
		return chunk{}, b.end
	}
	c := b.chunks[0]
	b.chunks[0] = chunk{}
	b.chunks = b.chunks[1:]
	return c, nil
}

// release marks n bytes as consumed and returns how much credit to grant
// back to the peer now (0: keep batching).
func (b *recvBuffer) release(n int) uint32 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buffered -= n
	b.unreturned += n
	if b.unreturned < windowUpdateThreshold || b.end != nil {
		return 0
	}
	grant := b.unreturned
	b.unreturned = 0
	b.peerCredit += grant
	return uint32(grant)
}

// sendWindow is the credit this side holds for sending data on one stream.
type sendWindow struct {
	mu     sync.Mutex
	credit sync.Cond
	avail  int
	err    error // set once the direction is closed
	// sending serialises frame writes against close, so no data frame
	// leaves after closeAndDrain returns. It is never held while waiting
	// for credit, and mu is never held while writing to the connection.
	sending sync.Mutex
}

func newSendWindow() *sendWindow {
	w := &sendWindow{avail: InitialWindow}
	w.credit.L = &w.mu
	return w
}

// add grants n more bytes of credit. An honest peer never grants more than
// it has received, so the total can never exceed InitialWindow.
func (w *sendWindow) add(n uint32) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n == 0 {
		return protocolErrorf("window increment of 0")
	}
	if w.err != nil {
		return nil // a late grant for a direction we closed
	}
	if int64(w.avail)+int64(n) > InitialWindow {
		return protocolErrorf("window grows to %d, beyond the initial %d", int64(w.avail)+int64(n), InitialWindow)
	}
	w.avail += int(n)
	w.credit.Broadcast()
	return nil
}

// close ends the direction: blocked and later writes fail with err.
func (w *sendWindow) close(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
		w.credit.Broadcast()
	}
}

// closeAndDrain closes the direction and waits for a frame write in
// progress, so the caller can send a final frame that no data follows.
func (w *sendWindow) closeAndDrain(err error) {
	w.close(err)
	// Taking the lock is the wait: a writer holds it for a whole frame.
	w.sending.Lock()
	//lint:ignore SA2001 the empty critical section waits for the writer
	w.sending.Unlock()
}

// closeWithFrame closes the direction and sends a last frame after any data
// in flight. Closing twice sends nothing the second time.
func (w *sendWindow) closeWithFrame(fw *frameWriter, last Frame, err error) error {
	w.sending.Lock()
	defer w.sending.Unlock()
	w.mu.Lock()
	already := w.err != nil
	if !already {
		w.err = err
		w.credit.Broadcast()
	}
	w.mu.Unlock()
	if already {
		return nil
	}
	return fw.writeFrame(last)
}

// acquire waits for credit and takes up to want bytes of it.
func (w *sendWindow) acquire(want int) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.avail == 0 && w.err == nil {
		w.credit.Wait()
	}
	if w.err != nil {
		return 0, w.err
	}
	n := min(want, w.avail, MaxPayload)
	w.avail -= n
	return n, nil
}

// write sends p as data frames of type typ, blocking while the peer has
// granted no credit.
func (w *sendWindow) write(fw *frameWriter, typ FrameType, stream uint32, p []byte) (int, error) {
	written := 0
	for written < len(p) {
		n, err := w.acquire(len(p) - written)
		if err != nil {
			return written, err
		}
		if err := w.sendData(fw, Frame{Type: typ, Stream: stream, Payload: p[written : written+n]}); err != nil {
			return written, err
		}
		written += n
	}
	return written, nil
}

func (w *sendWindow) sendData(fw *frameWriter, f Frame) error {
	w.sending.Lock()
	defer w.sending.Unlock()
	w.mu.Lock()
	err := w.err
	w.mu.Unlock()
	if err != nil {
		return err
	}
	return fw.writeFrame(f)
}

// dataWriter is the io.Writer side of a stream direction.
type dataWriter struct {
	fw     *frameWriter
	win    *sendWindow
	typ    FrameType
	stream uint32
}

func (d *dataWriter) Write(p []byte) (int, error) {
	return d.win.write(d.fw, d.typ, d.stream, p)
}

// dataReader is the io.Reader side of a stream direction; it returns credit
// to the peer as the consumer reads.
type dataReader struct {
	fw     *frameWriter
	buf    *recvBuffer
	stream uint32
	rest   []byte
}

func (d *dataReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if len(d.rest) == 0 {
		c, err := d.buf.next()
		if err != nil {
			return 0, err
		}
		d.rest = c.data
	}
	n := copy(p, d.rest)
	d.rest = d.rest[n:]
	if grant := d.buf.release(n); grant > 0 {
		// A failed write means the connection is gone; the reader
		// goroutine reports that and ends the stream.
		_ = d.fw.writeFrame(uint32Frame(FrameWindow, d.stream, grant))
	}
	return n, nil
}

// onCancel runs f when ctx is cancelled, until release is called. release
// waits for a running f, so f never outlives the caller.
func onCancel(ctx context.Context, f func()) (release func()) {
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		f()
	})
	return func() {
		if !stop() {
			<-fired
		}
	}
}
