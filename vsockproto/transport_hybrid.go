package vsockproto

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// maxHybridReplyLine bounds the "OK <port>\n" reply of a hybrid vsock
// handshake. The real reply is at most 14 bytes; anything longer is not
// Cloud Hypervisor's muxer talking.
const maxHybridReplyLine = 32

// DialHybrid connects to a guest port through Cloud Hypervisor's hybrid
// vsock: the VMM exposes the guest's vsock device as the Unix socket
// socketPath, and a client selects the guest port by writing
// "CONNECT <port>\n" and reading back "OK <host port>\n". After that the
// socket is the guest connection.
//
// The reply is read one byte at a time, straight from the socket, so bytes
// the guest sends right after the handshake stay in the returned connection.
// ctx bounds the whole handshake.
func DialHybrid(ctx context.Context, socketPath string, port uint32) (net.Conn, error) {
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "unix", socketPath)
	if err != nil {
		return nil, fmt.Errorf("hybrid vsock: dial %s: %w", socketPath, err)
	}
	if err := hybridHandshake(ctx, conn, port); err != nil {
		conn.Close()
		return nil, fmt.Errorf("hybrid vsock: %s port %d: %w", socketPath, port, err)
	}
	return conn, nil
}

// hybridHandshake runs the CONNECT exchange on conn. It leaves conn without
// deadlines on success.
func hybridHandshake(ctx context.Context, conn net.Conn, port uint32) error {
	if deadline, ok := ctx.Deadline(); ok {
		if err := conn.SetDeadline(deadline); err != nil {
			return fmt.Errorf("set deadline: %w", err)
		}
	}
	// A cancellation without a deadline must interrupt a blocked read too;
	// a deadline in the past does that.
	release := onCancel(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	err := exchangeConnect(conn, port)
	release()
	if ctx.Err() != nil {
		// Whatever err says, the cause is ctx.
		return ctx.Err()
	}
	if err != nil {
		return err
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return fmt.Errorf("clear deadline: %w", err)
	}
	return nil
}

func exchangeConnect(conn net.Conn, port uint32) error {
	if _, err := fmt.Fprintf(conn, "CONNECT %d\n", port); err != nil {
		return fmt.Errorf("write CONNECT: %w", err)
	}
	line, err := readReplyLine(conn)
	if err != nil {
		return fmt.Errorf("read CONNECT reply: %w", err)
	}
	return parseConnectReply(line)
}

// readReplyLine reads up to and excluding '\n' without reading past it.
func readReplyLine(conn net.Conn) ([]byte, error) {
	line := make([]byte, 0, maxHybridReplyLine)
	var b [1]byte
	for {
		n, err := conn.Read(b[:])
		if n == 1 {
			if b[0] == '\n' {
				return line, nil
			}
			if len(line) == maxHybridReplyLine {
				return nil, fmt.Errorf("reply %q... longer than %d bytes", line, maxHybridReplyLine)
			}
			line = append(line, b[0])
			continue
		}
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("connection closed after %q (guest port not listening?)", line)
		}
		if err != nil {
			return nil, err
		}
	}
}

// parseConnectReply accepts exactly "OK <decimal port>".
func parseConnectReply(line []byte) error {
	const prefix = "OK "
	s := string(line)
	if len(s) <= len(prefix) || s[:len(prefix)] != prefix {
		return fmt.Errorf("unexpected CONNECT reply %q", s)
	}
	digits := s[len(prefix):]
	for _, c := range digits {
		if c < '0' || c > '9' {
			return fmt.Errorf("unexpected CONNECT reply %q", s)
		}
	}
	if _, err := strconv.ParseUint(digits, 10, 32); err != nil {
		return fmt.Errorf("unexpected CONNECT reply %q: %w", s, err)
	}
	return nil
}
