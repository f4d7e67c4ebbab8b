package vsockproto

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
)

// fakeGuest is a Handler with a few programs, understood by Argv[0]:
//
//	echo ARGS...     prints ARGS joined by spaces
//	cat              copies stdin to stdout
//	flood N          writes N bytes of a counting pattern to stdout
//	both             writes "out" to stdout and "err" to stderr, exits 3
//	wait-signal      reports its start, exits with the first signal received
//	fail-start       cannot be started
//
// Files live in a map; reading /block waits until the stream is cancelled.
type fakeGuest struct {
	started chan string    // Argv[0] of every exec that began
	signals chan int       // signals that wait-signal received
	ctxDone chan string    // Argv[0] of execs whose ctx was cancelled
	netCfg  chan NetConfig // ConfigureNetwork calls
	prov    chan Provision // Provision calls
	down    chan struct{}  // closed by Shutdown

	mu    sync.Mutex
	files map[string][]byte
	// listing answers ListOutputs.
	listing OutputListing
}

func newFakeGuest() *fakeGuest {
	return &fakeGuest{
		started: make(chan string, 64),
		signals: make(chan int, 4),
		ctxDone: make(chan string, 4),
		netCfg:  make(chan NetConfig, 1),
		prov:    make(chan Provision, 1),
		down:    make(chan struct{}),
		files:   make(map[string][]byte),
	}
}

func (g *fakeGuest) Exec(ctx context.Context, req ExecRequest, stdio ExecIO) (ExitStatus, error) {
	prog := req.Argv[0]
	g.started <- prog
	switch prog {
	case "echo":
		_, err := fmt.Fprintln(stdio.Stdout, joinArgs(req.Argv[1:]))
		return ExitStatus{}, err
	case "cat":
		if _, err := io.Copy(stdio.Stdout, stdio.Stdin); err != nil {
			return ExitStatus{Code: 1}, nil
		}
		return ExitStatus{}, nil
	case "flood":
		n, err := strconv.Atoi(req.Argv[1])
		if err != nil {
			return ExitStatus{}, err
		}
		if _, err := io.Copy(stdio.Stdout, io.LimitReader(new(patternReader), int64(n))); err != nil {
			return ExitStatus{Code: 1}, nil
		}
		return ExitStatus{}, nil
	case "both":
		io.WriteString(stdio.Stdout, "out")
		io.WriteString(stdio.Stderr, "err")
		return ExitStatus{Code: 3}, nil
	case "wait-signal":
		select {
		case sig := <-stdio.Signals:
			g.signals <- sig
			return ExitStatus{Code: -1, Signal: sig}, nil
		case <-ctx.Done():
			g.ctxDone <- prog
			return ExitStatus{}, ctx.Err()
		}
	case "fail-start":
		return ExitStatus{}, errors.New("exec: no such file or directory")
	}
	return ExitStatus{}, fmt.Errorf("unknown program %q", prog)
}

func joinArgs(args []string) string {
	var b bytes.Buffer
	for i, a := range args {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(a)
	}
	return b.String()
}

func (g *fakeGuest) WriteFile(ctx context.Context, req FileRequest, r io.Reader) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.files[req.Path] = data
	return nil
}

func (g *fakeGuest) ReadFile(ctx context.Context, req FileRequest, w io.Writer) error {
	if req.Path == "/block" { // a read that waits for the host to give up
		<-ctx.Done()
		return ctx.Err()
	}
	g.mu.Lock()
	data, ok := g.files[req.Path]
	g.mu.Unlock()
	if !ok {
		return fmt.Errorf("open %s: no such file or directory", req.Path)
	}
	_, err := w.Write(data)
	return err
}

func (g *fakeGuest) ListOutputs(ctx context.Context, req OutputsRequest) (OutputListing, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.listing, nil
}

// ReadOutput serves files like ReadFile, ignoring MaxBytes: a guest that
// sends more than asked, which the host must stop.
func (g *fakeGuest) ReadOutput(ctx context.Context, req FileRequest, w io.Writer) error {
	return g.ReadFile(ctx, req, w)
}

func (g *fakeGuest) ConfigureNetwork(ctx context.Context, cfg NetConfig) error {
	g.netCfg <- cfg
	return nil
}

// Provision answers with the scratch directory the real guest would make,
// or fails for the scratch name "broken".
func (g *fakeGuest) Provision(ctx context.Context, p Provision) (Provisioned, error) {
	g.prov <- p
	if p.ScratchName == "broken" {
		return Provisioned{}, errors.New("reseed: operation not permitted")
	}
	return Provisioned{ScratchDir: "/tmp/ephemeral-run-" + p.ScratchName + "/scratch"}, nil
}

func (g *fakeGuest) Shutdown(ctx context.Context) { close(g.down) }

// patternReader yields an endless byte pattern that makes misordered or
// duplicated chunks visible.
type patternReader struct{ off int }

func (p *patternReader) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = byte((p.off + i) % 251)
	}
	p.off += len(b)
	return len(b), nil
}

func pattern(n int) []byte {
	b := make([]byte, n)
	new(patternReader).Read(b)
	return b
}

var testHello = Hello{Transport: "test", KernelRelease: "6.1.0-test"}

// pipeConns returns both ends of a connection. Socketpairs buffer like the
// real transports; net.Pipe does not, which flushes out ordering bugs.
type pipeConns func(t testing.TB) (host, guest net.Conn)

func netPipe(testing.TB) (net.Conn, net.Conn) { return net.Pipe() }

func unixPair(t testing.TB) (net.Conn, net.Conn) {
	t.Helper()
	dir := t.TempDir()
	ln, err := net.Listen("unix", dir+"/s")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	host, err := net.Dial("unix", dir+"/s")
	if err != nil {
		t.Fatal(err)
	}
	guest := <-accepted
	if guest == nil {
		t.Fatal("accept failed")
	}
	return host, guest
}

// startPair serves h on one end and returns a Client on the other that has
// received hello. Cleanup closes both and checks Serve's outcome.
func startPair(t testing.TB, pipe pipeConns, h Handler) (*Client, *guestConn) {
	t.Helper()
	hostConn, guestEnd := pipe(t)
	g := &guestConn{conn: guestEnd, served: make(chan error, 1)}
	go func() { g.served <- Serve(context.Background(), guestEnd, testHello, h) }()
	c := NewClient(hostConn)
	t.Cleanup(func() {
		c.Close()
		if err := g.wait(t); err != nil {
			t.Logf("Serve returned %v", err)
		}
	})
	if _, err := c.Hello(context.Background()); err != nil {
		t.Fatalf("Hello: %v", err)
	}
	return c, g
}

// guestConn is the guest end of a test connection.
type guestConn struct {
	conn   net.Conn
	served chan error
	once   sync.Once
	err    error
}

// wait returns what Serve returned.
func (g *guestConn) wait(t testing.TB) error {
	g.once.Do(func() { g.err = <-g.served })
	return g.err
}
