package vsockproto

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var transports = []struct {
	name string
	pipe pipeConns
}{
	{"net.Pipe", netPipe},
	{"unix", unixPair},
}

func TestHelloCarriesGuestFacts(t *testing.T) {
	hostConn, guestEnd := unixPair(t)
	served := make(chan error, 1)
	go func() { served <- Serve(context.Background(), guestEnd, testHello, newFakeGuest()) }()
	c := NewClient(hostConn)
	defer func() { c.Close(); <-served }()
	got, err := c.Hello(context.Background())
	if err != nil {
		t.Fatalf("Hello: %v", err)
	}
	want := testHello
	want.ProtocolVersion = ProtocolVersion
	if got != want {
		t.Errorf("Hello = %+v, want %+v", got, want)
	}
}

func TestExecOutputAndExitCode(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			c, _ := startPair(t, tr.pipe, newFakeGuest())
			var stdout, stderr bytes.Buffer
			status, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"both"}}, nil, &stdout, &stderr)
			if err != nil {
				t.Fatalf("Exec: %v", err)
			}
			if status.Code != 3 || stdout.String() != "out" || stderr.String() != "err" {
				t.Errorf("got code %d stdout %q stderr %q, want 3 %q %q", status.Code, stdout.String(), stderr.String(), "out", "err")
			}
		})
	}
}

func TestExecStdinRoundTrip(t *testing.T) {
	// Several windows in each direction, so both sides must return credit.
	input := pattern(3*InitialWindow + 12345)
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			c, _ := startPair(t, tr.pipe, newFakeGuest())
			var stdout bytes.Buffer
			status, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"cat"}}, bytes.NewReader(input), &stdout, nil)
			if err != nil || status.Code != 0 {
				t.Fatalf("Exec = %+v, %v", status, err)
			}
			if !bytes.Equal(stdout.Bytes(), input) {
				t.Errorf("cat returned %d bytes that differ from the %d sent", stdout.Len(), len(input))
			}
		})
	}
}

func TestConcurrentExecsAreMultiplexed(t *testing.T) {
	c, _ := startPair(t, unixPair, newFakeGuest())
	const n = 16
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			input := bytes.Repeat([]byte(fmt.Sprintf("exec %d;", i)), 40000)
			var out bytes.Buffer
			if _, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"cat"}}, bytes.NewReader(input), &out, nil); err != nil {
				errs <- fmt.Errorf("exec %d: %w", i, err)
				return
			}
			if !bytes.Equal(out.Bytes(), input) {
				errs <- fmt.Errorf("exec %d: got %d bytes of someone else's output", i, out.Len())
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// slowWriter is a consumer far slower than the guest: it yields the CPU
// before each write so the guest runs ahead as far as credit allows.
type slowWriter struct{ w io.Writer }

func (s slowWriter) Write(p []byte) (int, error) {
	for range 20 {
		runtime.Gosched()
	}
	return s.w.Write(p)
}

func TestFloodThroughSlowConsumerStaysWithinWindow(t *testing.T) {
	const size = 50 << 20
	c, _ := startPair(t, unixPair, newFakeGuest())
	out := NewCappedBuffer(64 << 10)
	p, err := c.Start(context.Background(), ExecRequest{Argv: []string{"flood", fmt.Sprint(size)}}, slowWriter{out}, nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	p.Stdin().Close()
	status, err := p.Wait()
	if err != nil || status.Code != 0 {
		t.Fatalf("Wait = %+v, %v", status, err)
	}
	recv := p.st.out
	recv.mu.Lock()
	got := recv.highWater
	recv.mu.Unlock()
	if got > InitialWindow || got == 0 {
		t.Errorf("host buffered up to %d bytes, want 1..%d", got, InitialWindow)
	}
	if out.Total() != size || !out.Truncated() {
		t.Errorf("consumer saw %d bytes (truncated %v), want %d truncated", out.Total(), out.Truncated(), size)
	}
	all := pattern(size)
	want := fmt.Sprintf("%s\n[... %d bytes omitted ...]\n%s", all[:32<<10], size-64<<10, all[size-32<<10:])
	if !bytes.Equal(out.Bytes(), []byte(want)) {
		t.Error("kept output is not the stream's head and tail: chunks lost or reordered")
	}
}

func TestExecStartFailureIsGuestError(t *testing.T) {
	c, _ := startPair(t, netPipe, newFakeGuest())
	_, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"fail-start"}}, nil, nil, nil)
	var ge *GuestError
	if !errors.As(err, &ge) || ge.Op != "exec" || !strings.Contains(ge.Message, "no such file") {
		t.Errorf("err = %v, want a *GuestError for exec saying no such file", err)
	}
}

func TestExecRejectsInvalidRequestLocally(t *testing.T) {
	c, _ := startPair(t, netPipe, newFakeGuest())
	_, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"echo"}, Shell: "echo"}, nil, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "both argv and shell") {
		t.Errorf("err = %v, want the validation error", err)
	}
}

func TestSignalReachesProcess(t *testing.T) {
	g := newFakeGuest()
	c, _ := startPair(t, netPipe, g)
	p, err := c.Start(context.Background(), ExecRequest{Argv: []string{"wait-signal"}}, nil, nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	<-g.started
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	status, err := p.Wait()
	if err != nil || status.Signal != int(syscall.SIGTERM) {
		t.Errorf("Wait = %+v, %v; want killed by SIGTERM", status, err)
	}
	if err := p.Signal(syscall.SIGTERM); err == nil {
		t.Error("Signal after exit succeeded")
	}
	if _, err := p.Stdin().Write([]byte("late")); err == nil {
		t.Error("stdin write after exit succeeded")
	}
}

func TestSignalOutOfRangeRefused(t *testing.T) {
	c, _ := startPair(t, netPipe, newFakeGuest())
	p, err := c.Start(context.Background(), ExecRequest{Argv: []string{"echo"}}, nil, nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer p.Wait()
	defer p.Stdin().Close()
	for _, sig := range []syscall.Signal{0, -1, 65} {
		if err := p.Signal(sig); err == nil {
			t.Errorf("Signal(%d) succeeded", sig)
		}
	}
}

func TestExecCancelKillsProcess(t *testing.T) {
	g := newFakeGuest()
	c, _ := startPair(t, netPipe, g)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-g.started
		cancel()
	}()
	var stdout bytes.Buffer
	_, err := c.Exec(ctx, ExecRequest{Argv: []string{"wait-signal"}}, nil, &stdout, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Exec err = %v, want context.Canceled", err)
	}
	if sig := <-g.signals; sig != int(syscall.SIGKILL) {
		t.Errorf("process got signal %d, want SIGKILL", sig)
	}
	// The connection stays usable after an abandoned exec.
	var out bytes.Buffer
	if _, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"echo", "still", "here"}}, nil, &out, nil); err != nil || out.String() != "still here\n" {
		t.Errorf("exec after cancel = %q, %v", out.String(), err)
	}
}

func TestDeadConnectionFailsPendingCalls(t *testing.T) {
	g := newFakeGuest()
	c, guest := startPair(t, unixPair, g)
	p, err := c.Start(context.Background(), ExecRequest{Argv: []string{"wait-signal"}}, nil, nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	execErr := make(chan error, 1)
	go func() {
		_, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"wait-signal"}}, nil, nil, nil)
		execErr <- err
	}()
	<-g.started
	<-g.started
	guest.conn.Close() // the VM died

	if _, err := p.Wait(); err == nil || !strings.Contains(err.Error(), "connection lost") {
		t.Errorf("Wait err = %v, want connection lost", err)
	}
	if err := <-execErr; err == nil {
		t.Error("pending Exec succeeded on a dead connection")
	}
	if err := c.ConfigureNetwork(context.Background(), NetConfig{Interface: "eth0", Address: "10.0.0.2/30"}); err == nil {
		t.Error("call on a dead connection succeeded")
	}
	// Both handlers saw their context end, and Serve returned.
	<-g.ctxDone
	<-g.ctxDone
	guest.wait(t)
}

func TestCloseEndsGuestHandlers(t *testing.T) {
	g := newFakeGuest()
	c, guest := startPair(t, netPipe, g)
	if _, err := c.Start(context.Background(), ExecRequest{Argv: []string{"wait-signal"}}, nil, nil); err != nil {
		t.Fatalf("Start: %v", err)
	}
	<-g.started
	c.Close()
	if prog := <-g.ctxDone; prog != "wait-signal" {
		t.Errorf("cancelled %q, want wait-signal", prog)
	}
	if err := guest.wait(t); err != nil {
		t.Errorf("Serve after a clean host close = %v, want nil", err)
	}
	if _, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"echo"}}, nil, nil, nil); !errors.Is(err, ErrClientClosed) {
		t.Errorf("Exec after Close = %v, want ErrClientClosed", err)
	}
}

func TestServeContextCancelFailsHost(t *testing.T) {
	hostConn, guestEnd := unixPair(t)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, guestEnd, testHello, newFakeGuest()) }()
	c := NewClient(hostConn)
	defer c.Close()
	if _, err := c.Hello(context.Background()); err != nil {
		t.Fatalf("Hello: %v", err)
	}
	cancel()
	if err := <-served; !errors.Is(err, context.Canceled) {
		t.Errorf("Serve = %v, want context.Canceled", err)
	}
	if _, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"echo"}}, nil, nil, nil); err == nil {
		t.Error("Exec against a stopped guest succeeded")
	}
}

func TestFileRoundTrip(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			c, _ := startPair(t, tr.pipe, newFakeGuest())
			content := pattern(1<<20 + 17)
			req := FileRequest{Path: "/tmp/ephemeral-run-test/scratch/data.bin", Mode: 0o600}
			if err := c.WriteFile(context.Background(), req, bytes.NewReader(content)); err != nil {
				t.Fatalf("WriteFile: %v", err)
			}
			var got bytes.Buffer
			if err := c.ReadFile(context.Background(), req, &got); err != nil {
				t.Fatalf("ReadFile: %v", err)
			}
			if !bytes.Equal(got.Bytes(), content) {
				t.Errorf("read back %d bytes that differ from the %d written", got.Len(), len(content))
			}
		})
	}
}

func TestReadMissingFileIsGuestError(t *testing.T) {
	c, _ := startPair(t, netPipe, newFakeGuest())
	err := c.ReadFile(context.Background(), FileRequest{Path: "/nope"}, io.Discard)
	var ge *GuestError
	if !errors.As(err, &ge) || ge.Op != "read_file" {
		t.Errorf("err = %v, want a read_file *GuestError", err)
	}
}

// failingReader returns some bytes and then an error, like a broken upload.
type failingReader struct{ sent bool }

func (f *failingReader) Read(p []byte) (int, error) {
	if f.sent {
		return 0, errors.New("source broke")
	}
	f.sent = true
	return copy(p, "partial"), nil
}

func TestWriteFileSourceErrorLeavesNoFile(t *testing.T) {
	g := newFakeGuest()
	c, _ := startPair(t, netPipe, g)
	err := c.WriteFile(context.Background(), FileRequest{Path: "/f"}, &failingReader{})
	if err == nil || !strings.Contains(err.Error(), "source broke") {
		t.Fatalf("WriteFile = %v, want the source's error", err)
	}
	// A later call on the same connection is ordered after the guest saw
	// the cancellation, so the fake has decided by then.
	if err := c.ReadFile(context.Background(), FileRequest{Path: "/f"}, io.Discard); err == nil {
		t.Error("the guest kept a partial file after the host gave up")
	}
}

func TestConfigureNetworkAndShutdown(t *testing.T) {
	g := newFakeGuest()
	c, _ := startPair(t, netPipe, g)
	cfg := NetConfig{Interface: "eth0", Address: "10.200.0.2/30", Gateway: "10.200.0.1", MTU: 1500}
	if err := c.ConfigureNetwork(context.Background(), cfg); err != nil {
		t.Fatalf("ConfigureNetwork: %v", err)
	}
	if got := <-g.netCfg; got != cfg {
		t.Errorf("guest got %+v, want %+v", got, cfg)
	}
	if err := c.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	<-g.down
}

func validProvision() Provision {
	return Provision{
		Entropy:     bytes.Repeat([]byte{7}, MinProvisionEntropy),
		Time:        time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC),
		Hostname:    "ephemeral-0a1b2c3d",
		MachineID:   "0123456789abcdef0123456789abcdef",
		ScratchName: "AbC123",
	}
}

func TestProvisionRoundTrip(t *testing.T) {
	g := newFakeGuest()
	c, _ := startPair(t, unixPair, g)
	want := validProvision()
	done, err := c.Provision(context.Background(), want)
	if err != nil {
		t.Fatalf("Provision: %v", err)
	}
	if done.ScratchDir != "/tmp/ephemeral-run-AbC123/scratch" {
		t.Errorf("ScratchDir = %q", done.ScratchDir)
	}
	got := <-g.prov
	if !bytes.Equal(got.Entropy, want.Entropy) || !got.Time.Equal(want.Time) || got.Hostname != want.Hostname ||
		got.MachineID != want.MachineID || got.ScratchName != want.ScratchName {
		t.Errorf("guest got %+v, want %+v", got, want)
	}

	failing := validProvision()
	failing.ScratchName = "broken"
	_, err = c.Provision(context.Background(), failing)
	var guestErr *GuestError
	if !errors.As(err, &guestErr) || !strings.Contains(err.Error(), "reseed") {
		t.Errorf("Provision of a failing guest = %v, want its GuestError", err)
	}
}

func TestProvisionValidation(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(*Provision)
		wantErr string
	}{
		{"valid", func(*Provision) {}, ""},
		{"short entropy", func(p *Provision) { p.Entropy = p.Entropy[:MinProvisionEntropy-1] }, "entropy"},
		{"no time", func(p *Provision) { p.Time = time.Time{} }, "no time"},
		{"hostname with dot", func(p *Provision) { p.Hostname = "a.b" }, "hostname"},
		{"hostname with leading hyphen", func(p *Provision) { p.Hostname = "-a" }, "hostname"},
		{"uppercase machine id", func(p *Provision) { p.MachineID = "0123456789ABCDEF0123456789abcdef" }, "machine id"},
		{"zero machine id", func(p *Provision) { p.MachineID = strings.Repeat("0", 32) }, "machine id"},
		{"scratch name with slash", func(p *Provision) { p.ScratchName = "../etc" }, "scratch name"},
		{"short scratch name", func(p *Provision) { p.ScratchName = "ab" }, "scratch name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := validProvision()
			tt.edit(&p)
			err := (&openRequest{Op: opProvision, Provision: &p}).validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("validate = %v, want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("validate = %v, want an error mentioning %q", err, tt.wantErr)
			}
		})
	}
}

func BenchmarkExecThroughput(b *testing.B) {
	const size = 64 << 20
	c, _ := startPair(b, unixPair, newFakeGuest())
	req := ExecRequest{Argv: []string{"flood", fmt.Sprint(size)}}
	b.SetBytes(size)
	for b.Loop() {
		if _, err := c.Exec(context.Background(), req, nil, io.Discard, nil); err != nil {
			b.Fatal(err)
		}
	}
}
