package vsockproto

import (
	"context"
	"fmt"
	"net"

	"github.com/mdlayher/vsock"
)

// ListenVsock listens on an AF_VSOCK port of the guest (any context id).
// It fails on systems without vsock support.
func ListenVsock(port uint32) (net.Listener, error) {
	ln, err := vsock.Listen(port, nil)
	if err != nil {
		return nil, fmt.Errorf("vsock: listen on port %d: %w", port, err)
	}
	return ln, nil
}

// DialVsock connects from the host to port of the guest with context id
// cid (vhost-vsock). ctx bounds the connect.
func DialVsock(ctx context.Context, cid, port uint32) (net.Conn, error) {
	conn, err := vsock.DialContext(ctx, cid, port, nil)
	if err != nil {
		return nil, fmt.Errorf("vsock: dial cid %d port %d: %w", cid, port, err)
	}
	return conn, nil
}
