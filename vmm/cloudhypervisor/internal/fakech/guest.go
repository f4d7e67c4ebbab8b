package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
)

// guestPort is the port the guest init listens on (vsockproto.Port).
const guestPort = "1024"

// guest plays the booted guest behind the hybrid vsock socket: it answers
// CONNECT for guestPort and echoes what the host sends.
type guest struct {
	ln *net.UnixListener
	wg sync.WaitGroup

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	refuse  int
	stopped bool
}

func startGuest(sock string, refuse int) (*guest, error) {
	os.Remove(sock)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on vsock socket: %w", err)
	}
	g := &guest{ln: ln, conns: map[net.Conn]struct{}{}, refuse: refuse}
	g.wg.Add(1)
	go g.accept()
	return g, nil
}

func (g *guest) accept() {
	defer g.wg.Done()
	for {
		conn, err := g.ln.Accept()
		if err != nil {
			return
		}
		g.mu.Lock()
		if g.stopped {
			g.mu.Unlock()
			conn.Close()
			return
		}
		g.conns[conn] = struct{}{}
		refused := g.refuse > 0
		if refused {
			g.refuse--
		}
		g.mu.Unlock()
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			defer g.forget(conn)
			if !refused {
				serveGuestConn(conn)
			}
		}()
	}
}

// serveGuestConn does the muxer's side of the handshake, then echoes.
func serveGuestConn(conn net.Conn) {
	br := bufio.NewReader(io.LimitReader(conn, 64))
	line, err := br.ReadString('\n')
	if err != nil {
		return
	}
	port, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "CONNECT ")
	if !ok || port != guestPort {
		return // the real muxer drops connections to ports nobody listens on
	}
	if _, err := io.WriteString(conn, "OK 1073741824\n"); err != nil {
		return
	}
	// The handshake line was read through a 64-byte limit; what the host
	// sent after it is buffered in br.
	rest := make([]byte, br.Buffered())
	br.Read(rest)
	if _, err := conn.Write(rest); err != nil {
		return
	}
	io.Copy(conn, conn)
}

func (g *guest) forget(conn net.Conn) {
	conn.Close()
	g.mu.Lock()
	delete(g.conns, conn)
	g.mu.Unlock()
}

// stop closes the listener and every connection, and waits for their
// goroutines.
func (g *guest) stop() {
	g.mu.Lock()
	g.stopped = true
	g.ln.Close()
	for c := range g.conns {
		c.Close()
	}
	g.mu.Unlock()
	g.wg.Wait()
}
