package vsockproto

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
)

// validFrames has one frame of every type, as each side sends them.
var validFrames = []Frame{
	{Type: FrameHello, Stream: 0, Payload: []byte(`{"protocol_version":1}`)},
	{Type: FrameOpen, Stream: 1, Payload: []byte(`{"op":"exec","exec":{"argv":["true"]}}`)},
	{Type: FrameStdin, Stream: 1, Payload: []byte("input")},
	{Type: FrameStdout, Stream: 1, Payload: bytes.Repeat([]byte("o"), MaxPayload)},
	{Type: FrameStderr, Stream: 7, Payload: []byte("err")},
	{Type: FrameCloseStdin, Stream: 1},
	uint32Frame(FrameSignal, 1, 9),
	uint32Frame(FrameWindow, 0xffffffff, 1<<16),
	{Type: FrameClose, Stream: 1, Payload: []byte(`{"exit":{"code":0,"duration_ns":5}}`)},
	{Type: FrameCancel, Stream: 3},
}

func TestFrameRoundTrip(t *testing.T) {
	for _, want := range validFrames {
		t.Run(want.Type.String(), func(t *testing.T) {
			wire, err := AppendFrame(nil, want)
			if err != nil {
				t.Fatalf("AppendFrame: %v", err)
			}
			if len(wire) != HeaderSize+len(want.Payload) {
				t.Errorf("encoded %d bytes, want %d", len(wire), HeaderSize+len(want.Payload))
			}
			got, err := ReadFrame(bufio.NewReader(bytes.NewReader(wire)))
			if err != nil {
				t.Fatalf("ReadFrame: %v", err)
			}
			if got.Type != want.Type || got.Stream != want.Stream || !bytes.Equal(got.Payload, want.Payload) {
				t.Errorf("round trip = %v/%d/%d bytes, want %v/%d/%d bytes",
					got.Type, got.Stream, len(got.Payload), want.Type, want.Stream, len(want.Payload))
			}
		})
	}
}

func TestReadFrameCleanEOF(t *testing.T) {
	_, err := ReadFrame(bufio.NewReader(bytes.NewReader(nil)))
	if err != io.EOF {
		t.Errorf("empty input: err = %v, want io.EOF", err)
	}
}

func header(t FrameType, stream, length uint32) []byte {
	h := []byte{byte(t)}
	h = binary.BigEndian.AppendUint32(h, stream)
	return binary.BigEndian.AppendUint32(h, length)
}

// malformedFrames are inputs the decoder must refuse.
var malformedFrames = []struct {
	name      string
	wire      []byte
	protocol  bool // the error must wrap ErrProtocol
	wantInErr string
}{
	{"oversize length", header(FrameStdout, 1, MaxPayload+1), true, "exceeds"},
	{"huge length", header(FrameStdout, 1, 0xffffffff), true, "exceeds"},
	{"unknown type", header(0x7f, 1, 0), true, "unknown frame type"},
	{"type zero", header(0, 1, 0), true, "unknown frame type"},
	{"hello on stream 1", header(FrameHello, 1, 2), true, "stream 0"},
	{"data on stream 0", header(FrameStdout, 0, 1), true, "stream 0"},
	{"short window", header(FrameWindow, 1, 2), true, "want 4"},
	{"signal with extra bytes", header(FrameSignal, 1, 5), true, "want 4"},
	{"cancel with payload", header(FrameCancel, 1, 1), true, "want 0"},
	{"truncated header", header(FrameStdout, 1, 3)[:5], false, "unexpected EOF"},
	{"truncated payload", append(header(FrameStdout, 1, 3), 'a'), false, "unexpected EOF"},
}

func TestReadFrameRejectsMalformed(t *testing.T) {
	for _, tt := range malformedFrames {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadFrame(bufio.NewReader(bytes.NewReader(tt.wire)))
			if err == nil {
				t.Fatal("ReadFrame accepted the frame")
			}
			if errors.Is(err, ErrProtocol) != tt.protocol {
				t.Errorf("errors.Is(%v, ErrProtocol) = %v, want %v", err, !tt.protocol, tt.protocol)
			}
			if !strings.Contains(err.Error(), tt.wantInErr) {
				t.Errorf("error %q does not mention %q", err, tt.wantInErr)
			}
		})
	}
}

func TestAppendFrameRefusesWhatDecoderRefuses(t *testing.T) {
	bad := []Frame{
		{Type: FrameStdout, Stream: 1, Payload: make([]byte, MaxPayload+1)},
		{Type: 0x7f, Stream: 1},
		{Type: FrameWindow, Stream: 1, Payload: []byte{1}},
		{Type: FrameStdin, Stream: 0},
	}
	for _, f := range bad {
		if _, err := AppendFrame(nil, f); err == nil {
			t.Errorf("AppendFrame(%v on stream %d, %d bytes) succeeded", f.Type, f.Stream, len(f.Payload))
		}
	}
}

// FuzzDecode feeds arbitrary bytes to the decoder: it must not panic, never
// return a payload over MaxPayload, and every frame it accepts must encode
// back to exactly the bytes it consumed.
func FuzzDecode(f *testing.F) {
	for _, fr := range validFrames {
		// Large seeds make the fuzzer spend its time minimising them.
		fr.Payload = fr.Payload[:min(len(fr.Payload), 512)]
		wire, err := AppendFrame(nil, fr)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(wire)
	}
	for _, m := range malformedFrames {
		f.Add(m.wire)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bufio.NewReader(bytes.NewReader(data))
		consumed := 0
		for {
			fr, err := ReadFrame(r)
			if err != nil {
				return
			}
			if len(fr.Payload) > MaxPayload {
				t.Fatalf("payload of %d bytes accepted", len(fr.Payload))
			}
			wire, err := AppendFrame(nil, fr)
			if err != nil {
				t.Fatalf("decoded frame does not encode: %v", err)
			}
			if !bytes.Equal(wire, data[consumed:consumed+len(wire)]) {
				t.Fatalf("re-encoding differs from the input at offset %d", consumed)
			}
			consumed += len(wire)
		}
	})
}
