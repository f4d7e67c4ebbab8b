//go:build !linux

package vsockproto

import (
	"context"
	"errors"
	"fmt"
	"net"
)

var errNoVsock = errors.New("AF_VSOCK is only supported on Linux")

// ListenVsock fails: AF_VSOCK exists only on Linux.
func ListenVsock(port uint32) (net.Listener, error) {
	return nil, fmt.Errorf("vsock: listen on port %d: %w", port, errNoVsock)
}

// DialVsock fails: AF_VSOCK exists only on Linux.
func DialVsock(ctx context.Context, cid, port uint32) (net.Conn, error) {
	return nil, fmt.Errorf("vsock: dial cid %d port %d: %w", cid, port, errNoVsock)
}
