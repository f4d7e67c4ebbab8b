package vsockproto

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/mdlayher/vsock"
)

// vmaddrCIDLocal is the loopback context id (VMADDR_CID_LOCAL), served by
// the vsock_loopback module.
const vmaddrCIDLocal = 1

// TestVsockLoopbackExec runs the protocol over a real AF_VSOCK connection
// to this machine.
func TestVsockLoopbackExec(t *testing.T) {
	ln, err := ListenVsock(0)
	if err != nil {
		t.Skipf("no AF_VSOCK here (%v): load it with `modprobe vsock_loopback`", err)
	}
	defer ln.Close()
	port := ln.Addr().(*vsock.Addr).Port

	served := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		served <- Serve(context.Background(), conn, testHello, newFakeGuest())
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := DialVsock(ctx, vmaddrCIDLocal, port)
	if err != nil {
		ln.Close()
		<-served
		t.Skipf("AF_VSOCK loopback unavailable (%v): load it with `modprobe vsock_loopback`", err)
	}
	c := NewClient(conn)
	defer func() {
		c.Close()
		<-served
	}()
	if _, err := c.Hello(ctx); err != nil {
		t.Fatalf("Hello: %v", err)
	}
	input := pattern(InitialWindow + 1000)
	var out bytes.Buffer
	if _, err := c.Exec(ctx, ExecRequest{Argv: []string{"cat"}}, bytes.NewReader(input), &out, nil); err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if !bytes.Equal(out.Bytes(), input) {
		t.Errorf("cat over vsock returned %d bytes that differ from the %d sent", out.Len(), len(input))
	}
}
