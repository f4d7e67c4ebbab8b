package vsockproto

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
)

// HeaderSize is the length of the fixed frame header: type (1 byte),
// stream id (4 bytes, big endian), payload length (4 bytes, big endian).
const HeaderSize = 9

// MaxPayload is the largest payload a frame may carry. The decoder rejects
// a larger length before allocating, so one frame never costs the receiver
// more than this.
const MaxPayload = 64 << 10

// FrameType says what a frame carries and which side may send it.
type FrameType uint8

// Frame types. Data frames (Stdin, Stdout, Stderr) consume flow-control
// credit; all others do not.
const (
	// FrameHello is the guest's JSON Hello, on stream 0, first frame of a
	// connection.
	FrameHello FrameType = iota + 1
	// FrameOpen starts a stream (host to guest): JSON openRequest.
	FrameOpen
	// FrameStdin carries a process's stdin or a written file's bytes
	// (host to guest).
	FrameStdin
	// FrameStdout carries a process's stdout or a read file's bytes (guest
	// to host).
	FrameStdout
	// FrameStderr carries a process's stderr (guest to host).
	FrameStderr
	// FrameCloseStdin ends the stdin direction (host to guest, empty).
	FrameCloseStdin
	// FrameSignal asks the guest to signal a process (host to guest, uint32).
	FrameSignal
	// FrameWindow grants the peer more data credit on a stream (either
	// direction, uint32 increment).
	FrameWindow
	// FrameClose ends a stream with its JSON closeResult (guest to host).
	FrameClose
	// FrameCancel tells the guest the host abandoned a stream: the handler's
	// context is cancelled (host to guest, empty).
	FrameCancel
	lastFrameType = FrameCancel
)

var frameTypeNames = [...]string{
	FrameHello:      "hello",
	FrameOpen:       "open",
	FrameStdin:      "stdin",
	FrameStdout:     "stdout",
	FrameStderr:     "stderr",
	FrameCloseStdin: "close-stdin",
	FrameSignal:     "signal",
	FrameWindow:     "window",
	FrameClose:      "close",
	FrameCancel:     "cancel",
}

func (t FrameType) String() string {
	if t >= 1 && t <= lastFrameType {
		return frameTypeNames[t]
	}
	return fmt.Sprintf("frame-type-%d", uint8(t))
}

// fixedPayload is the exact payload length of types that carry a fixed-size
// value, or -1.
func (t FrameType) fixedPayload() int {
	switch t {
	case FrameCloseStdin, FrameCancel:
		return 0
	case FrameSignal, FrameWindow:
		return 4
	}
	return -1
}

// Frame is one unit on the wire.
type Frame struct {
	Type    FrameType
	Stream  uint32
	Payload []byte
}

// ErrProtocol marks every violation of the protocol by the peer; the
// connection is closed when one is seen.
var ErrProtocol = errors.New("protocol violation")

func protocolErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrProtocol, fmt.Sprintf(format, args...))
}

// checkHeader validates everything the header alone decides, so a bad
// frame is refused before its payload is read or allocated.
func checkHeader(t FrameType, stream uint32, length uint32) error {
	switch {
	case t < 1 || t > lastFrameType:
		return protocolErrorf("unknown frame type %d", uint8(t))
	case length > MaxPayload:
		return protocolErrorf("%v frame of %d bytes exceeds the %d byte maximum", t, length, MaxPayload)
	case t == FrameHello && stream != 0:
		return protocolErrorf("hello on stream %d, want stream 0", stream)
	case t != FrameHello && stream == 0:
		return protocolErrorf("%v frame on stream 0", t)
	}
	if want := t.fixedPayload(); want >= 0 && int(length) != want {
		return protocolErrorf("%v frame with %d byte payload, want %d", t, length, want)
	}
	return nil
}

// ReadFrame reads one frame. It returns io.EOF only when r ends cleanly
// between frames; a frame cut short is io.ErrUnexpectedEOF. Invalid headers
// are errors wrapping ErrProtocol.
func ReadFrame(r *bufio.Reader) (Frame, error) {
	var hdr [HeaderSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return Frame{}, err
	}
	f := Frame{
		Type:   FrameType(hdr[0]),
		Stream: binary.BigEndian.Uint32(hdr[1:5]),
	}
	length := binary.BigEndian.Uint32(hdr[5:9])
	if err := checkHeader(f.Type, f.Stream, length); err != nil {
		return Frame{}, err
	}
	if length > 0 {
		f.Payload = make([]byte, length)
		if _, err := io.ReadFull(r, f.Payload); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return Frame{}, err
		}
	}
	return f, nil
}

// AppendFrame appends the encoding of f to buf. It refuses frames the
// decoder would refuse, so a bug here never reaches the peer.
func AppendFrame(buf []byte, f Frame) ([]byte, error) {
	if len(f.Payload) > MaxPayload {
		return buf, fmt.Errorf("encode %v frame: payload of %d bytes exceeds %d", f.Type, len(f.Payload), MaxPayload)
	}
	if err := checkHeader(f.Type, f.Stream, uint32(len(f.Payload))); err != nil {
		return buf, fmt.Errorf("encode frame: %w", err)
	}
	buf = append(buf, byte(f.Type))
	buf = binary.BigEndian.AppendUint32(buf, f.Stream)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(f.Payload)))
	return append(buf, f.Payload...), nil
}

// frameWriter serialises frames from many goroutines onto one connection.
// Each frame goes out in a single Write so frames never interleave.
type frameWriter struct {
	mu  sync.Mutex
	w   io.Writer
	buf []byte
}

func newFrameWriter(w io.Writer) *frameWriter {
	return &frameWriter{w: w, buf: make([]byte, 0, HeaderSize+MaxPayload)}
}

func (fw *frameWriter) writeFrame(f Frame) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	buf, err := AppendFrame(fw.buf[:0], f)
	if err != nil {
		return err
	}
	if _, err := fw.w.Write(buf); err != nil {
		return fmt.Errorf("write %v frame: %w", f.Type, err)
	}
	return nil
}

// uint32Frame builds a Window or Signal frame.
func uint32Frame(t FrameType, stream, v uint32) Frame {
	return Frame{Type: t, Stream: stream, Payload: binary.BigEndian.AppendUint32(nil, v)}
}

// payloadUint32 reads the value of a Window or Signal frame; the decoder has
// already checked the length.
func payloadUint32(f Frame) uint32 {
	return binary.BigEndian.Uint32(f.Payload)
}
