package vsockproto

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
)

func mustFrame(t testing.TB, f Frame) []byte {
	t.Helper()
	b, err := AppendFrame(nil, f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func helloFrame(t testing.TB, version int) []byte {
	payload, err := json.Marshal(Hello{ProtocolVersion: version})
	if err != nil {
		t.Fatal(err)
	}
	return mustFrame(t, Frame{Type: FrameHello, Payload: payload})
}

func stdoutFrames(t testing.TB, stream uint32, total int) []byte {
	var b []byte
	for total > 0 {
		n := min(total, MaxPayload)
		b = append(b, mustFrame(t, Frame{Type: FrameStdout, Stream: stream, Payload: make([]byte, n)})...)
		total -= n
	}
	return b
}

// blockedWriter never finishes a Write until released, so the host returns
// no credit.
type blockedWriter struct{ release chan struct{} }

func (w blockedWriter) Write(p []byte) (int, error) {
	<-w.release
	return len(p), nil
}

func TestClientRejectsMisbehavingGuest(t *testing.T) {
	tests := []struct {
		name string
		// send is what the guest writes after hello; the host has exec
		// stream 1 open, with a stdout writer that never returns.
		send func(t testing.TB) []byte
	}{
		{"stdout beyond credit", func(t testing.TB) []byte { return stdoutFrames(t, 1, InitialWindow+1) }},
		{"unknown stream", func(t testing.TB) []byte { return stdoutFrames(t, 2, 10) }},
		{"host-only frame", func(t testing.TB) []byte {
			return mustFrame(t, Frame{Type: FrameStdin, Stream: 1, Payload: []byte("x")})
		}},
		{"oversize frame", func(t testing.TB) []byte { return header(FrameStdout, 1, MaxPayload+1) }},
		{"unknown frame type", func(t testing.TB) []byte { return header(200, 1, 0) }},
		{"second hello", func(t testing.TB) []byte { return helloFrame(t, ProtocolVersion) }},
		{"window beyond initial", func(t testing.TB) []byte { return mustFrame(t, uint32Frame(FrameWindow, 1, 1)) }},
		{"close not JSON", func(t testing.TB) []byte {
			return mustFrame(t, Frame{Type: FrameClose, Stream: 1, Payload: []byte("{nope")})
		}},
		{"exec close without status", func(t testing.TB) []byte {
			return mustFrame(t, Frame{Type: FrameClose, Stream: 1, Payload: []byte("{}")})
		}},
		{"close with unknown field", func(t testing.TB) []byte {
			return mustFrame(t, Frame{Type: FrameClose, Stream: 1, Payload: []byte(`{"exit":{"code":0,"duration_ns":1},"extra":1}`)})
		}},
		{"provisioning result on an exec", func(t testing.TB) []byte {
			return mustFrame(t, Frame{Type: FrameClose, Stream: 1, Payload: []byte(`{"exit":{"code":0,"duration_ns":1},"provisioned":{"scratch_dir":"/x"}}`)})
		}},
		{"implausible signal", func(t testing.TB) []byte {
			return mustFrame(t, Frame{Type: FrameClose, Stream: 1, Payload: []byte(`{"exit":{"code":-1,"signal":1000,"duration_ns":1}}`)})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hostConn, guest := unixPair(t)
			c := NewClient(hostConn)
			t.Cleanup(func() { c.Close() })
			release := make(chan struct{})
			if _, err := guest.Write(helloFrame(t, ProtocolVersion)); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Hello(context.Background()); err != nil {
				t.Fatalf("Hello: %v", err)
			}
			p, err := c.Start(context.Background(), ExecRequest{Argv: []string{"x"}}, blockedWriter{release}, nil)
			if err != nil {
				t.Fatalf("Start: %v", err)
			}
			if _, err := guest.Write(tt.send(t)); err != nil {
				t.Fatal(err)
			}
			// Wait also waits for stdout to be written, so let the writer
			// go once the violation has ended the connection.
			<-c.dead
			close(release)
			if _, err := p.Wait(); !errors.Is(err, ErrProtocol) {
				t.Errorf("Wait err = %v, want a protocol violation", err)
			}
		})
	}
}

func TestClientRejectsBadHello(t *testing.T) {
	tests := []struct {
		name    string
		first   func(t testing.TB) []byte
		wantErr string
	}{
		{"other version", func(t testing.TB) []byte { return helloFrame(t, ProtocolVersion+1) }, fmt.Sprintf("protocol version %d", ProtocolVersion+1)},
		{"data before hello", func(t testing.TB) []byte { return stdoutFrames(t, 1, 1) }, "before hello"},
		{"hello not JSON", func(t testing.TB) []byte { return mustFrame(t, Frame{Type: FrameHello, Payload: []byte("hi")}) }, "hello payload"},
		{"closed before hello", func(testing.TB) []byte { return nil }, "EOF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hostConn, guest := unixPair(t)
			c := NewClient(hostConn)
			defer c.Close()
			guest.Write(tt.first(t))
			guest.Close()
			_, err := c.Hello(context.Background())
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Hello err = %v, want one mentioning %q", err, tt.wantErr)
			}
			if _, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"x"}}, nil, nil, nil); err == nil {
				t.Error("Exec on a refused connection succeeded")
			}
		})
	}
}

func openFrame(t testing.TB, stream uint32, req openRequest) []byte {
	payload, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return mustFrame(t, Frame{Type: FrameOpen, Stream: stream, Payload: payload})
}

var waitSignalOpen = openRequest{Op: opExec, Exec: &ExecRequest{Argv: []string{"wait-signal"}}}

// rawHost serves a fake guest and hands the test the host end after hello.
func rawHost(t *testing.T) (conn net.Conn, r *bufio.Reader, guest *guestConn) {
	hostConn, guestEnd := unixPair(t)
	guest = &guestConn{conn: guestEnd, served: make(chan error, 1)}
	go func() { guest.served <- Serve(context.Background(), guestEnd, testHello, newFakeGuest()) }()
	t.Cleanup(func() {
		hostConn.Close()
		guest.wait(t)
	})
	r = bufio.NewReader(hostConn)
	if f, err := ReadFrame(r); err != nil || f.Type != FrameHello {
		t.Fatalf("first frame = %v, %v; want hello", f.Type, err)
	}
	return hostConn, r, guest
}

func TestServeRejectsMisbehavingHost(t *testing.T) {
	stdin := func(t testing.TB, stream uint32, total int) []byte {
		var b []byte
		for total > 0 {
			n := min(total, MaxPayload)
			b = append(b, mustFrame(t, Frame{Type: FrameStdin, Stream: stream, Payload: make([]byte, n)})...)
			total -= n
		}
		return b
	}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	tests := []struct {
		name string
		send func(t testing.TB) []byte
	}{
		{"stdin beyond credit", func(t testing.TB) []byte {
			return cat(openFrame(t, 1, waitSignalOpen), stdin(t, 1, InitialWindow+1))
		}},
		{"stdin after close-stdin", func(t testing.TB) []byte {
			return cat(openFrame(t, 1, waitSignalOpen), mustFrame(t, Frame{Type: FrameCloseStdin, Stream: 1}), stdin(t, 1, 1))
		}},
		{"never opened stream", func(t testing.TB) []byte { return stdin(t, 5, 1) }},
		{"reused stream id", func(t testing.TB) []byte {
			return cat(openFrame(t, 2, waitSignalOpen), openFrame(t, 2, waitSignalOpen))
		}},
		{"guest-only frame", func(t testing.TB) []byte {
			return cat(openFrame(t, 1, waitSignalOpen), stdoutFrames(t, 1, 1))
		}},
		{"stdin to an operation without input", func(t testing.TB) []byte {
			return cat(openFrame(t, 1, openRequest{Op: opReadFile, File: &FileRequest{Path: "/block"}}), stdin(t, 1, 1))
		}},
		{"signal out of range", func(t testing.TB) []byte {
			return cat(openFrame(t, 1, waitSignalOpen), mustFrame(t, uint32Frame(FrameSignal, 1, 99)))
		}},
		{"zero window", func(t testing.TB) []byte {
			return cat(openFrame(t, 1, waitSignalOpen), mustFrame(t, uint32Frame(FrameWindow, 1, 0)))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, _, guest := rawHost(t)
			if _, err := conn.Write(tt.send(t)); err != nil {
				t.Fatal(err)
			}
			if err := guest.wait(t); !errors.Is(err, ErrProtocol) {
				t.Errorf("Serve = %v, want a protocol violation", err)
			}
		})
	}
}

func TestServeAnswersBadRequestOnItsStream(t *testing.T) {
	conn, r, _ := rawHost(t)
	bad := mustFrame(t, Frame{Type: FrameOpen, Stream: 1, Payload: []byte(`{"op":"format_disk"}`)})
	if _, err := conn.Write(bad); err != nil {
		t.Fatal(err)
	}
	f, err := ReadFrame(r)
	if err != nil || f.Type != FrameClose || f.Stream != 1 {
		t.Fatalf("reply = %v on %d, %v; want close on stream 1", f.Type, f.Stream, err)
	}
	if !strings.Contains(string(f.Payload), "unknown operation") {
		t.Errorf("close payload %s does not name the problem", f.Payload)
	}
	// The connection survives: a valid request on the next id is served.
	if _, err := conn.Write(openFrame(t, 2, openRequest{Op: opShutdown})); err != nil {
		t.Fatal(err)
	}
	if f, err := ReadFrame(r); err != nil || f.Type != FrameClose || f.Stream != 2 {
		t.Errorf("reply = %v on %d, %v; want close on stream 2", f.Type, f.Stream, err)
	}
}

// FuzzClientInput plays a hostile guest: after a valid hello it sends
// arbitrary bytes while the host has an exec and a file read open. The
// client must not panic, and pending calls must end rather than hang.
func FuzzClientInput(f *testing.F) {
	f.Add(stdoutFrames(f, 1, 100))
	f.Add(append(stdoutFrames(f, 1, 3), mustFrame(f, Frame{Type: FrameClose, Stream: 1, Payload: []byte(`{"exit":{"code":0,"duration_ns":1}}`)})...))
	f.Add(mustFrame(f, Frame{Type: FrameStderr, Stream: 2, Payload: []byte("x")}))
	f.Add(mustFrame(f, Frame{Type: FrameClose, Stream: 2, Payload: []byte(`{"error":"no such file"}`)}))
	f.Add(mustFrame(f, uint32Frame(FrameWindow, 1, 7)))
	for _, m := range malformedFrames {
		f.Add(m.wire)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		hostConn, guest := net.Pipe()
		c := NewClient(hostConn)
		defer c.Close()
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			io.Copy(io.Discard, guest)
		}()
		defer func() { <-drained }()
		defer guest.Close()

		p, err := c.Start(context.Background(), ExecRequest{Argv: []string{"x"}}, io.Discard, io.Discard)
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		readDone := make(chan error, 2)
		go func() { readDone <- c.ReadFile(context.Background(), FileRequest{Path: "/f"}, io.Discard) }()
		go func() {
			_, err := c.ListOutputs(context.Background(), OutputsRequest{Patterns: []string{"out/*"}, MaxEntries: 4})
			readDone <- err
		}()
		if _, err := guest.Write(helloFrame(t, ProtocolVersion)); err != nil {
			t.Fatal(err)
		}
		guest.Write(data)
		guest.Close()
		p.Wait()
		<-readDone
		<-readDone
	})
}

func TestOpenRequestValidation(t *testing.T) {
	exec := &ExecRequest{Argv: []string{"true"}}
	file := &FileRequest{Path: "/f"}
	tests := []struct {
		name    string
		req     openRequest
		wantErr string // empty: valid
	}{
		{"exec", openRequest{Op: opExec, Exec: exec}, ""},
		{"write file", openRequest{Op: opWriteFile, File: file}, ""},
		{"shutdown", openRequest{Op: opShutdown}, ""},
		{"exec without request", openRequest{Op: opExec}, `lacks its "exec"`},
		{"read file with exec", openRequest{Op: opReadFile, File: file, Exec: exec}, `carries a "exec"`},
		{"shutdown with net", openRequest{Op: opShutdown, Net: &NetConfig{}}, `carries a "net"`},
		{"provision without request", openRequest{Op: opProvision}, `lacks its "provision"`},
		{"net with multicast mac", openRequest{Op: opNetConfig, Net: &NetConfig{MAC: "03:00:00:00:00:01"}}, "unicast"},
		{"net with mac", openRequest{Op: opNetConfig, Net: &NetConfig{MAC: "02:00:00:00:00:01"}}, ""},
		{"unknown op", openRequest{Op: "reboot"}, "unknown operation"},
		{"list outputs", openRequest{Op: opListOutputs, Outputs: &OutputsRequest{Patterns: []string{"out/*"}, MaxEntries: 5}}, ""},
		{"list outputs without patterns", openRequest{Op: opListOutputs, Outputs: &OutputsRequest{MaxEntries: 5}}, "0 patterns"},
		{"list outputs escaping", openRequest{Op: opListOutputs, Outputs: &OutputsRequest{Patterns: []string{"out/../../etc/*"}, MaxEntries: 5}}, "clean"},
		{"list outputs absolute", openRequest{Op: opListOutputs, Outputs: &OutputsRequest{Patterns: []string{"/etc/*"}, MaxEntries: 5}}, "relative"},
		{"list outputs with file", openRequest{Op: opListOutputs, File: file, Outputs: &OutputsRequest{Patterns: []string{"a"}, MaxEntries: 1}}, `carries a "file"`},
		{"read output", openRequest{Op: opReadOutput, File: &FileRequest{Path: "out/a.csv"}}, ""},
		{"read output absolute", openRequest{Op: opReadOutput, File: file}, "relative"},
		{"empty path", openRequest{Op: opReadFile, File: &FileRequest{}}, "empty path"},
		{"negative max bytes", openRequest{Op: opReadFile, File: &FileRequest{Path: "/f", MaxBytes: -1}}, "negative"},
		{"invalid exec", openRequest{Op: opExec, Exec: &ExecRequest{}}, "neither argv nor shell"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.req.validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("validate = %v, want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("validate = %v, want an error mentioning %q", err, tt.wantErr)
			}
		})
	}
}
