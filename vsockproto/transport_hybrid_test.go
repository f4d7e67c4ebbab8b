package vsockproto

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// fakeHybridMuxer listens on a Unix socket like Cloud Hypervisor's vsock
// muxer: it reads the CONNECT line, reports it on connects, and lets reply
// write whatever the test wants back.
func fakeHybridMuxer(t *testing.T, reply func(net.Conn)) (path string, connects <-chan string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "vsock.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	lines := make(chan string, 1)
	done := make(chan struct{})
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	go func() {
		defer close(done)
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil {
			return
		}
		lines <- line
		reply(conn)
	}()
	return path, lines
}

func TestDialHybridKeepsDataAfterOK(t *testing.T) {
	const guestBytes = "first guest bytes"
	path, connects := fakeHybridMuxer(t, func(c net.Conn) {
		// One write, so a buffered reader in the client would swallow it.
		io.WriteString(c, "OK 1073741824\n"+guestBytes)
	})
	conn, err := DialHybrid(context.Background(), path, Port)
	if err != nil {
		t.Fatalf("DialHybrid: %v", err)
	}
	defer conn.Close()
	if got := <-connects; got != "CONNECT 1024\n" {
		t.Errorf("muxer got %q, want %q", got, "CONNECT 1024\n")
	}
	got, err := io.ReadAll(conn)
	if err != nil {
		t.Fatalf("read after handshake: %v", err)
	}
	if string(got) != guestBytes {
		t.Errorf("data after OK = %q, want %q", got, guestBytes)
	}
}

func TestDialHybridRejectsBadReplies(t *testing.T) {
	tests := []struct {
		name, reply, wantErr string
	}{
		{"garbage", "HTTP/1.1 400 Bad Request\r\n", "unexpected CONNECT reply"},
		{"no port", "OK \n", "unexpected CONNECT reply"},
		{"port not a number", "OK 12ab\n", "unexpected CONNECT reply"},
		{"port overflow", "OK 99999999999\n", "unexpected CONNECT reply"},
		{"long line", "OK " + strings.Repeat("1", 100) + "\n", "longer than"},
		{"closed without reply", "", "connection closed"},
		{"closed mid line", "OK 12", "connection closed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path, _ := fakeHybridMuxer(t, func(c net.Conn) { io.WriteString(c, tt.reply) })
			conn, err := DialHybrid(context.Background(), path, Port)
			if err == nil {
				conn.Close()
				t.Fatalf("DialHybrid accepted reply %q", tt.reply)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %q does not mention %q", err, tt.wantErr)
			}
		})
	}
}

func TestDialHybridHonoursCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	release := make(chan struct{})
	path, connects := fakeHybridMuxer(t, func(net.Conn) { <-release })
	defer close(release)
	go func() {
		<-connects // the client is now blocked reading the reply
		cancel()
	}()
	conn, err := DialHybrid(ctx, path, Port)
	if err == nil {
		conn.Close()
		t.Fatal("DialHybrid succeeded without a reply")
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error = %v, want context.Canceled", err)
	}
}

func TestDialHybridMissingSocket(t *testing.T) {
	_, err := DialHybrid(context.Background(), filepath.Join(t.TempDir(), "absent"), Port)
	if err == nil {
		t.Fatal("DialHybrid to a missing socket succeeded")
	}
}
